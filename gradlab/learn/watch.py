"""Watching another process for its end without being its parent (Linux pidfd, else ``kill(pid, 0)``).

A learner stops with ``supervisor_lost`` once the process that supervises it is gone. That process
is not always its parent: a learner forked by the warm zygote (``gradlab.learn.zygote``) has the
zygote as parent. A pidfd (``os.pidfd_open``, Linux ≥ 5.3) names one process for good, so a
recycled pid is never mistaken for the supervisor, and it becomes readable when the process exits
(a zombie counts as gone).
"""

from __future__ import annotations

import os
import select


class ProcessWatch:
    """Is process ``pid`` still running? Cheap enough to ask once per rollout."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = None
        self._gone = False
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._gone = True  # already gone before we looked
        except (AttributeError, OSError):
            self._fd = None  # no pidfd here (old kernel, not Linux): fall back to kill(pid, 0)

    def alive(self) -> bool:
        """False once the process has exited (or could not be found when the watch began)."""
        if self._gone:
            return False
        if self._fd is not None:
            readable, _, _ = select.select([self._fd], [], [], 0)
            if readable:
                self._gone = True
                self.close()
            return not self._gone
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            self._gone = True
        except PermissionError:
            pass
        return not self._gone

    def wait(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` seconds or until the process exits; returns :meth:`alive`.

        With a pidfd the wait ends the moment the process exits; without one it sleeps out the timeout.
        """
        if self._fd is not None and not self._gone:
            select.select([self._fd], [], [], max(timeout_s, 0.0))
        elif not self._gone:
            import time

            time.sleep(max(timeout_s, 0.0))
        return self.alive()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists and has not exited (a zombie awaiting its parent has).

    ``kill(pid, 0)`` also answers for a zombie (someone else's exited child not yet reaped), so
    ``/proc/<pid>/stat`` decides where it exists.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


_PR_SET_PDEATHSIG = 1  # prctl(2), linux/prctl.h


def die_with_parent(sig: int, parent_pid: int | None = None) -> None:
    """Have the kernel send this process ``sig`` when its parent ends (Linux ``PR_SET_PDEATHSIG``);
    elsewhere a no-op. With ``parent_pid``, a parent that already ended before the call gets the
    same result at once (the signal is sent to this process now).

    For children that would outlive a parent killed with SIGKILL: the background server under the
    daemon, the evaluation spares forked by the warm flow (which also inherit the other ends of each
    other's pipes, so a closed pipe would never tell them).
    """
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))
    except (OSError, AttributeError):
        return
    if parent_pid is not None and os.getppid() != parent_pid:
        signal.raise_signal(sig)

