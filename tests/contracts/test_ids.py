"""Goal, recipe and run ids cannot reach outside their trees; refused before any file is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradlab.contracts import experiments
from gradlab.contracts.experiments import Experiments
from gradlab.errors import ConfigError

LEAK = "hunter2-outside-value"


@pytest.fixture
def leak(tmp_path: Path) -> Path:
    path = tmp_path / "x" / "leak.yaml"
    path.parent.mkdir()
    path.write_text(f"recipe_id: leak\ntrain: {{timesteps: 1, backend: {{id: {LEAK}}}}}\n")
    return path


@pytest.mark.parametrize("ref", [
    "gradlab__bandit/{up}/x/leak", "gradlab__bandit/..", "{up}/x/leak/ppo", "gradlab__bandit/ppo/../ppo",
    "gradlab__bandit/.hidden", "gradlab__bandit/pp\x00o", "gradlab__bandit/ppo/",
])
def test_an_escaping_id_is_refused_before_any_read(ref: str, leak: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = Experiments()
    up = "/".join([".."] * (len(tree.goals_dir.parts) + 2)) + str(leak.parent.parent)
    opened: list[Path] = []
    real = experiments.compose_file
    monkeypatch.setattr(experiments, "compose_file", lambda path, **kw: opened.append(path) or real(path, **kw))
    with pytest.raises(ConfigError, match=r"(recipe id: expected one name of letters, digits and _ \. \+ - "
                                          r"\(no '/', no '\.\.'\)|goal id: expected a path of 1 to 4 names|expected GOAL/RECIPE)"
                       ) as caught:
        tree.resolve(ref.format(up=up))
    assert opened == []  # nothing was composed (read) at all
    assert LEAK not in str(caught.value)


def test_the_flow_parameter_route_refuses_it_too(leak: Path) -> None:
    from gradlab.runs.operations import prepare_spec
    from gradlab.settings import load_settings

    up = "/".join([".."] * 12)
    with pytest.raises(ConfigError, match="(goal|recipe) id") as caught:
        prepare_spec(load_settings(), recipe=f"gradlab__bandit/{up}{leak.with_suffix('')}")
    assert LEAK not in str(caught.value)


@pytest.mark.parametrize("run_id", ["../escape", "a/b", "..", "", "run\n"])
def test_a_run_id_cannot_leave_the_runs_folder(run_id: str) -> None:
    from gradlab.settings import load_settings

    with pytest.raises(ConfigError, match="run id: expected one name"):
        load_settings().run_dir(run_id)


def test_every_checked_in_goal_and_recipe_id_is_accepted() -> None:
    tree = Experiments()
    for goal_id in tree.goal_ids():
        assert experiments.check_id("goal", goal_id) == goal_id
        for recipe_id in tree.recipe_ids(goal_id):
            assert experiments.check_id("recipe", recipe_id) == recipe_id
