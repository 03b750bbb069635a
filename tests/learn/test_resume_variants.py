"""Resume beyond CartPole/PPO/sync lanes: k steps + stop + resume against N steps straight, for A2C
with observation normalisation, subprocess (async) lanes and ALE's native lanes.

What is exact depends on whether the lanes can be saved: in-process lanes are saved with the
checkpoint as data, subprocess lanes as their provider snapshots, so a resumed run is
bit-identical to an uninterrupted one; ale-py's native vector env cannot capture a lane (its
episodes restart at the resume, ``gradlab/learn/sb3.py``), so there the step counter, the
schedules, the update count and the normalisation statistics continue exactly and the lanes start
fresh episodes. Runs in-process (``run_learner``) to keep the imports paid once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from gradlab.checkpoints import list_checkpoints, verify_checkpoint
from gradlab.learn import run_learner
from gradlab.learn.resume_state import LANES_SAVED
from gradlab.outbox import Outbox
from tests.learn.conftest import CARTPOLE, make_spec

pytestmark = pytest.mark.slow


def _updates(run_dir: Path, algorithm: str) -> dict[int, dict[str, float]]:
    """Per-update metrics by step (the last attempt's, for a resumed run)."""
    lr = f"train/algorithm/{algorithm}/update/learning_rate"
    events = Outbox(run_dir / "outbox.sqlite").read(kind="metrics", limit=100_000)
    return {e.step: e.payload["metrics"] for e in events if lr in e.payload["metrics"]}


def _straight_and_resumed(spec, tmp_path: Path, stop_at: int) -> tuple[Path, Path, bool]:
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    assert run_learner(spec, straight, watch_parent=False).final_step == spec.recipe.train.timesteps
    stopped = run_learner(spec, broken, stop_at_step=stop_at, watch_parent=False)
    assert (stopped.final_step, stopped.stop_reason) == (stop_at, "stop_requested")
    checkpoint = list_checkpoints(broken)[-1]
    assert verify_checkpoint(checkpoint).step == stop_at
    saved = json.loads((checkpoint / "resume" / "state.json").read_text())["env_state"] == LANES_SAVED
    resumed = run_learner(spec, broken, resume_from=checkpoint, watch_parent=False)
    assert (resumed.final_step, resumed.stop_reason) == (spec.recipe.train.timesteps, "budget")
    return straight, broken, saved


def _same_weights(a: Path, b: Path) -> bool:
    wa = load_file(str(list_checkpoints(a)[-1] / "policy.safetensors"))
    wb = load_file(str(list_checkpoints(b)[-1] / "policy.safetensors"))
    return sorted(wa) == sorted(wb) and all((wa[k] == wb[k]).all() for k in wa)


def _counters_continue(straight: Path, broken: Path, algorithm: str, stop_at: int, timesteps: int) -> None:
    a, b = _updates(straight, algorithm), _updates(broken, algorithm)
    assert sorted(a) == sorted(b)  # the same update boundaries: the step counter continued
    lr = f"train/algorithm/{algorithm}/update/learning_rate"
    count = f"train/algorithm/{algorithm}/update/count"
    for step in (s for s in a if s > stop_at):
        assert b[step][lr] == a[step][lr]  # the schedule position continued
        assert b[step][count] == a[step][count]  # so did the gradient-step count
    assert list_checkpoints(broken)[-1].name.startswith(f"{timesteps:012d}-")
    starts = [e.payload["step"] for e in Outbox(broken / "outbox.sqlite").read(kind="learner_started")]
    assert starts == [0, stop_at]


def test_a2c_with_observation_normalisation_resumes_bit_identically(tmp_path: Path) -> None:
    # 8 lanes x 8 steps = 64 per update; 16 updates; checkpoints every 256 steps; stop at 512.
    a2c = {"id": "sb3.a2c", "config": {"n_steps": 8, "learning_rate": {"kind": "linear", "initial": 7e-4, "final": 0.0}}}
    spec = make_spec(CARTPOLE, a2c, timesteps=1024, checkpoint_freq=256, seed=5, normalize={"observation": True})
    straight, broken, saved = _straight_and_resumed(spec, tmp_path, 512)
    assert saved  # in-process lanes: saved with the checkpoint
    _counters_continue(straight, broken, "a2c", 512, 1024)
    a, b = _updates(straight, "a2c"), _updates(broken, "a2c")
    for step in (576, 768, 1024):
        for name in ("train/algorithm/a2c/update/value_loss", "train/algorithm/a2c/update/policy_gradient_loss"):
            assert b[step][name] == a[step][name], (step, name)
    assert _same_weights(straight, broken)
    # The observation statistics continued too: the final checkpoints hold the same running mean/var.
    stats = [json.loads((list_checkpoints(d)[-1] / "resume" / "vecnormalize.json").read_text()) for d in (straight, broken)]
    assert stats[0] == stats[1]


def test_async_lanes_resume_bit_identically(tmp_path: Path) -> None:
    env = {**CARTPOLE, "n_envs": 2, "vectorization": "async"}
    ppo = {"id": "sb3.ppo", "config": {"n_steps": 32, "batch_size": 64, "n_epochs": 1,
                                       "learning_rate": {"kind": "linear", "initial": 3e-4, "final": 0.0}}}
    spec = make_spec(env, ppo, timesteps=256, checkpoint_freq=64, seed=2)
    straight, broken, saved = _straight_and_resumed(spec, tmp_path, 128)
    assert saved  # subprocess lanes are saved as their provider snapshots (captured in the workers)
    _counters_continue(straight, broken, "ppo", 128, 256)
    assert _same_weights(straight, broken)  # so the episodes went on: bit-identical


def test_ale_lanes_resume_with_exact_counters_and_schedules(tmp_path: Path) -> None:
    env = {"provider": "ale", "env_id": "Breakout", "n_envs": 2, "num_threads": 1,
           "preprocessing": {"resize": [42, 42], "frame_stack": 2}}
    ppo = {"id": "sb3.ppo", "config": {"n_steps": 16, "batch_size": 32, "n_epochs": 1,
                                       "learning_rate": {"kind": "linear", "initial": 2.5e-4, "final": 0.0}}}
    spec = make_spec(env, ppo, timesteps=256, checkpoint_freq=64, seed=1)
    straight, broken, saved = _straight_and_resumed(spec, tmp_path, 128)
    assert not saved  # ale-py's native vector env cannot capture a lane: episodes restart at the resume
    _counters_continue(straight, broken, "ppo", 128, 256)


def test_resume_after_sigkill_ends_where_an_uninterrupted_run_ends(tmp_path: Path) -> None:
    """A retry after a SIGKILL resumes from the newest complete checkpoint: compared with a run that
    was never interrupted, not only its final step but its losses and final weights are the same."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.learn.conftest import write_spec

    ppo = {"id": "sb3.ppo", "config": {"n_steps": 32, "batch_size": 128, "n_epochs": 1,
                                       "learning_rate": {"kind": "linear", "initial": 3e-4, "final": 0.0}}}
    spec = make_spec(CARTPOLE, ppo, timesteps=2048, checkpoint_freq=256, seed=7)  # 256 steps per update
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_learner(spec, straight, watch_parent=False)
    proc = subprocess.Popen([sys.executable, "-m", "gradlab.learn", "--spec", str(write_spec(spec, tmp_path / "spec.json")),
                             "--run-dir", str(killed), "--log-level", "WARNING"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while len(list_checkpoints(killed)) < 2:  # two checkpoints, then somewhere in a later rollout
            assert proc.poll() is None and time.monotonic() < deadline, "the learner ended before two checkpoints"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        proc.kill()
    newest = list_checkpoints(killed)[-1]
    k = verify_checkpoint(newest).step
    assert 0 < k < 2048
    resumed = run_learner(spec, killed, resume_from=newest, watch_parent=False)
    assert (resumed.final_step, resumed.stop_reason) == (2048, "budget")
    a, b = _updates(straight, "ppo"), _updates(killed, "ppo")
    after = [s for s in sorted(a) if s > k]
    assert after and all(s in b for s in after)
    for step in after:
        for name in ("train/algorithm/ppo/update/value_loss", "train/algorithm/ppo/update/learning_rate",
                     "train/episode/count"):
            assert b[step][name] == a[step][name], (step, name)
    assert _same_weights(straight, killed)
