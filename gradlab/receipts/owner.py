"""Who holds a lease: host boot id + PID namespace + pid + process start time.

A pid alone cannot name a process: after a restart the same pid (a container's PID 1) belongs to
another process, and a pid means something only inside its PID namespace (two containers on one
kernel both have a PID 1; a process in one cannot see the other's). Linux gives each boot a random
id (``/proc/sys/kernel/random/boot_id``, shared by every container on the kernel), each PID
namespace an inode (``/proc/self/ns/pid``, ``pid:[4026531836]``) and each process its start time in
clock ticks since boot (``/proc/<pid>/stat`` field 22). Together they name one process for as long
as it lives (docs/ARCHITECTURE.md section 9).

:func:`owner_state` answers for a lease's owner from *this* process's view:

* ``alive``: same boot and PID namespace, the pid exists (not a zombie) with the recorded start time;
* ``dead``: same boot and PID namespace, and the pid is gone or now belongs to a process started
  at another time;
* ``unknown``: another boot, machine or PID namespace (or an owner recorded without these
  fields): a missing pid proves nothing there, only the lease's expiry can tell.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
PID_NAMESPACE_LINK = Path("/proc/self/ns/pid")

OwnerState = Literal["alive", "dead", "unknown"]


@dataclass(frozen=True)
class OwnerId:
    """One process: ``host`` (name, for people), ``boot_id``, ``pid_namespace`` (``pid:[<inode>]``),
    ``pid``, ``start`` (clock ticks since boot)."""

    host: str
    boot_id: str | None
    pid: int
    start: int | None
    pid_namespace: str | None = None

    def label(self) -> str:
        """``<host>:<pid>``, as leases have always shown their owner."""
        return f"{self.host}:{self.pid}"


def boot_id() -> str | None:
    """This kernel's boot id, or None where there is none (not Linux)."""
    try:
        return BOOT_ID_FILE.read_text().strip() or None
    except OSError:
        return None


def pid_namespace() -> str | None:
    """This process's PID namespace, ``pid:[<inode>]`` (the ``/proc/self/ns/pid`` link), or None
    where there is none (not Linux)."""
    try:
        return os.readlink(PID_NAMESPACE_LINK) or None
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
    return OwnerId(host=socket.gethostname(), boot_id=boot_id(), pid=pid, start=process_start(pid),
                   pid_namespace=pid_namespace())


def owner_state(owner_boot_id: str | None, pid: int | None, start: int | None,
                owner_pid_namespace: str | None = None) -> OwnerState:
    """Whether the recorded owner still runs, judged from this process's view (see the module docstring).

    Only a checker on the owner's boot *and* PID namespace can see its pid; anywhere else (or for an
    owner recorded without its namespace) the answer is ``unknown`` and the lease's expiry decides.
    """
    if owner_boot_id is None or pid is None or start is None or owner_pid_namespace is None:
        return "unknown"
    here = boot_id()
    if here is None or here != owner_boot_id or pid_namespace() != owner_pid_namespace:
        return "unknown"
    return "alive" if process_start(pid) == start else "dead"
