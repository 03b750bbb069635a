"""``gradlab train`` of an archive-curriculum recipe through the real flow: its checkpoints publish
with the curriculum's state, its training metrics count target-origin episodes apart, and the
evaluations it fans out start every episode from the goal's own reset."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradlab import receipts as rules
from gradlab.metrics import registry
from gradlab.outbox import Outbox
from gradlab.stores import open_stores
from tests.runs.conftest import gradlab_env, last_json_line, only_run_dir, run_gradlab


@pytest.mark.slow
def test_a_curriculum_run_publishes_its_archive_and_reports_episodes_by_origin(prefect_api: str,
                                                                               gradlab_home: Path) -> None:
    env = gradlab_env(prefect_api)
    out = run_gradlab(["train", "gradlab__keydoor/ppo-archive-curriculum", "--set", "train.timesteps=4096",
                       "--set", "train.checkpoint_freq=2048", "--json"], env, timeout_s=900)
    receipt = last_json_line(out.stdout)
    # The short budget may or may not reach the maze's goal: the receipt is sealed either way, and its
    # outcome is the evaluation's verdict, not the learner's exit.
    assert receipt["outcome"] in ("succeeded", "failed"), receipt
    assert (out.returncode == 0) == (receipt["outcome"] == "succeeded"), out.stderr[-3000:]
    assert receipt["learner"]["exit_code"] == 0, receipt["learner"]
    run_id = receipt["run_id"]
    stores = open_stores()
    publications = rules.list_publications(stores, run_id)
    assert [p.step for p in publications] == [c["step"] for c in receipt["checkpoints"]] and publications
    for pub in publications:
        assert "resume/curriculum.json" in pub.files
        blobs = [name for name in pub.files if name.startswith("resume/states/")]
        assert blobs, f"checkpoint {pub.step} published no archived state"
        for name in blobs:  # content-addressed: each blob's name is its own sha256
            assert pub.files[name].sha256 == name.rsplit("/", 1)[-1].removesuffix(".bin")
    # Every rollout reports the curriculum and the target-origin returns apart from the archive-origin ones.
    rows = [e.payload["metrics"] for e in Outbox(only_run_dir(gradlab_home) / "outbox.sqlite").read(
        kind="metrics", limit=100_000) if "train/curriculum/archive/cell_count" in e.payload["metrics"]]
    assert len(rows) >= 4
    last = rows[-1]
    registry.check_names(last)
    assert last["train/curriculum/archive/cell_count"] > 0
    assert last["train/curriculum/archive/start_count"] > 0
    assert 0 < last["train/curriculum/archive/start_share"] < 1
    assert last["train/episode/return/shaped/mean"] == last["train/episode/return/shaped/from/target/mean"]
    # The evaluations fanned out ran the goal's protocol from its reset: no episode names a start.
    evaluations = [rec for _, rec in rules.list_evaluations(stores, run_id) if rec is not None]
    assert evaluations
    for record in evaluations:
        assert record.result["episodes"]
        assert all(row.get("start") is None for row in record.result["episodes"])
