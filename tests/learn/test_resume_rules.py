"""Resume rules: another run's checkpoint, an untrusted checkpoint, early stop."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gradlab.checkpoints import list_checkpoints
from gradlab.errors import ContractViolation
from gradlab.learn.learner import run_learner
from gradlab.outbox import Outbox
from tests.learn.conftest import BANDIT, make_spec

CFG = {"n_steps": 32, "batch_size": 64, "n_epochs": 1, "gamma": 0.0}


def test_resume_from_a_copied_checkpoint_keeps_counters(tmp_path: Path) -> None:
    spec = make_spec(BANDIT, {"id": "sb3.ppo", "config": CFG}, timesteps=1024, checkpoint_freq=512)
    run_learner(spec, tmp_path / "a", stop_at_step=512)
    outside = tmp_path / "elsewhere" / list_checkpoints(tmp_path / "a")[-1].name
    shutil.copytree(list_checkpoints(tmp_path / "a")[-1], outside)
    # Another folder: the lane state is data (no pickle), so it needs no trust; counters continue.
    result = run_learner(spec, tmp_path / "b", resume_from=outside)
    assert (result.final_step, result.stop_reason) == (1024, "budget")
    metrics = [e.payload["metrics"] for e in Outbox(tmp_path / "b" / "outbox.sqlite").read(kind="metrics")]
    rollouts = [m for m in metrics if "train/throughput/loop_fps" in m]
    assert [m["train/global_step"] for m in rollouts] == [768.0, 1024.0]
    assert rollouts[-1]["train/episode/count"] == 1024.0  # 512 before the checkpoint + 512 after
    assert rollouts[-1]["train/algorithm/ppo/update/count"] == 4.0  # n_epochs=1 x 4 updates in all


def test_resume_refuses_another_runs_checkpoint(tmp_path: Path) -> None:
    spec = make_spec(BANDIT, {"id": "sb3.ppo", "config": CFG}, timesteps=512, checkpoint_freq=512)
    run_learner(spec, tmp_path / "a")
    other = make_spec(BANDIT, {"id": "sb3.ppo", "config": {**CFG, "gamma": 0.5}}, timesteps=512, checkpoint_freq=512)
    with pytest.raises(ContractViolation, match=r"manifest.json: recipe_sha256 expected [0-9a-f]{64} \(this run spec\)"):
        run_learner(other, tmp_path / "b", resume_from=list_checkpoints(tmp_path / "a")[-1])


def test_early_stop_condition_stops_with_its_name(tmp_path: Path) -> None:
    early = {"conditions": [{"name": "long_enough", "metric": "train/episode/length/mean", "kind": "threshold",
                             "operator": ">=", "threshold": 1.0, "warmup_steps": 512, "patience_steps": 256}]}
    spec = make_spec(BANDIT, {"id": "sb3.ppo", "config": CFG}, timesteps=4096, checkpoint_freq=4096, early_stop=early)
    result = run_learner(spec, tmp_path / "run")
    # Met from step 512 (warm-up), held for 256 more steps: stops at 768.
    assert (result.final_step, result.stop_reason) == (768, "early_stop:long_enough")
    ob = Outbox(tmp_path / "run" / "outbox.sqlite")
    assert ob.last("stop_observed").payload == {"reason": "early_stop:long_enough"}
    assert ob.last("learner_finished").payload == {"final_step": 768, "stop_reason": "early_stop:long_enough"}
