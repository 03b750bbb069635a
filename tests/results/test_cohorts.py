"""Cohorts, leaders, compare, the cohort receipt and reports sync on synthetic sealed runs (file stores)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradlab.benchmarks.reports import synthesize
from gradlab.errors import Conflict, ContractViolation, NotFound


@pytest.fixture
def stores(gradlab_home: Path):
    from gradlab.stores import open_stores

    synthesize(gradlab_home, runs=10, rollouts=20)  # 2 goals x 5 recipes, one seed each
    return open_stores()


def test_one_seed_cohorts_have_no_interval_and_say_so(stores) -> None:
    from typer.testing import CliRunner

    from gradlab.cli.app import app
    from gradlab.results.cohorts import leaders_runs

    ranked = leaders_runs(stores, "gradlab__bandit")
    assert len(ranked) == 5 and all(len(c.scores) == 1 for c in ranked)
    for c in ranked:
        assert c.iqm.value == c.scores[0] and c.iqm.low is None and c.iqm.high is None and "undefined" in c.iqm.note
    values = [c.iqm.value for c in ranked]
    assert values == sorted(values, reverse=True)  # the objective (success rate) is maximized
    out = CliRunner().invoke(app, ["leaders", "runs", "--goal", "gradlab__bandit"])
    assert out.exit_code == 0 and "interval undefined: 1 seed" in out.stdout
    assert leaders_runs(stores, "gradlab__bandit", min_seeds=2) == []
    with pytest.raises(NotFound, match="goal Acrobot-v1: no sealed runs"):
        leaders_runs(stores, "Acrobot-v1")


def test_compare_refuses_two_goals_and_unknown_recipes(stores) -> None:
    from typer.testing import CliRunner

    from gradlab.cli.app import app
    from gradlab.results.cohorts import compare, find_cohort

    a, b = find_cohort(stores, "gradlab__bandit/ppo"), find_cohort(stores, "CartPole-v1/ppo")
    with pytest.raises(ContractViolation, match="different goals"):
        compare(a, b)
    p = compare(find_cohort(stores, "gradlab__bandit/ppo-long"), a)
    assert p.value in (0.0, 0.5, 1.0) and p.low is None and "undefined" in p.note
    out = CliRunner().invoke(app, ["compare", "gradlab__bandit/ppo", "gradlab__bandit/nope"])
    assert out.exit_code == 1 and "unknown recipe 'gradlab__bandit/nope': goal gradlab__bandit has no recipe 'nope'" in (
        out.stderr.replace("\n", ""))
    assert "gradlab sweep" not in out.stderr  # no advice to sweep a recipe that would be refused
    out = CliRunner().invoke(app, ["compare", "gradlab__bandit", "gradlab__bandit/ppo"])
    assert out.exit_code == 2 and "expected GOAL/RECIPE" in out.stderr


def test_cohort_receipt_is_create_only(stores) -> None:
    from gradlab.receipts.models import utcnow
    from gradlab.results.cohort_receipts import (
        CohortReceipt,
        CohortRun,
        new_cohort_id,
        read_cohort,
        seal_cohort,
    )

    now = utcnow()
    receipt = CohortReceipt(cohort_id=new_cohort_id(), goal_id="gradlab__bandit", recipe_id="ppo", seeds=[0],
                            runs=[CohortRun(run_id="gradlab-20260101T000000-00000000", seed=0, outcome="succeeded")],
                            created_at=now, sealed_at=now)
    assert seal_cohort(stores, receipt) == receipt == seal_cohort(stores, receipt)  # a retry agrees
    with pytest.raises(Conflict, match="cohort receipt already exists and disagrees"):
        seal_cohort(stores, receipt.model_copy(update={"seeds": [1]}))
    assert read_cohort(stores, receipt.cohort_id) == receipt


def test_reports_sync_keeps_every_build_and_moves_the_index(stores, gradlab_home: Path, tmp_path: Path) -> None:
    from gradlab.results.reports import INDEX_KEY, build_site, sync_site
    from gradlab.settings import load_settings
    from gradlab.stores import open_store

    store = open_store((tmp_path / "published").as_uri())
    import shutil

    one = build_site(load_settings(), stores, tmp_path / "one", goal="gradlab__bandit")
    assert one.goals == ("gradlab__bandit",) and one.pages == ("index.html", "smoke/gradlab__bandit.html")
    changed = shutil.copytree(one.root, tmp_path / "changed")
    (changed / "smoke" / "gradlab__bandit.html").write_text("<p>a later build</p>")
    first, second = sync_site(one.root, store), sync_site(changed, store)
    assert first["build"] != second["build"]
    index = json.loads(store.get(INDEX_KEY))
    assert index["latest"] == second["build"] and [b["build"] for b in index["builds"]] == [first["build"], second["build"]]
    assert store.exists(f"reports/builds/{first['build']}/index.html")  # the older build is kept
    with pytest.raises(ContractViolation, match="not a built report site"):
        sync_site(tmp_path, store)
    with pytest.raises(NotFound, match="goal Acrobot-v1: no sealed runs"):
        build_site(load_settings(), stores, tmp_path / "none", goal="Acrobot-v1")


def test_unknown_goals_are_named_unknown_before_any_run_is_looked_for(stores, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gradlab.cli.app import app

    for args in (["leaders", "runs", "--goal", "NoSuchGoal"], ["leaders", "checkpoints", "--goal", "NoSuchGoal"],
                 ["reports", "build", "--goal", "NoSuchGoal", "--out", str(tmp_path / "site")],
                 ["compare", "NoSuchGoal/ppo", "NoSuchGoal/a2c"]):
        out = CliRunner().invoke(app, args)
        assert out.exit_code == 1 and "unknown goal 'NoSuchGoal'" in out.stderr, (args, out.stderr)
    assert not (tmp_path / "site").exists()
    near = CliRunner().invoke(app, ["leaders", "runs", "--goal", "gradlab__bandt"])
    assert near.exit_code == 1 and "did you mean gradlab__bandit?" in near.stderr


def test_cohorts_match_overrides_in_any_order(gradlab_home: Path) -> None:
    from typer.testing import CliRunner

    from gradlab.cli.app import app
    from gradlab.results.cohorts import canonical_overrides, find_cohort, goal_results
    from gradlab.stores import open_stores

    # Runs 0 and 10 are seeds 0 and 1 of gradlab__bandit/ppo, given the same overrides in two orders.
    synthesize(gradlab_home, runs=11, rollouts=3, overrides={0: ["train.timesteps=4096", "algorithm.gamma=0.9"],
                                                           10: ["algorithm.gamma = 0.9", "train.timesteps=4096"]})
    stores = open_stores()
    assert canonical_overrides(["b=2", "a = 1", "b=3"]) == ("a=1", "b=3")
    cohort = find_cohort(stores, "gradlab__bandit/ppo", ["train.timesteps=4096", "algorithm.gamma=0.9"])
    assert [s.seed for s in cohort.seeds] == [0, 1]
    assert cohort.overrides == ("algorithm.gamma=0.9", "train.timesteps=4096")
    assert len({r.cohort for r in goal_results(stores, "gradlab__bandit") if r.recipe_id == "ppo"}) == 1
    out = CliRunner().invoke(app, ["compare", "gradlab__bandit/ppo", "gradlab__bandit/a2c", "--set-a",
                                   "train.timesteps=4096", "--set-a", "algorithm.gamma=0.9", "--json"])
    assert out.exit_code == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["a"]["n_seeds"] == 2 and doc["same_cohort"] is False


def test_compare_of_a_cohort_with_itself_is_labelled(stores) -> None:
    from typer.testing import CliRunner

    from gradlab.cli.app import app
    from gradlab.cli.results_cmds import plural

    out = CliRunner().invoke(app, ["compare", "gradlab__bandit/ppo", "gradlab__bandit/ppo"])
    assert out.exit_code == 0, out.stderr
    assert "note: A and B are the same cohort (gradlab__bandit/ppo, the same 1 run)" in out.stderr.replace("\n", " ")
    assert "(same cohort)" in out.stdout
    doc = json.loads(CliRunner().invoke(app, ["compare", "gradlab__bandit/ppo", "gradlab__bandit/ppo", "--json"]).stdout)
    assert doc["same_cohort"] is True and doc["probability_of_improvement"]["value"] == 0.5
    assert (plural(1, "seed"), plural(3, "seed")) == ("1 seed", "3 seeds")
    none = CliRunner().invoke(app, ["leaders", "runs", "--goal", "gradlab__bandit", "--min-seeds", "2"])
    assert none.exit_code == 0 and "no cohort with at least 2 evaluated seeds" in none.stderr
