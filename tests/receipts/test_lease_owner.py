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


def _lease_from_another_namespace(stores: Stores, *, ttl_s: float) -> None:
    """attempt-001's lease, rewritten as if a process in another PID namespace held it for ``ttl_s``."""
    open_run(stores, _spec())
    _, held = begin_attempt(stores, RUN, mode="fresh")
    at = utcnow()
    lease = held.lease.model_copy(update={"owner": "host-a:7", "owner_pid": 7, "owner_start": 123,
                                          "owner_pid_namespace": "pid:[1]", "heartbeat_at": at, "ttl_s": ttl_s,
                                          "expires_at": at + timedelta(seconds=ttl_s)})
    stores.control.put_if_match(keys.lease(RUN), dump_model(lease), held.etag)


def test_a_lease_held_from_another_namespace_is_waited_out_then_the_attempt_opens(stores: Stores) -> None:
    from gradlab.receipts.lease import wait_out_lease

    _lease_from_another_namespace(stores, ttl_s=3)
    lease = read_lease(stores.control, RUN).lease
    assert lease.owner_state() == "unknown" and lease.in_force()
    with pytest.raises(LeaseHeld):  # what the open did before: refused for up to a TTL
        begin_attempt(stores, RUN, mode="fresh")
    wait_out_lease(stores.control, RUN)
    assert utcnow() >= lease.expires_at  # returned once it expired, not before
    attempt, held = begin_attempt(stores, RUN, mode="fresh")
    assert (attempt.attempt_id, held.lease.generation) == ("attempt-002", 2)


def test_a_lease_renewed_while_waited_out_is_refused(stores: Stores) -> None:
    import threading

    from gradlab.receipts.lease import renew_lease, wait_out_lease

    _lease_from_another_namespace(stores, ttl_s=3)
    held = read_lease(stores.control, RUN)
    renewer = threading.Timer(1.0, lambda: renew_lease(stores.control, held, ttl_s=60))
    renewer.start()
    try:
        with pytest.raises(LeaseHeld, match="renewed while it was waited out: its owner lives elsewhere"):
            wait_out_lease(stores.control, RUN)
    finally:
        renewer.join()
    assert read_lease(stores.control, RUN).lease.generation == 1  # nothing taken


def test_a_live_owner_on_this_host_is_not_waited_for(stores: Stores, other_process: subprocess.Popen) -> None:
    from gradlab.receipts.lease import wait_out_lease

    _lease_held_by(stores, pid=other_process.pid, start=process_start(other_process.pid))  # 60 s left
    started = utcnow()
    with pytest.raises(LeaseHeld, match=f"whose process {socket.gethostname()}:{other_process.pid} still runs"):
        wait_out_lease(stores.control, RUN)
    assert utcnow() - started < timedelta(seconds=30)  # refused at once, not after the lease's minute
