"""Lease owners are named by boot id + pid + start time (issue: run integrity), on both store backends."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta

import pytest

from gradlab.errors import GradlabError
from gradlab.receipts import begin_attempt, open_run, read_lease
from gradlab.receipts.io import dump_model
from gradlab.receipts.lease import LeaseHeld
from gradlab.receipts.models import utcnow
from gradlab.receipts.owner import boot_id, process_start
from gradlab.stores import Stores, keys
from tests.receipts.test_receipts import RUN, _spec


@pytest.fixture
def other_process() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _lease_held_by(stores: Stores, *, pid: int, start: int | None, expired: bool = False) -> None:
    """attempt-001's lease (60 s), rewritten as if another process on this host had taken it."""
    open_run(stores, _spec())
    _, held = begin_attempt(stores, RUN, mode="fresh")
    at = utcnow() - (timedelta(seconds=120) if expired else timedelta(0))
    lease = held.lease.model_copy(update={"owner": f"{socket.gethostname()}:{pid}", "owner_pid": pid,
                                          "owner_start": start, "owner_boot_id": boot_id(), "heartbeat_at": at,
                                          "expires_at": at + timedelta(seconds=60)})
    stores.control.put_if_match(keys.lease(RUN), dump_model(lease), held.etag)


def _refused_by_cli(stores: Stores) -> str | None:
    from typer import Exit

    from gradlab.cli.runs_cmds import _refuse_if_owner_alive

    try:
        _refuse_if_owner_alive(read_lease(stores.control, RUN), RUN)
    except (Exit, GradlabError) as e:
        return str(e) or "refused"
    return None


def test_a_recycled_owner_pid_does_not_block(stores: Stores, other_process: subprocess.Popen) -> None:
    # The pid exists (another process got it) but started at another time: the owner is gone.
    _lease_held_by(stores, pid=other_process.pid, start=process_start(other_process.pid) - 7, expired=True)
    assert read_lease(stores.control, RUN).lease.owner_state() == "dead"
    assert _refused_by_cli(stores) is None
    attempt, held = begin_attempt(stores, RUN, mode="fresh")
    assert (attempt.attempt_id, held.lease.generation) == ("attempt-002", 2)


def test_a_dead_owner_on_this_host_does_not_wait_out_the_lease(stores: Stores) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start(proc.pid)
    proc.wait()
    _lease_held_by(stores, pid=proc.pid, start=start)  # unexpired: 60 s left
    assert read_lease(stores.control, RUN).lease.is_live()
    attempt, held = begin_attempt(stores, RUN, mode="fresh")  # at once, no 60 s wait
    assert (attempt.attempt_id, held.lease.generation) == ("attempt-002", 2)
    assert held.lease.owner_pid is not None and held.lease.owner_start == process_start(held.lease.owner_pid)


def test_a_live_owner_elsewhere_on_this_host_is_refused_even_after_expiry(stores: Stores,
                                                                         other_process: subprocess.Popen) -> None:
    """A paused holder (SIGSTOP, a frozen VM) whose lease expired still runs: every path refuses it."""
    _lease_held_by(stores, pid=other_process.pid, start=process_start(other_process.pid), expired=True)
    assert not read_lease(stores.control, RUN).lease.is_live()
    with pytest.raises(LeaseHeld, match=f"{socket.gethostname()}:{other_process.pid} still runs on this host"):
        begin_attempt(stores, RUN, mode="fresh")  # the deployment path (no CLI check in front)
    assert _refused_by_cli(stores) is not None
