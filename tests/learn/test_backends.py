"""Both SB3 backends through the learner: registered metric names, schedules, counters, checkpoints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradlab.checkpoints import list_checkpoints, verify_checkpoint
from gradlab.errors import ConfigError
from gradlab.learn.backend import registered_backends
from gradlab.learn.backend_config import validate_backend_config
from gradlab.learn.learner import run_learner
from gradlab.learn.schedules import schedule_fn
from gradlab.metrics.registry import check_names
from gradlab.outbox import Outbox
from tests.learn.conftest import BANDIT, make_spec

CONFIGS = {
    "sb3.ppo": {"learning_rate": {"kind": "linear", "initial": 3e-3, "final": 1e-3}, "n_steps": 32,
                "batch_size": 64, "n_epochs": 2, "gamma": 0.0, "ent_coef": {"kind": "linear", "initial": 0.02, "final": 0.0}},
    "gradlab.ppo": {"learning_rate": {"kind": "linear", "initial": 3e-3, "final": 1e-3}, "n_steps": 32,
                    "batch_size": 64, "n_epochs": 2, "gamma": 0.0, "ent_coef": {"kind": "linear", "initial": 0.02, "final": 0.0}},
    "sb3.a2c": {"learning_rate": {"kind": "linear", "initial": 3e-3, "final": 1e-3}, "n_steps": 32, "gamma": 0.0,
                "ent_coef": {"kind": "linear", "initial": 0.02, "final": 0.0}},
}


@pytest.mark.parametrize("backend", [b for b in registered_backends() if b in CONFIGS])  # gradient backends
def test_backend_run_emits_only_registered_metrics(backend: str, tmp_path: Path) -> None:
    algo = backend.split(".")[1]
    # 8 lanes x 32 steps = 256 steps per rollout; 2048 steps = 8 rollouts; checkpoints at 512, 1024, 1536, final 2048.
    spec = make_spec(BANDIT, {"id": backend, "config": CONFIGS[backend]}, timesteps=2048, checkpoint_freq=512,
                     policy_model={"net_arch": [16]})
    result = run_learner(spec, tmp_path / "run")
    assert (result.final_step, result.stop_reason) == (2048, "budget")
    ob = Outbox(tmp_path / "run" / "outbox.sqlite")
    events = ob.read(limit=10_000)
    kinds = [e.kind for e in events]
    assert kinds[0] == "learner_started" and kinds[-1] == "learner_finished"
    assert events[-1].payload == {"final_step": 2048, "stop_reason": "budget"}
    metrics = [e.payload["metrics"] for e in events if e.kind == "metrics"]
    names = {n for m in metrics for n in m}
    check_names(names)  # raises on any unregistered name
    rollouts = [m for m in metrics if "train/throughput/loop_fps" in m]
    assert [m["train/global_step"] for m in rollouts] == [256.0 * k for k in range(1, 9)]
    # Schedules: SB3 updates after collecting, so the first update sees progress 1 - 256/2048 = 0.875.
    lr = [m[f"train/algorithm/{algo}/update/learning_rate"] for m in rollouts]
    assert lr[0] == pytest.approx(1e-3 + 2e-3 * 0.875, rel=1e-12)
    assert lr[-1] == pytest.approx(1e-3, rel=1e-12)
    ent = [m[f"train/algorithm/{algo}/update/entropy_coef"] for m in rollouts]
    assert ent[0] == pytest.approx(0.02 * 0.875) and ent[3] == pytest.approx(0.02 * 0.5)
    # Bandit episodes last one step: 256 episodes per rollout, each a success or a failure.
    last = rollouts[-1]
    assert last["train/episode/count"] == 2048.0
    assert last["train/outcome/success/count"] + last["train/outcome/failure/count"] == 2048.0
    assert last["train/episode/reason/hit/count"] == last["train/outcome/success/count"]
    assert last["train/episode/length/mean"] == 1.0
    assert last["train/outcome/success/window_100/rate"] == pytest.approx(last["train/episode/return/raw/mean"])
    assert 0.0 <= last["train/reward/shaped/min"] <= last["train/reward/shaped/mean"] <= last["train/reward/shaped/max"] <= 1.0
    # Checkpoints: periodic at 512, 1024, 1536 and one final at 2048, each announced after it exists.
    ready = [e.payload for e in events if e.kind == "checkpoint_ready"]
    assert [(p["step"], p["purpose"]) for p in ready] == [(512, "periodic"), (1024, "periodic"), (1536, "periodic"),
                                                         (2048, "final")]
    assert [p.name[:12] for p in list_checkpoints(tmp_path / "run")] == [f"{s:012d}" for s in (512, 1024, 1536, 2048)]
    for p in ready:
        manifest = verify_checkpoint(Path(p["path"]))
        assert manifest.sha256 == p["sha256"] and manifest.backend_id == backend
        assert manifest.run_id == spec.run_id and manifest.recipe_sha256 == spec.recipe_sha256


def test_ppo_learns_the_bandit(tmp_path: Path) -> None:
    config = {"learning_rate": 3e-3, "n_steps": 64, "batch_size": 128, "n_epochs": 4, "gamma": 0.0}
    spec = make_spec(BANDIT, {"id": "sb3.ppo", "config": config}, timesteps=8192, checkpoint_freq=8192,
                     policy_model={"net_arch": [32]})
    run_learner(spec, tmp_path / "run")
    last = Outbox(tmp_path / "run" / "outbox.sqlite").read(kind="metrics", limit=10_000)[-2].payload["metrics"]
    assert last["train/outcome/success/window_100/rate"] >= 0.9


def test_schedule_fn_values() -> None:
    lin = schedule_fn({"kind": "linear", "initial": 3e-4, "final": 0.0})
    assert [lin(p) for p in (1.0, 0.5, 0.0)] == [3e-4, 1.5e-4, 0.0]
    assert schedule_fn(0.25)(0.3) == 0.25


def test_invalid_backend_config_is_refused_before_training() -> None:
    spec = make_spec(BANDIT, {"id": "sb3.ppo", "config": {"n_steps": 4, "batch_size": 64}}, timesteps=64,
                     checkpoint_freq=64)
    with pytest.raises(ConfigError, match=r"train.backend.config.batch_size: expected at most n_steps \* n_envs = 32, found 64"):
        validate_backend_config(spec.recipe.train, 8)
    assert np.isfinite(schedule_fn(1.0)(0.0))
