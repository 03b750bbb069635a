"""A learner whose supervising process dies stops by itself (``supervisor_lost``) instead of training on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradlab.checkpoints import verify_checkpoint
from gradlab.outbox import Outbox

RUN_ID = "gradlab-20260101T000000-5up3rv15"

# The intermediate "supervisor": starts the learner in its own session (as the flow does), prints the
# learner's pid, then waits until it is killed or until it reads "exit" on stdin.
SUPERVISOR = """
import subprocess, sys
spec, run_dir, log = sys.argv[1:4]
with open(log, "w") as out:
    p = subprocess.Popen([sys.executable, "-m", "gradlab.learn", "--spec", spec, "--run-dir", run_dir,
                          "--log-level", "INFO"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
print(p.pid, flush=True)
sys.stdin.readline()
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie has exited (re-parented to an init that has not reaped it yet)


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail(f"{what} within {timeout_s} s")


def _count(run_dir: Path, kind: str) -> int:
    if not (run_dir / "outbox.sqlite").exists():
        return 0
    ob = Outbox(run_dir / "outbox.sqlite")
    try:
        return ob.count(kind)
    finally:
        ob.close()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigkill", "exit"])
def test_learner_stops_when_its_supervisor_is_gone(how: str, tmp_path: Path) -> None:
    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec

    # 100M steps would take hours: only the supervisor check can end this run in seconds.
    resolved = Experiments().resolve("gradlab__bandit/ppo", ["train.timesteps=100000000"])
    spec = RunSpec.from_resolved(resolved, seed=0, run_id=RUN_ID)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec.to_json()))
    run_dir, log = tmp_path / "run", tmp_path / "learner.log"
    sup = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(spec_path), str(run_dir), str(log)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    learner_pid = int(sup.stdout.readline())  # type: ignore[union-attr]
    try:
        _wait(lambda: _count(run_dir, "metrics") >= 2 or not _alive(learner_pid), 120, "no training")
        assert _alive(learner_pid), log.read_text()[-3000:]
        assert _count(run_dir, "learner_finished") == 0
        if how == "sigkill":
            os.kill(sup.pid, signal.SIGKILL)
        else:
            sup.stdin.write("exit\n")  # type: ignore[union-attr]
            sup.stdin.flush()  # type: ignore[union-attr]
        sup.wait(timeout=10)
        gone_at = time.monotonic()
        _wait(lambda: not _alive(learner_pid), 15, "the orphaned learner did not exit")
        elapsed = time.monotonic() - gone_at
    finally:
        if _alive(learner_pid):
            os.kill(learner_pid, signal.SIGKILL)
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    assert elapsed < 15
    ob = Outbox(run_dir / "outbox.sqlite")
    finished = ob.last("learner_finished").payload
    assert finished["stop_reason"] == "supervisor_lost", log.read_text()[-3000:]
    assert ob.last("stop_observed").payload == {"reason": "supervisor_lost"}
    # Stopped as for SIGTERM: a final checkpoint at the last update, announced before learner_finished.
    step = finished["final_step"]
    assert step % 512 == 0 and 1024 <= step < 100_000_000  # 8 lanes x 64 steps per rollout
    kinds = [e.kind for e in ob.read(limit=100_000)]
    assert kinds[-3:] == ["metrics", "checkpoint_ready", "learner_finished"]
    ready = ob.last("checkpoint_ready").payload
    assert (ready["step"], ready["purpose"]) == (step, "final")
    assert verify_checkpoint(Path(ready["path"])).step == step
    assert json.loads(log.read_text().strip().splitlines()[-1]) == {"final_step": step, "stop_reason": "supervisor_lost"}
