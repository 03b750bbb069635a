"""Who holds a lease: host boot id + pid + process start time, so a recycled pid is not the owner.

A pid alone cannot name a process: after a restart the same pid (a container's PID 1) belongs to
another process. Linux gives each boot a random id (``/proc/sys/kernel/random/boot_id``, shared
by every container on the kernel) and each process its start time in clock ticks since boot
(``/proc/<pid>/stat`` field 22). Together they name one process for as long as it lives
(docs/ARCHITECTURE.md section 9).

:func:`owner_state` answers for a lease's owner from *this* host:

* ``alive``: same boot, the pid exists (not a zombie) with the recorded start time;
* ``dead``: same boot, and the pid is gone or now belongs to a process started at another time;
* ``unknown``: another boot or another machine (or an owner recorded without these fields):
  only the lease's expiry can tell.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")

OwnerState = Literal["alive", "dead", "unknown"]


@dataclass(frozen=True)
class OwnerId:
    """One process: ``host`` (name, for people), ``boot_id``, ``pid``, ``start`` (clock ticks since boot)."""

    host: str
    boot_id: str | None
    pid: int
    start: int | None

    def label(self) -> str:
        """``<host>:<pid>``, as leases have always shown their owner."""
        return f"{self.host}:{self.pid}"


def boot_id() -> str | None:
    """This kernel's boot id, or None where there is none (not Linux)."""
    try:
        return BOOT_ID_FILE.read_text().strip() or None
    except OSError:
        return None


def process_start(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None when it does not exist (or is a zombie).

    Field 22 of ``/proc/<pid>/stat`` (proc(5)); the command name (field 2) may hold spaces and
    parentheses, so fields are counted after its last ``)``.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[-1].split()
    except OSError:
        return None
    if not rest or rest[0] in ("Z", "X"):
        return None
    return int(rest[19])


def current_owner() -> OwnerId:
    """This process's identity."""
    pid = os.getpid()
    return OwnerId(host=socket.gethostname(), boot_id=boot_id(), pid=pid, start=process_start(pid))


def owner_state(owner_boot_id: str | None, pid: int | None, start: int | None) -> OwnerState:
    """Whether the recorded owner still runs, judged from this host (see the module docstring)."""
    if owner_boot_id is None or pid is None or start is None:
        return "unknown"
    here = boot_id()
    if here is None or here != owner_boot_id:
        return "unknown"
    return "alive" if process_start(pid) == start else "dead"
