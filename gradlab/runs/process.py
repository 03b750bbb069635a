"""The learner child process: started in its own process group, stopped in three escalating steps.

Stop protocol (docs/ARCHITECTURE.md section 8): write ``stop_requested`` to the outbox (the learner reads it
after its current update), wait ``grace_s``; then SIGTERM (the learner finishes the update and
writes a final checkpoint), wait ``grace_s``; then SIGKILL the whole process group so no child
(vector-env workers) survives.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gradlab.learn.watch import pid_alive
from gradlab.runs.paths import RunPaths

log = logging.getLogger(__name__)

#: Learners this process started, by pid: a flow running in the same process (``gradlab train``)
#: attaches to its own child and gets its real exit status.
_CHILDREN: dict[int, subprocess.Popen] = {}


@dataclass
class LearnerProcess:
    """Handle on one learner process (``python -m gradlab.learn``)."""

    pid: int
    paths: RunPaths
    _popen: subprocess.Popen | None = field(default=None, repr=False)
    _code: int | None = field(default=None, repr=False)
    #: True when the warm zygote forked this learner (it is then not this process's child).
    forked: bool = False

    @classmethod
    def start(cls, paths: RunPaths, *, resume_from: Path | None = None, env: dict[str, str] | None = None,
              zygote: Path | None = None, await_supervisor: bool = False) -> LearnerProcess:
        """Start the learner on ``paths.spec`` in a new session (its own process group).

        Output goes to ``paths.learner_log`` (appended). With ``zygote`` (a zygote folder,
        ``gradlab.learn.zygote``) a ready zygote forks the learner with its imports already done
        (~5 s sooner to the first env step here); without one, or when none can serve, a new
        process is started. Either way the learner watches this process (``--parent-pid``). With
        ``await_supervisor`` it imports and builds its envs at once but takes its first step only
        once the attempt's supervisor loop watches its outbox (``--await-supervisor``,
        :func:`gradlab.learn.learner.run_learner`), so every checkpoint is supervised.

        Raises:
            FileNotFoundError: the spec file is missing.
        """
        if not paths.spec.is_file():
            raise FileNotFoundError(f"{paths.spec}: run spec missing")
        args = ["--spec", str(paths.spec), "--run-dir", str(paths.root), "--parent-pid", str(os.getpid())]
        if resume_from is not None:
            args += ["--resume-from", str(resume_from)]
        if await_supervisor:
            args.append("--await-supervisor")
        from gradlab.learn.zygote import launch_environ

        if zygote is not None:
            from gradlab.learn.zygote import fork_learner

            pid = fork_learner(zygote, args, log_path=paths.learner_log, env={**launch_environ(), **(env or {})},
                               exit_file=str(paths.root / "learner-{pid}.exit"))
            if pid is not None:
                log.info("learner forked by the zygote: pid %d, run dir %s", pid, paths.root)
                return cls(pid=pid, paths=paths, forked=True)
        cmd = [sys.executable, "-m", "gradlab.learn", *args]
        log_file = paths.learner_log.open("ab")
        try:
            popen = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env={**launch_environ(), **(env or {})})
        finally:
            log_file.close()
        log.info("learner started: pid %d, run dir %s", popen.pid, paths.root)
        _CHILDREN[popen.pid] = popen
        return cls(pid=popen.pid, paths=paths, _popen=popen)

    @classmethod
    def attach(cls, pid: int, paths: RunPaths) -> LearnerProcess:
        """A handle on a learner started earlier (by the CLI before the flow began, in this process
        or another one)."""
        return cls(pid=pid, paths=paths, _popen=_CHILDREN.get(pid))

    def exit_code(self) -> int | None:
        """The exit code once the process has ended, else None (negative: the signal that ended it).

        For a process that is not our child (forked by the zygote, or started by another process)
        the code is the one the zygote recorded in ``learner-<pid>.exit`` when it reaped it; without
        that record it is read from the outbox's ``learner_finished`` event: 0 when the learner
        finished cleanly, -1 when it vanished without one.
        """
        if self._popen is not None:
            return self._popen.poll()
        if self._code is not None:
            return self._code
        if pid_alive(self.pid):
            return None
        recorded = self.paths.root / f"learner-{self.pid}.exit"
        deadline = time.monotonic() + 1.0  # the zygote reaps its children every REAP_S (0.05 s)
        while True:
            try:
                self._code = int(recorded.read_text())
                return self._code
            except (OSError, ValueError):
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
        from gradlab.outbox import Outbox

        finished = [e for e in Outbox(self.paths.outbox).read(0, 1_000_000) if e.kind == "learner_finished"]
        self._code = 0 if finished else -1
        return self._code

    def alive(self) -> bool:
        return self.exit_code() is None

    def wait(self, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` seconds; the exit code, or None if still running."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.exit_code()
            if code is not None:
                return code
            time.sleep(0.05)
        return self.exit_code()

    def stop(self, reason: str, *, grace_s: float = 10.0, request: bool = True) -> int | None:
        """Stop the learner within ``grace_s`` seconds: stop request, then SIGTERM, then SIGKILL.

        The stop request gets the first half of the grace period (the learner stops after its
        current update and writes a final checkpoint), SIGTERM the second; then the whole process
        group is SIGKILLed, so no vector-env worker outlives the learner. ``request=False`` skips
        the outbox's stop request (a superseded attempt must not write the run's control state,
        which a newer attempt's learner reads): SIGTERM at once.

        Returns:
            The exit code (negative for a signal, as ``subprocess`` reports it), or None when an
            attached process could not be reaped.
        """
        from gradlab.outbox import Outbox

        if self.exit_code() is None:
            if not request:
                self._signal_group(signal.SIGTERM)
            else:
                try:
                    Outbox(self.paths.outbox).request_stop(reason)
                except OSError as e:  # a full disk: SIGTERM asks for the same stop
                    log.warning("learner %d: stop request not written (%s): SIGTERM", self.pid, e)
                    self._signal_group(signal.SIGTERM)
            if self.wait(grace_s / 2) is None:
                log.warning("learner %d did not stop within %.1f s of the request: SIGTERM", self.pid, grace_s / 2)
                self._signal_group(signal.SIGTERM)
                if self.wait(grace_s / 2) is None:
                    log.warning("learner %d ignored SIGTERM: SIGKILL of its process group", self.pid)
        self.kill()
        return self.exit_code()

    def kill(self) -> None:
        """SIGKILL the learner's whole process group at once."""
        self._signal_group(signal.SIGKILL)
        self.wait(5.0)

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

