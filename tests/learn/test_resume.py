"""Exact resume: N steps straight equals k steps + stop + resume (the issue's PPO settings)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from gradlab.checkpoints import list_checkpoints, read_manifest, verify_checkpoint
from gradlab.outbox import Outbox
from tests.learn.conftest import CARTPOLE, make_spec, write_spec

PPO = {"learning_rate": {"kind": "linear", "initial": 3e-4, "final": 0.0}, "n_steps": 256, "batch_size": 512,
       "n_epochs": 2, "gamma": 0.99}


def _learn(spec_path: Path, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "gradlab.learn", "--spec", str(spec_path), "--run-dir", str(run_dir),
                           "--log-level", "WARNING", *extra], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _update_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    events = Outbox(run_dir / "outbox.sqlite").read(kind="metrics", limit=100_000)
    return {e.step: e.payload["metrics"] for e in events if "train/throughput/loop_fps" in e.payload["metrics"]}


@pytest.mark.slow
def test_stop_and_resume_equals_uninterrupted(tmp_path: Path) -> None:
    # 8 lanes x 256 steps = 2048 per rollout; 40960 = 20 rollouts; checkpoints every 10240 (5 rollouts).
    spec = make_spec(CARTPOLE, {"id": "sb3.ppo", "config": PPO}, timesteps=40960, checkpoint_freq=10240, seed=3)
    spec_path = write_spec(spec, tmp_path / "spec.json")
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    _learn(spec_path, straight)
    # Stop after the second checkpoint (10240, 20480), then resume from it.
    _learn(spec_path, broken, "--stop-at-step", "20480")
    ob = Outbox(broken / "outbox.sqlite")
    assert ob.last("learner_finished").payload == {"final_step": 20480, "stop_reason": "stop_requested"}
    stop_ckpt = Path(ob.last("checkpoint_ready").payload["path"])
    assert read_manifest(stop_ckpt).step == 20480
    ob.close()
    _learn(spec_path, broken, "--resume-from", str(stop_ckpt))
    ob = Outbox(broken / "outbox.sqlite")
    assert ob.last("learner_finished").payload == {"final_step": 40960, "stop_reason": "budget"}
    assert [e.payload["step"] for e in ob.read(kind="learner_started")] == [0, 20480]

    # The resumed run trained only the remaining steps: updates at 22528 ... 40960 after the restart.
    a, b = _update_metrics(straight), _update_metrics(broken)
    assert sorted(b) == sorted(a) == [2048 * k for k in range(1, 21)]
    lr = "train/algorithm/ppo/update/learning_rate"
    assert b[22528][lr] == a[22528][lr] == pytest.approx(3e-4 * (1 - 22528 / 40960), rel=1e-12)
    # Same episodes, same losses after the restart: lanes, RNG streams and optimizer were restored.
    for step in (22528, 30720, 40960):
        for name in ("train/algorithm/ppo/update/value_loss", "train/algorithm/ppo/update/approx_kl",
                     "train/episode/return/shaped/mean", "train/episode/count"):
            assert b[step][name] == a[step][name], (step, name)

    # Final parameters are bit-identical on CPU.
    final_a, final_b = list_checkpoints(straight)[-1], list_checkpoints(broken)[-1]
    assert verify_checkpoint(final_a).step == verify_checkpoint(final_b).step == 40960
    wa, wb = load_file(str(final_a / "policy.safetensors")), load_file(str(final_b / "policy.safetensors"))
    assert sorted(wa) == sorted(wb)
    for key in wa:
        assert (wa[key] == wb[key]).all(), key
