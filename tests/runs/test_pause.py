"""A run paused past its lease (a laptop lid closing: SIGSTOP to every process of the run, then
SIGCONT) goes on and seals its receipt truthfully; one whose lease a newer attempt took meanwhile
stops its learner, writes nothing more and says it was superseded (docs/ARCHITECTURE.md sections 8
and 9).

The run is handed to the session server's warm flow (``gradlab.cli.warm_flow``), as a user's
``gradlab train`` with the background server is: the command, the warm flow's child (its own
session, with its evaluation workers) and the learner (its own session) are stopped; the Prefect
server is not.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from gradlab.learn.zygote import flow_zygote_dir, ready_zygotes
from gradlab.outbox import Outbox
from tests.runs.conftest import (
    gradlab_env,
    last_json_line,
    pid_alive,
    resume,
    start_gradlab,
    stop_outside_a_write,
    wait_for,
)

#: Seconds the run's processes stay stopped: longer than the lease TTL the test gives the run and
#: than the keep-alive and ping timeouts of the connections the flow holds.
PAUSE_S = 60.0
LEASE_TTL_S = "10"


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, session id) of ``pid``, or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[3])


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _warm_children(home: Path) -> list[int]:
    """The warm flow zygote's live children that run a handed-over command (each leads a session of
    its own; the zygote's resource tracker does not)."""
    zygotes = {z.pid for z in ready_zygotes(flow_zygote_dir(home))}
    return [pid for pid in _pids() if (stat := _proc_stat(pid)) and stat[0] in zygotes and stat[1] == pid]


def _run_processes(command: int, sessions: set[int]) -> list[int]:
    """The command and every process of the given sessions."""
    return [command] + [pid for pid in _pids() if pid != command and (stat := _proc_stat(pid)) and stat[1] in sessions]


def _training(run_dir: Path) -> int | None:
    """The learner's pid once it has reported metrics, else None."""
    try:
        box = Outbox(run_dir / "outbox.sqlite", readonly=True)
        started = box.last("learner_started")
        if started is None or not any(e.kind == "metrics" for e in box.read(0, 200)):
            return None
        return int(started.payload["pid"])
    except Exception:  # noqa: BLE001 - not created yet
        return None


def _paused_run(home: Path, api: str, during: Callable[[Path], None]) -> tuple[subprocess.Popen[str], Path, int, str,
                                                                              str]:
    """Start ``gradlab train`` (handed to the warm flow), stop every process of the run once it is
    training, keep them stopped for :data:`PAUSE_S` seconds, call ``during(run_dir)`` while they
    still are, resume them. Returns (the command, its run directory, the learner's pid, stdout, stderr)."""
    wait_for(lambda: ready_zygotes(flow_zygote_dir(home)), 300, "the warm flow ready")
    env = gradlab_env(api, GRADLAB_HOME=str(home), GRADLAB_DAEMON="1", GRADLAB_LEASE_TTL_S=LEASE_TTL_S)
    runs = home / "runs"
    before = {p.name for p in runs.iterdir()} if runs.is_dir() else set()
    proc = start_gradlab(["train", "gradlab__bandit/ppo", "--no-eval", "--set", "train.timesteps=65536", "--json"],
                         env)
    stopped: list[int] = []
    try:
        run_dir = wait_for(lambda: next((p for p in runs.iterdir() if p.name not in before), None)
                           if runs.is_dir() else None, 120, "the run's folder")
        learner = wait_for(lambda: _training(run_dir), 180, "the learner training")
        children = _warm_children(home)
        assert len(children) == 1, f"expected the run handed to the warm flow, found children {children}"
        stopped = _run_processes(proc.pid, {children[0], learner})
        assert learner in stopped and children[0] in stopped
        stop_outside_a_write(stopped, run_dir / "outbox.sqlite")
        time.sleep(PAUSE_S)  # the deliberate pause
        during(run_dir)
        resume(stopped)
        stopped = []
        out, err = proc.communicate(timeout=300)
    finally:
        resume(stopped)
        if proc.poll() is None:
            proc.kill()
    return proc, run_dir, learner, out, err


def _lease(run_id: str):
    from gradlab.receipts.lease import read_lease
    from gradlab.stores import open_stores

    return read_lease(open_stores().control, run_id).lease


