"""gradlab.ppo exact resume: SIGKILL after checkpoint 2, resume from it, same final parameters.

The resume state holds no pickle (``state.json`` + ``optimizer.safetensors``), and the lanes are
not saved, so a resumed run starts new episodes. The environment here makes that exact: Corridor
episodes last 5 steps with ``n_steps`` 5, so every rollout boundary is an episode boundary in
every lane and a fresh reset is the state the uninterrupted run is in. Everything else (parameters,
Adam's moments and steps, torch/NumPy/Python RNG streams behind the minibatch permutations and
action sampling, schedules, step counter, episode windows) comes from the checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from gradlab.checkpoints import list_checkpoints, verify_checkpoint
from gradlab.learn.learner import run_learner
from gradlab.outbox import Outbox
from tests.learn.conftest import make_spec, write_spec

CORRIDOR = {"provider": "gradlab", "env_id": "Corridor-v0", "n_envs": 4, "provider_args": {"length": 5, "end": "truncate"}}
CONFIG = {"learning_rate": {"kind": "linear", "initial": 3e-3, "final": 0.0}, "n_steps": 5, "batch_size": 8,
          "n_epochs": 3, "gamma": 0.9, "ent_coef": {"kind": "linear", "initial": 0.05, "final": 0.0},
          "clip_range": {"kind": "linear", "initial": 0.3, "final": 0.1}, "threads": 1}


def _cmd(spec_path: Path, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gradlab.learn", "--spec", str(spec_path), "--run-dir", str(run_dir),
            "--log-level", "WARNING", *extra]


def _ready(run_dir: Path) -> list[dict]:
    if not (run_dir / "outbox.sqlite").exists():
        return []
    ob = Outbox(run_dir / "outbox.sqlite")
    try:
        return [e.payload for e in ob.read(kind="checkpoint_ready", limit=1000)]
    finally:
        ob.close()


@pytest.mark.slow
def test_sigkill_after_checkpoint_2_then_resume_equals_uninterrupted(tmp_path: Path) -> None:
    # 4 lanes x 5 steps = 20 per rollout; 300 steps = 15 rollouts; a checkpoint every 60 steps.
    spec = make_spec(CORRIDOR, {"id": "gradlab.ppo", "config": CONFIG}, timesteps=300, checkpoint_freq=60, seed=4,
                     policy_model={"net_arch": [16]})
    spec_path = write_spec(spec, tmp_path / "spec.json")
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    run_learner(spec, straight, watch_parent=False)  # uninterrupted, in this process

    proc = subprocess.Popen(_cmd(spec_path, broken), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while len(_ready(broken)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    second = _ready(broken)[1]
    assert second["step"] == 120
    ckpt = Path(second["path"])
    assert verify_checkpoint(ckpt).step == 120
    state = json.loads((ckpt / "resume" / "state.json").read_text())
    assert state["format"] == "gradlab.ppo.resume/1" and state["env_state"] == "reset"
    assert not list(ckpt.rglob("*.pkl")) and not list(ckpt.rglob("*.pt"))  # no pickle in the resume state

    resumed = subprocess.run(_cmd(spec_path, broken, "--resume-from", str(ckpt)), capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final_a, final_b = list_checkpoints(straight)[-1], list_checkpoints(broken)[-1]
    assert verify_checkpoint(final_a).step == verify_checkpoint(final_b).step == 300
    wa, wb = load_file(str(final_a / "policy.safetensors")), load_file(str(final_b / "policy.safetensors"))
    assert sorted(wa) == sorted(wb)
    for key in wa:
        assert (wa[key] == wb[key]).all(), key
    oa = load_file(str(final_a / "resume" / "optimizer.safetensors"))
    ob = load_file(str(final_b / "resume" / "optimizer.safetensors"))
    assert sorted(oa) == sorted(ob) and all((oa[k] == ob[k]).all() for k in oa)
    sa = json.loads((final_a / "resume" / "state.json").read_text())
    sb = json.loads((final_b / "resume" / "state.json").read_text())
    for key in ("num_timesteps", "n_updates", "progress_remaining", "ent_coef", "episodes"):
        assert sa[key] == sb[key], key
    assert sa["rng"]["torch"] == sb["rng"]["torch"] and sa["rng"]["numpy"] == sb["rng"]["numpy"]
