"""gradlab.ppo exact resume: SIGKILL after checkpoint 2, resume from it, the same run as an uninterrupted one.

The resume state holds no pickle (``state.json``, ``optimizer.safetensors``, the lane state as
``lanes.json`` + ``lanes.npz`` + ``last_obs.npy``), and the lanes continue mid-episode: Corridor
episodes here last 6 to 11 steps with ``n_steps`` 5, so checkpoints fall inside episodes and a
lane reset would change observations, actions and weights. Everything else (parameters, Adam's
moments and steps, torch/NumPy/Python RNG streams behind the minibatch permutations and action
sampling, schedules, step counter, episode windows) comes from the checkpoint too. A checkpoint
without lane state (as written before gradlab.ppo saved it) still resumes, with new episodes; a
lane-state file that was changed is refused, naming the file.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from gradlab.checkpoints import file_sha256, list_checkpoints, verify_checkpoint
from gradlab.errors import ContractViolation, IntegrityError
from gradlab.learn.learner import run_learner
from gradlab.outbox import Outbox
from tests.learn.conftest import make_spec, write_spec

CORRIDOR = {"provider": "gradlab", "env_id": "Corridor-v0", "n_envs": 4,
            "provider_args": {"length": [7, 9, 6, 11], "end": "truncate"}}
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
    # On a loaded machine the learner may write a checkpoint or two more before SIGKILL lands; the
    # scenario is a crash right after checkpoint 2, so those later folders never came to be. A
    # ``.partial-*`` folder the kill cut short stays: a crash mid-write leaves one, and readers skip it.
    for later in (broken / "checkpoints").iterdir():
        if not later.name.startswith(".") and int(later.name.split("-")[0]) > 120:
            shutil.rmtree(later)
    assert verify_checkpoint(ckpt).step == 120
    state = json.loads((ckpt / "resume" / "state.json").read_text())
    assert state["format"] == "gradlab.ppo.resume/1" and state["env_state"] == "lanes"
    for name in ("lanes.json", "lanes.npz", "last_obs.npy"):  # the lane state, covered by the manifest
        assert f"resume/{name}" in verify_checkpoint(ckpt).files
    assert (np.load(ckpt / "resume" / "last_obs.npy") % 5 != 0).any()  # some lanes are mid-episode here
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
    # The lanes are where the uninterrupted run's are: observations, env and task-program state.
    assert sa["env_state"] == sb["env_state"] == "lanes"
    assert (np.load(final_a / "resume" / "last_obs.npy") == np.load(final_b / "resume" / "last_obs.npy")).all()
    assert (final_a / "resume" / "lanes.json").read_text() == (final_b / "resume" / "lanes.json").read_text()
    la, lb = np.load(final_a / "resume" / "lanes.npz"), np.load(final_b / "resume" / "lanes.npz")
    assert sorted(la) == sorted(lb) and all((la[k] == lb[k]).all() for k in la)
    # And so are the episode statistics of every update after the resume.
    ma, mb = _update_metrics(straight), _update_metrics(broken)
    assert [s for s in ma if s > 120] == [s for s in mb if s > 120] != []
    for step in (s for s in ma if s > 120):
        for name in ("train/episode/count", "train/episode/return/raw/mean", "train/episode/length/mean",
                     "train/algorithm/ppo/update/value_loss"):
            assert ma[step].get(name) == mb[step].get(name), (step, name)


def _update_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    """Per-update metrics by step (the last attempt's, for a resumed run)."""
    ob = Outbox(run_dir / "outbox.sqlite")
    try:
        events = ob.read(kind="metrics", limit=100_000)
    finally:
        ob.close()
    return {e.step: e.payload["metrics"] for e in events if "train/algorithm/ppo/update/count" in e.payload["metrics"]}


def _spec():
    return make_spec(CORRIDOR, {"id": "gradlab.ppo", "config": CONFIG}, timesteps=120, checkpoint_freq=60, seed=4,
                     policy_model={"net_arch": [16]})


@pytest.fixture(scope="module")
def middle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("run")
    run_learner(_spec(), run_dir, stop_at_step=60, watch_parent=False)
    return list_checkpoints(run_dir)[-1]


def _forge(src: Path, dest: Path, files: dict[str, bytes | None], *, manifest: bool = True) -> Path:
    """A copy of ``src`` with ``files`` replaced (None: removed), its manifest rewritten to agree unless not ``manifest``."""
    shutil.copytree(src, dest)
    body = json.loads((dest / "manifest.json").read_text())
    for name, data in files.items():
        if data is None:
            (dest / name).unlink()
            body["files"].pop(name)
            continue
        (dest / name).write_bytes(data)
        if manifest:
            body["files"][name] = {"sha256": file_sha256(dest / name), "size_bytes": len(data)}
    (dest / "manifest.json").write_text(json.dumps(body))
    return dest


def test_a_checkpoint_without_lane_state_still_resumes_with_new_episodes(middle: Path, tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    state = json.loads((middle / "resume" / "state.json").read_text())
    assert state["env_state"] == "lanes"
    state["env_state"] = "reset"  # what every gradlab.ppo checkpoint said before lane state was saved
    old = _forge(middle, tmp_path / "old" / middle.name, {
        "resume/state.json": json.dumps(state).encode(), "resume/lanes.json": None, "resume/lanes.npz": None,
        "resume/last_obs.npy": None})
    with caplog.at_level(logging.INFO, logger="gradlab.learn.learner"):
        result = run_learner(_spec(), tmp_path / "b", resume_from=old, watch_parent=False)
    assert (result.final_step, result.stop_reason) == (120, "budget")
    assert f"resumed from {old} at step 60 (lanes reset)" in caplog.text
    with caplog.at_level(logging.INFO, logger="gradlab.learn.learner"):
        run_learner(_spec(), tmp_path / "c", resume_from=middle, watch_parent=False)
    assert f"resumed from {middle} at step 60 (lanes continue)" in caplog.text


def test_a_changed_lane_state_file_is_refused_naming_the_file(middle: Path, tmp_path: Path) -> None:
    lanes_npz = (middle / "resume" / "lanes.npz").read_bytes()
    flipped = lanes_npz[:-9] + bytes([lanes_npz[-9] ^ 0xFF]) + lanes_npz[-8:]
    # Against the manifest: any changed byte.
    bad = _forge(middle, tmp_path / "a" / middle.name, {"resume/lanes.npz": flipped}, manifest=False)
    with pytest.raises(IntegrityError, match=re.escape(f"{bad / 'resume' / 'lanes.npz'}: sha256 expected")):
        run_learner(_spec(), tmp_path / "ra", resume_from=bad, watch_parent=False)
    # With a manifest rewritten to agree: the files themselves are checked before anything is assigned.
    bad = _forge(middle, tmp_path / "b" / middle.name, {"resume/lanes.npz": b"not an npz"})
    with pytest.raises(ContractViolation, match=re.escape(f"{bad / 'resume' / 'lanes.npz'}: not readable lane arrays")):
        run_learner(_spec(), tmp_path / "rb", resume_from=bad, watch_parent=False)
    wrong = io.BytesIO()
    np.save(wrong, np.zeros((3, 1), np.float32), allow_pickle=False)
    bad = _forge(middle, tmp_path / "c" / middle.name, {"resume/last_obs.npy": wrong.getvalue()})
    with pytest.raises(ContractViolation, match=re.escape(f"{bad / 'resume' / 'last_obs.npy'}: expected numeric "
                                                          "observations of shape (4, 1), found (3, 1) float32")):
        run_learner(_spec(), tmp_path / "rc", resume_from=bad, watch_parent=False)