@pytest.mark.slow
def test_a_run_paused_past_its_lease_goes_on_and_seals_its_receipt(prefect_server: tuple[str, Path, int],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    api, home, _ = prefect_server
    monkeypatch.setenv("GRADLAB_HOME", str(home))  # this process reads the run's stores
    expired: list[bool] = []
    proc, run_dir, _, out, err = _paused_run(home, api, lambda d: expired.append(not _lease(d.name).is_live()))
    assert expired == [True]  # paused past its lease, which nobody took meanwhile
    receipt = last_json_line(out) if out.strip() else None
    assert receipt is not None, f"no receipt; exit {proc.returncode}; stderr: {err[-4000:]}"
    assert (receipt["run_id"], receipt["attempt_id"], receipt["epoch"]) == (run_dir.name, "attempt-001", 1)
    assert receipt["outcome"] == "succeeded", (receipt["reason"], err[-4000:])
    assert receipt["final_step"] == 65536 and receipt["superseded_by"] is None
    assert proc.returncode == 0, err[-4000:]
    lease = _lease(run_dir.name)
    assert (lease.holder, lease.generation, lease.released) == ("attempt-001", 1, True)  # renewed, then released


@pytest.mark.slow
def test_a_run_paused_while_a_newer_attempt_opened_stops_and_says_it_was_superseded(
        prefect_server: tuple[str, Path, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The newer attempt opens from "another host" (its boot id differs, so the paused owner's
    liveness is unknown there and its expired lease is taken over)."""
    from gradlab import receipts as rules
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.receipts import owner
    from gradlab.receipts.lease import release_lease
    from gradlab.receipts.models import utcnow
    from gradlab.receipts.terminal import read_terminal
    from gradlab.runs import operations
    from gradlab.runs.paths import RunPaths
    from gradlab.stores import open_stores

    api, home, _ = prefect_server
    monkeypatch.setenv("GRADLAB_HOME", str(home))
    stores = open_stores()
    opened: dict = {}

    def open_a_newer_attempt(run_dir: Path) -> None:
        paths = RunPaths(run_dir)
        spec = RunSpec.model_validate_json(paths.spec.read_text())
        with monkeypatch.context() as m:
            m.setattr(owner, "boot_id", lambda: "another-host")
            opened["plan"] = operations.open_attempt(stores, spec, paths)
        opened["sealed"] = read_terminal(stores, spec.run_id, "attempt-001")
        opened["published"] = {(p.step, p.sha256) for p in rules.list_publications(stores, spec.run_id)}
        opened["at"] = utcnow()

    proc, run_dir, learner, out, err = _paused_run(home, api, open_a_newer_attempt)
    plan = opened["plan"]
    try:
        assert plan.fence == ("attempt-002", 2)
        assert opened["sealed"] is not None and opened["sealed"].outcome == "superseded"
        receipt = last_json_line(out) if out.strip() else None
        assert receipt is not None, f"no receipt; exit {proc.returncode}; stderr: {err[-4000:]}"
        assert (receipt["attempt_id"], receipt["outcome"]) == ("attempt-001", "superseded"), err[-4000:]
        assert receipt["superseded_by"]["attempt_id"] == "attempt-002" and receipt["superseded_by"]["epoch"] == 2
        assert proc.returncode == 1, err[-4000:]
        assert "attempt-001 was superseded" in " ".join(err.split()), err[-4000:]
        wait_for(lambda: not pid_alive(learner), 15, "the superseded learner gone")
        # It wrote nothing more: the receipt its successor sealed, the lease and the publications stand.
        assert read_terminal(stores, run_dir.name, "attempt-001") == opened["sealed"]
        # Except what the store cannot fence (docs/ARCHITECTURE.md section 8): a publication paused
        # after its last lease check still lands. Only such: made before the pause, at epoch 1, and
        # its bytes verify.
        late = [p for p in rules.list_publications(stores, run_dir.name) if (p.step, p.sha256) not in opened["published"]]
        for p in late:
            assert (p.attempt_id, p.epoch) == ("attempt-001", 1)
            assert p.published_at < opened["at"] - timedelta(seconds=PAUSE_S), (p.published_at, opened["at"])
            rules.verify_published(stores, p)
        lease = _lease(run_dir.name)
        assert (lease.holder, lease.generation, lease.released) == ("attempt-002", 2, False)
    finally:
        release_lease(stores.control, plan.lease)
