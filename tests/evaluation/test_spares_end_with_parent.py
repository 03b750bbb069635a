"""Forked evaluation spares end with the process that forked them, even when it is SIGKILLed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

from tests.runs.conftest import pid_alive, wait_for

FORK_SPARES = """
import sys
from gradlab.evaluation import backends
backends.prewarm(2, start_method="fork")
print(" ".join(str(p.pid) for p, _ in backends._SPARES), flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def _forked_spares() -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """A process that forked two spares (it waits on its stdin), and their pids; all killed afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", FORK_SPARES], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    spares: list[int] = []
    try:
        spares = [int(p) for p in proc.stdout.readline().split()]
        assert len(spares) == 2 and all(pid_alive(p) for p in spares)
        yield proc, spares
    finally:
        proc.kill()
        for pid in spares:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_forked_spares_end_when_their_parent_is_killed() -> None:
    """The warm flow's child forks its spares; each inherits the other ends of the spares' pipes, so
    only the kernel's parent-death signal ends a spare whose parent was SIGKILLed."""
    with _forked_spares() as (proc, spares):
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        wait_for(lambda: not any(pid_alive(p) for p in spares), 60, "the forked spares to end with their parent")


def test_a_process_whose_spare_is_stopped_still_exits() -> None:
    """multiprocessing's exit hook would SIGTERM and join a SIGSTOPped spare forever; ours kills it first."""
    with _forked_spares() as (proc, spares):
        for pid in spares:
            os.kill(pid, signal.SIGSTOP)
        proc.stdin.close()  # the script ends: the interpreter's exit hooks run
        assert proc.wait(timeout=60) == 0
        wait_for(lambda: not any(pid_alive(p) for p in spares), 60, "the stopped spares to be gone")
