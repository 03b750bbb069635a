"""The learner's early stop runs through ``gradlab.evaluation.early_stop.EarlyStopMonitor``.

Bandit-v0 with 8 lanes x 32 steps: every step ends a 1-step episode, so after each rollout
``train/episode/count`` equals ``train/global_step`` (256, 512, 768, ...). That makes every early-stop
metric computable by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

from gradlab.checkpoints import list_checkpoints
from gradlab.learn.learner import run_learner
from gradlab.outbox import Outbox
from tests.learn.conftest import BANDIT, make_spec

CFG = {"n_steps": 32, "batch_size": 64, "n_epochs": 1, "gamma": 0.0}
COUNT = "train/episode/count"


def _cond(name: str, operator: str, threshold: float, *, patience: int, action: str = "stop", warmup: int = 0) -> dict:
    return {"name": name, "metric": COUNT, "kind": "threshold", "operator": operator, "threshold": threshold,
            "warmup_steps": warmup, "patience_steps": patience, "action": action}


def _rollout_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    events = Outbox(run_dir / "outbox.sqlite").read(kind="metrics", limit=100_000)
    return {e.step: e.payload["metrics"] for e in events if "train/throughput/loop_fps" in e.payload["metrics"]}


def _early(metrics: dict[str, float], name: str) -> tuple[float, float, float, float]:
    p = f"train/early_stop/{name}/"
    return (metrics[p + "value"], metrics[p + "best"], metrics[p + "patience/progress"], metrics[p + "would_trigger"])


def test_threshold_stop_emits_the_four_metrics_and_stops_with_its_name(tmp_path: Path) -> None:
    # enough: count >= 500 held for 256 steps -> holds from 512, triggers at 768.
    # seen: count > 300, observe only, no patience -> would trigger from 512 but never stops.
    early = {"conditions": [_cond("enough", ">=", 500, patience=256), _cond("seen", ">", 300, patience=0, action="observe")]}
    spec = make_spec(BANDIT, {"id": "sb3.ppo", "config": CFG}, timesteps=4096, checkpoint_freq=4096, early_stop=early)
    result = run_learner(spec, tmp_path / "run")
    assert (result.final_step, result.stop_reason) == (768, "early_stop:enough")
    m = _rollout_metrics(tmp_path / "run")
    assert sorted(m) == [256, 512, 768]
    # (value, best, patience/progress, would_trigger) per rollout, by hand.
    assert [_early(m[s], "enough") for s in (256, 512, 768)] == [
        (256.0, 256.0, 0.0, 0.0), (512.0, 512.0, 0.0, 0.0), (768.0, 768.0, 1.0, 1.0)]
    assert [_early(m[s], "seen") for s in (256, 512, 768)] == [
        (256.0, 256.0, 0.0, 0.0), (512.0, 512.0, 1.0, 1.0), (768.0, 768.0, 1.0, 1.0)]
    ob = Outbox(tmp_path / "run" / "outbox.sqlite")
    assert [e.payload for e in ob.read(kind="stop_observed")] == [{"reason": "early_stop:enough"}]
    assert ob.last("learner_finished").payload == {"final_step": 768, "stop_reason": "early_stop:enough"}
    assert ob.last("checkpoint_ready").payload["purpose"] == "final"


def test_observe_condition_emits_but_does_not_stop(tmp_path: Path) -> None:
    early = {"conditions": [_cond("seen", ">=", 256, patience=256, action="observe")]}
    spec = make_spec(BANDIT, {"id": "sb3.ppo", "config": CFG}, timesteps=1024, checkpoint_freq=4096, early_stop=early)
    result = run_learner(spec, tmp_path / "run")
    assert (result.final_step, result.stop_reason) == (1024, "budget")
    m = _rollout_metrics(tmp_path / "run")
    # Holds from 256; progress = held steps / 256: 0, 1, 1, 1; would_trigger from 512.
    assert [_early(m[s], "seen") for s in (256, 512, 768, 1024)] == [
        (256.0, 256.0, 0.0, 0.0), (512.0, 512.0, 1.0, 1.0), (768.0, 768.0, 1.0, 1.0), (1024.0, 1024.0, 1.0, 1.0)]
    ob = Outbox(tmp_path / "run" / "outbox.sqlite")
    assert ob.read(kind="stop_observed") == []
    assert ob.last("learner_finished").payload == {"final_step": 1024, "stop_reason": "budget"}


def test_early_stop_state_is_saved_and_restored_on_resume(tmp_path: Path) -> None:
    # count >= 500 held for 512 steps: holds from 512, triggers at 1024 in an uninterrupted run.
    early = {"conditions": [_cond("enough", ">=", 500, patience=512)]}
    spec = make_spec(BANDIT, {"id": "sb3.ppo", "config": CFG}, timesteps=4096, checkpoint_freq=4096, early_stop=early)
    run_dir = tmp_path / "run"
    stopped = run_learner(spec, run_dir, stop_at_step=768)
    assert (stopped.final_step, stopped.stop_reason) == (768, "stop_requested")
    ckpt = list_checkpoints(run_dir)[-1]
    state = json.loads((ckpt / "resume" / "early_stop.json").read_text())
    assert state == {"enough": {"best": 768.0, "since": 512, "triggered": False}}
    # Resumed: the streak started at 512 continues, so the run stops at 1024 (not 1536 = 1024 + 512).
    resumed = run_learner(spec, run_dir, resume_from=ckpt)
    assert (resumed.final_step, resumed.stop_reason) == (1024, "early_stop:enough")
    assert _early(_rollout_metrics(run_dir)[1024], "enough") == (1024.0, 1024.0, 1.0, 1.0)
