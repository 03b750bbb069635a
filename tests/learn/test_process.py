"""The learner as a process: stop request, SIGTERM and SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradlab.checkpoints import latest_checkpoint, list_checkpoints, verify_checkpoint
from gradlab.outbox import Outbox
from tests.learn.conftest import CARTPOLE, make_spec, write_spec

PPO = {"n_steps": 64, "batch_size": 256, "n_epochs": 1}  # 512 steps per rollout


def _start(tmp_path: Path, *, checkpoint_freq: int, timesteps: int = 10_000_000, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, Path]:
    spec = make_spec(CARTPOLE, {"id": "sb3.ppo", "config": PPO}, timesteps=timesteps, checkpoint_freq=checkpoint_freq)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "gradlab.learn", "--spec", str(write_spec(spec, tmp_path / "spec.json")),
                             "--run-dir", str(run_dir), "--log-level", "WARNING", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, run_dir


def _wait_for(run_dir: Path, kind: str, count: int, proc: subprocess.Popen, timeout_s: float = 60) -> Outbox:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run_dir / "outbox.sqlite").exists():
            ob = Outbox(run_dir / "outbox.sqlite")
            if ob.count(kind) >= count:
                return ob
            ob.close()
        if proc.poll() is not None:
            pytest.fail(f"learner exited early ({proc.returncode}): {proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"no {count} {kind} events within {timeout_s} s")


@pytest.mark.slow
def test_stop_request_is_observed_after_an_update(tmp_path: Path) -> None:
    proc, run_dir = _start(tmp_path, checkpoint_freq=1_000_000)
    ob = _wait_for(run_dir, "metrics", 2, proc)
    ob.request_stop("accepted:checkpoint")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    finished = ob.last("learner_finished")
    assert finished.payload["stop_reason"] == "stop_requested"
    step = finished.payload["final_step"]
    assert step % 512 == 0 and step >= 1024
    assert json.loads(out.strip().splitlines()[-1]) == {"final_step": step, "stop_reason": "stop_requested"}
    assert ob.last("stop_observed").payload == {"reason": "accepted:checkpoint"}
    kinds = [e.kind for e in ob.read(limit=100_000)]
    assert kinds[-3:] == ["metrics", "checkpoint_ready", "learner_finished"]
    ready = ob.last("checkpoint_ready").payload
    assert (ready["step"], ready["purpose"]) == (step, "final")
    assert verify_checkpoint(Path(ready["path"])).step == step


@pytest.mark.slow
def test_sigterm_writes_a_final_checkpoint_and_exits_0(tmp_path: Path) -> None:
    proc, run_dir = _start(tmp_path, checkpoint_freq=1_000_000)
    ob = _wait_for(run_dir, "metrics", 1, proc)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    finished = ob.last("learner_finished").payload
    assert finished["stop_reason"] == "sigterm"
    ready = ob.last("checkpoint_ready").payload
    assert ready["step"] == finished["final_step"] and ready["purpose"] == "final"
    assert verify_checkpoint(Path(ready["path"])).step == finished["final_step"]


@pytest.mark.slow
def test_sigkill_mid_rollout_leaves_outbox_and_last_checkpoint_intact(tmp_path: Path) -> None:
    proc, run_dir = _start(tmp_path, checkpoint_freq=1024)  # a checkpoint every second rollout
    ob = _wait_for(run_dir, "checkpoint_ready", 3, proc)
    ob.close()
    time.sleep(0.1)  # somewhere inside the next rollout
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    ob = Outbox(run_dir / "outbox.sqlite")
    assert ob._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    events = ob.read(limit=100_000)
    assert [e.event_seq for e in events] == list(range(1, len(events) + 1))
    assert "learner_finished" not in {e.kind for e in events}
    last = ob.last("checkpoint_ready").payload
    manifest = verify_checkpoint(Path(last["path"]))
    assert (manifest.step, manifest.sha256) == (last["step"], last["sha256"])
    assert last["step"] % 1024 == 0 and last["step"] >= 3072
    # Every announced checkpoint is complete; the newest complete one is at least the last announced.
    for e in events:
        if e.kind == "checkpoint_ready":
            verify_checkpoint(Path(e.payload["path"]))
    assert latest_checkpoint(run_dir) is not None
    assert list_checkpoints(run_dir)[-1].name >= Path(last["path"]).name
