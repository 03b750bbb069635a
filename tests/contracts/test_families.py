"""Goal families: nested goal ids, ``_goal-common.yaml``, ``template_vars`` and the catalog's families."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradlab.contracts import experiments
from gradlab.contracts.experiments import Experiments, check_id, split_ref
from gradlab.errors import ConfigError


def test_a_nested_goal_composes_its_family_common_fragment_and_template_vars() -> None:
    tree = Experiments()
    assert {"Bandit/Arms4", "Bandit/Arms4/Shaped", "Bandit/Arms8"} <= set(tree.goal_ids())
    assert tree.families()["Bandit"] == ["Bandit/Arms4", "Bandit/Arms4/Shaped", "Bandit/Arms8"]
    assert tree.families()["Bandit/Arms4"] == ["Bandit/Arms4/Shaped"]  # a goal that is also a family
    four, eight = tree.load_goal("Bandit/Arms4"), tree.load_goal("Bandit/Arms8")
    assert (four.goal_id, four.title, eight.title) == ("Bandit/Arms4", "Contextual bandit, four arms",
                                                       "Contextual bandit, eight arms")
    assert "with eight arms" in eight.description
    assert eight.train.environment.provider_args == {"n_arms": 8}
    assert eight.train.environment.task.termination.success == ["hit"]  # from _goal-common.yaml
    resolved = tree.resolve("Bandit/Arms8/ppo")
    assert (resolved.ref, resolved.recipe.train.timesteps) == ("Bandit/Arms8/ppo", 32768)
    assert resolved.recipe.train.backend.id == "gradlab.ppo"  # composed from gradlab__bandit's recipe
    assert tree.catalog.project_of("Bandit/Arms4") == tree.catalog.project_of("Bandit/Arms4/Shaped") == "smoke"
    shaped = tree.load_goal("Bandit/Arms4/Shaped")  # parent goal + family reward shapes, 3 levels deep
    assert (shaped.title, shaped.train.environment.provider_args) == ("Contextual bandit, four arms, shaped reward",
                                                                      {"n_arms": 4})
    assert sorted(shaped.train.environment.task.reward.terms) == ["hit_bonus", "miss_penalty", "native", "time_cost"]
    assert tree.catalog.goals_of("smoke", tree.goal_ids()) == ["gradlab__bandit", "gradlab__keydoor", "Bandit/Arms4",
                                                         "Bandit/Arms4/Shaped", "Bandit/Arms8"]


def test_template_vars_unknown_or_redefined_names_are_refused(experiments_copy: Path) -> None:
    goal = experiments_copy / "goals" / "Bandit" / "Arms4" / "_goal.yaml"
    goal.write_text(goal.read_text() + "description: '{{ arms_txt }} arms'\n")
    with pytest.raises(ConfigError) as info:
        Experiments().load_goal("Bandit/Arms4")
    assert "description: undefined template name 'arms_txt' (expected one of ['arms_text', 'env_id', 'goal_id'])" \
        in info.value.problems[0].render()
    goal.write_text("template_vars: {goal_id: x, level: [1]}\n")
    rendered = [p.render() for p in pytest.raises(ConfigError, Experiments().load_goal, "Bandit/Arms4").value.problems]
    assert any("template_vars.goal_id: 'goal_id' is set by gradlab and cannot be redefined" in r for r in rendered)
    assert any("template_vars.level: expected a string or a number; found [1]" in r for r in rendered)


@pytest.mark.parametrize("goal_id", ["Bandit/../gradlab__bandit", "/Bandit/Arms4", "Bandit//Arms4", "Bandit/Arms4/",
                                     "Bandit/recipes", "A/B/C/D/E", "Bandit/_goal-common"])
def test_a_nested_id_that_could_escape_is_refused_before_any_read(goal_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[Path] = []
    real = experiments.compose_file
    monkeypatch.setattr(experiments, "compose_file", lambda path, **kw: opened.append(path) or real(path, **kw))
    with pytest.raises(ConfigError, match="goal id: expected a path of 1 to 4 names"):
        Experiments().load_goal(goal_id)
    with pytest.raises(ConfigError):
        Experiments().resolve(f"{goal_id}/ppo")
    assert opened == []


def test_split_ref_takes_the_last_name_as_the_recipe() -> None:
    assert split_ref("Bandit/Arms4/ppo") == ("Bandit/Arms4", "ppo")
    assert split_ref("CartPole-v1/ppo") == ("CartPole-v1", "ppo")
    assert check_id("goal", "A/B/C/D") == "A/B/C/D"
    with pytest.raises(ConfigError, match="expected GOAL/RECIPE"):
        split_ref("Bandit")
