"""A training-only goal ranks its runs by its training objective, from their receipts.

The bandit goal is made training-only here (a copy of the experiments tree: no acceptance rule,
objective ``train/episode/return/raw/mean``), as Montezuma's Revenge is in the real tree; two
cohorts trained for different budgets are ranked by the last value training reported.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from gradlab.outbox import Outbox
from tests.runs.conftest import REPO, gradlab_env, last_json_line, run_gradlab

OBJECTIVE = "train/episode/return/raw/mean"


@pytest.fixture
def training_only_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "experiments"
    shutil.copytree(REPO / "experiments", tree)
    goal_file = tree / "goals" / "gradlab__bandit" / "_goal.yaml"
    goal = yaml.safe_load(goal_file.read_text())
    goal["evaluation_mode"] = "training_only"
    goal["objective"] = {"rank": OBJECTIVE, "direction": "maximize"}
    del goal["eval"]["acceptance"]
    goal_file.write_text(yaml.safe_dump(goal))
    return tree


@pytest.mark.slow
def test_leaders_of_a_training_only_goal_rank_by_the_last_training_value(prefect_api: str, gradlab_home: Path,
                                                                         training_only_tree: Path) -> None:
    env = {**gradlab_env(prefect_api, GRADLAB_HOME=str(gradlab_home)), "GRADLAB_EXPERIMENTS": str(training_only_tree)}
    receipts = {}
    for timesteps in (1024, 8192):
        done = run_gradlab(["train", "gradlab__bandit/ppo", "--set", f"train.timesteps={timesteps}", "--json"], env)
        assert done.returncode == 0, done.stderr[-3000:]
        receipt = last_json_line(done.stdout)
        assert receipt["outcome"] == "succeeded" and receipt["promotion"] is None
        assert {e["status"] for e in receipt["evaluations"]} <= {"deferred"}  # nothing is evaluated
        objective = receipt["metrics"]["objective"]
        # the value the receipt recorded is the learner's last report of the metric, at the final step
        outbox = Outbox(gradlab_home / "runs" / receipt["run_id"] / "outbox.sqlite", readonly=True)
        reported = [(e.step, e.payload["metrics"][OBJECTIVE]) for e in outbox.read(kind="metrics", limit=100_000)
                    if OBJECTIVE in e.payload["metrics"]]
        outbox.close()
        assert objective == {"metric": OBJECTIVE, "value": reported[-1][1], "step": reported[-1][0]}
        assert objective["step"] == receipt["final_step"] == timesteps
        receipts[timesteps] = receipt
    short, long = receipts[1024]["metrics"]["objective"]["value"], receipts[8192]["metrics"]["objective"]["value"]
    assert short < long == 1.0  # two rollout updates do not learn the bandit; sixteen do

    listed = run_gradlab(["leaders", "runs", "--goal", "gradlab__bandit", "--json"], env)
    assert listed.returncode == 0, listed.stderr
    ranked = json.loads(listed.stdout)
    assert [c["overrides"] for c in ranked] == [["train.timesteps=8192"], ["train.timesteps=1024"]]
    for cohort, timesteps in zip(ranked, (8192, 1024), strict=True):
        assert cohort["objective"] == OBJECTIVE and cohort["n_scored"] == 1 and cohort["accepted"] == 0
        [seed] = cohort["seeds"]
        assert (seed["run_id"], seed["score"], seed["scored_by"]) == (
            receipts[timesteps]["run_id"], receipts[timesteps]["metrics"]["objective"]["value"], "training")
        assert f"by the last training value of {OBJECTIVE}: seed 0" in cohort["note"]
    shown = run_gradlab(["leaders", "runs", "--goal", "gradlab__bandit"], env)
    assert shown.returncode == 0 and f"IQM of {OBJECTIVE}" in shown.stdout, shown.stderr
