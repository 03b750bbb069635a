"""Evaluation backends behind one interface: ``submit(request) -> handle``, ``poll``, ``cancel``.

* ``local`` (default): each evaluation runs :func:`gradlab.evaluation.runner.run_evaluation_json` in
  its own spawned process; at most ``max_workers`` run at once (default: the cores left over by
  training, ``os.cpu_count() - reserved_cores``, at least 1); queued ones start as slots free up on
  the next ``submit``/``poll``. ``cancel`` drops a queued evaluation or terminates a running one.
  :func:`prewarm` keeps spare worker processes that have already imported torch, SB3 and
  gymnasium (3–8 s here), so an evaluation starts at once; a supervisor calls it when a run begins.
* ``modal``: a deployed Modal function (:mod:`gradlab.evaluation.modal`: its payload, client and
  backend).

Both return :class:`EvalResult`; a result whose JSON is malformed or that answers a different
checkpoint is refused with ``ContractViolation``.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from gradlab import errors
from gradlab.errors import ConfigError, ContractViolation, GradlabError
from gradlab.evaluation.backend_api import (
    BackendUnavailable,
    EvalHandle,
    EvaluationBackend,
    EvaluationFailed,
    check_answer,
)
from gradlab.evaluation.result import EvalRequest, EvalResult

logger = logging.getLogger(__name__)


def _rebuild_error(kind: str, message: str) -> GradlabError:
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, GradlabError) and cls is not errors.ConfigError:
        try:
            return cls(message)
        except TypeError:
            pass
    if kind == "ConfigError":
        return ConfigError(message)
    return EvaluationFailed(f"{kind}: {message}")


# ----------------------------------------------------------------------------------------- local


#: The worker job that evaluates a checkpoint (``module:function``, JSON in and out).
EVALUATE_ENTRY = "gradlab.evaluation.runner:run_evaluation_json"


def _entry_function(entry: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The ``module:function`` a worker job names; only gradlab's own modules."""
    import importlib

    module, _, name = entry.partition(":")
    if not module.startswith("gradlab.") or not name:
        raise ContractViolation(f"worker job {entry!r}: expected 'gradlab.<module>:<function>'")
    return getattr(importlib.import_module(module), name)


def _worker_main(request_json: dict[str, Any], conn: Any, entry: str = EVALUATE_ENTRY) -> None:
    """Child process: run ``entry`` on the request and send ``("ok", answer_json)`` or ``("error", kind, message)``."""
    try:
        if entry == EVALUATE_ENTRY:  # other jobs import torch only when they need it, and set its threads then
            try:
                import torch

                torch.set_num_threads(1)
            except ImportError:  # pragma: no cover - torch is a dependency
                pass
        conn.send(("ok", _entry_function(entry)(request_json)))
    except BaseException as e:  # noqa: BLE001 - every failure must reach the parent
        conn.send(("error", type(e).__name__, str(e)))
    finally:
        conn.close()


_SPARE_LOCK = threading.Lock()
_SPARES: list[tuple[Any, Any]] = []
_SPARE_TARGET = 0
#: Whether a spare taken by an evaluation is replaced at once (spawned): not after forked spares,
#: whose replacement would import for seconds beside the run it is meant to speed up.
_SPARE_REFILL = True


def _warm_worker_main(conn: Any, parent_pid: int | None = None) -> None:
    """Spare child process: import the heavy libraries now, then evaluate the request it is sent.
    Given ``parent_pid`` (a forked spare), it ends with its parent, SIGKILL included: it inherits the
    other ends of the spares' pipes, so a closed pipe would never tell it."""
    if parent_pid is not None:
        from gradlab.learn.watch import die_with_parent

        die_with_parent(signal.SIGKILL, parent_pid)
    try:
        import gymnasium  # noqa: F401
        import stable_baselines3.common.policies  # noqa: F401
        import torch

        import gradlab.evaluation.runner  # noqa: F401

        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover - all are dependencies
        pass
    try:
        entry, request_json = conn.recv()
    except (EOFError, OSError):
        return  # the parent went away or closed the spare
    _worker_main(request_json, conn, entry)


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """Start processes with SIGINT blocked: they inherit the mask, so a Ctrl-C in the terminal (sent
    to the whole foreground process group) reaches only the supervisor, which cancels the run and
    ends its evaluations itself."""
    from multiprocessing import resource_tracker

    # Started first: starting it unblocks SIGINT in this thread (multiprocessing.resource_tracker).
    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def prewarm(count: int = 1, *, start_method: str = "spawn") -> None:
    """Keep ``count`` spare evaluation processes warm (started now; they import in the background).

    ``start_method="fork"`` is for a process that has torch, SB3 and the evaluation runner imported
    and no thread but its main one (the warm flow's child, ``gradlab.cli.warm_flow``): the spares
    are ready at once, and one taken is not replaced (an evaluation with no spare left starts its
    own process, as without spares).
    """
    global _SPARE_TARGET, _SPARE_REFILL, _SPARES_KILLED_AT_EXIT
    if start_method == "fork":
        _SPARE_REFILL = False
    ctx = multiprocessing.get_context(start_method)
    with _SPARE_LOCK:
        _SPARE_TARGET = max(_SPARE_TARGET, count)
        _SPARES[:] = [(p, c) for p, c in _SPARES if p.is_alive()]
        while len(_SPARES) < _SPARE_TARGET:
            parent, child = ctx.Pipe(duplex=True)
            # A forked spare (forked by the warm flow's main thread, before any other thread) ends
            # with its parent: the kernel's parent-death signal follows the forking thread.
            process = ctx.Process(target=_warm_worker_main, args=(child, os.getpid() if start_method == "fork" else None),
                                  daemon=True, name="gradlab-eval-spare")
            with _sigint_blocked():
                process.start()
            child.close()
            _SPARES.append((process, parent))
    if not _SPARES_KILLED_AT_EXIT:  # after a start: before multiprocessing's exit hook (exit hooks run last first)
        atexit.register(_kill_spares)
        _SPARES_KILLED_AT_EXIT = True


_SPARES_KILLED_AT_EXIT = False


def _kill_spares() -> None:
    """At exit, SIGKILL the idle spares left. multiprocessing's own exit hook sends them SIGTERM and
    joins them, which never returns for a stopped (SIGSTOP) spare: the command would not exit."""
    with _SPARE_LOCK:
        for process, conn in _SPARES:
            if process.is_alive():
                process.kill()
                process.join(5)
            conn.close()
        _SPARES.clear()


def _take_spare() -> tuple[Any, Any] | None:
    with _SPARE_LOCK:
        while _SPARES:
            process, conn = _SPARES.pop(0)
            if process.is_alive():
                return process, conn
            conn.close()
    return None


class _Job:
    def __init__(self, handle: EvalHandle, request_json: dict[str, Any], entry: str = EVALUATE_ENTRY):
        self.handle = handle
        self.request_json = request_json
        self.entry = entry
        self.process: Any = None
        self.conn: Any = None
        self.answer: tuple | None = None


class LocalBackend:
    """Process-per-evaluation pool on the machine's spare cores (see the module docstring).

    Args:
        max_workers: evaluations running at once; None = ``max(1, cpu_count - reserved_cores)``.
        reserved_cores: cores left to training when ``max_workers`` is None.
    """

    name = "local"

    def __init__(self, max_workers: int | None = None, *, reserved_cores: int = 1):
        self.max_workers = max_workers or max(1, (os.cpu_count() or 1) - reserved_cores)
        self._ctx = multiprocessing.get_context("spawn")
        self._jobs: dict[str, _Job] = {}
        self._queue: list[str] = []
        self._ids = itertools.count(1)

    def submit(self, request: EvalRequest) -> EvalHandle:
        return self.submit_job(EVALUATE_ENTRY, request.as_json(), checkpoint_sha256=request.checkpoint_sha256,
                               checkpoint_step=request.checkpoint_step)

    def submit_job(self, entry: str, payload: dict[str, Any], *, checkpoint_sha256: str,
                   checkpoint_step: int) -> EvalHandle:
        """Queue another job for the same workers: ``entry`` (``gradlab.<module>:<function>``, JSON in and
        out) on ``payload``; collect its answer with :meth:`poll_json`. ``gradlab dataset record``
        runs its chunks so."""
        handle = EvalHandle(backend=self.name, id=f"local-{os.getpid()}-{next(self._ids)}",
                            checkpoint_sha256=checkpoint_sha256, checkpoint_step=checkpoint_step)
        self._jobs[handle.id] = _Job(handle, payload, entry)
        self._queue.append(handle.id)
        self._start_queued()
        return handle

    def _running(self) -> int:
        return sum(1 for j in self._jobs.values() if j.process is not None and j.answer is None)

    @staticmethod
    def _collect(job: _Job) -> None:
        """Store the worker's answer when it has one (frees its slot); never blocks."""
        if job.answer is not None or job.process is None:
            return
        if job.conn.poll():
            try:
                job.answer = job.conn.recv()
            except EOFError:
                job.answer = ("error", "EvaluationFailed", "worker closed its pipe without an answer")
            job.process.join()
        elif not job.process.is_alive():
            job.answer = ("error", "EvaluationFailed",
                          f"evaluation worker exited with code {job.process.exitcode} without an answer")

    def _start_queued(self) -> None:
        for job in self._jobs.values():
            self._collect(job)
        while self._queue and self._running() < self.max_workers:
            job = self._jobs[self._queue.pop(0)]
            spare = _take_spare()
            if spare is not None:
                job.process, job.conn = spare
                job.conn.send((job.entry, job.request_json))
                logger.info("evaluation %s started in a warm process (pid %s)", job.handle.id, job.process.pid)
                if _SPARE_REFILL:
                    prewarm(_SPARE_TARGET)  # replace the spare for the next evaluation
                continue
            parent, child = self._ctx.Pipe(duplex=False)
            job.process = self._ctx.Process(target=_worker_main, args=(job.request_json, child, job.entry), daemon=True,
                                            name=f"gradlab-eval-{job.handle.id}")
            with _sigint_blocked():
                job.process.start()
            child.close()
            job.conn = parent
            logger.info("evaluation %s started (pid %s)", job.handle.id, job.process.pid)

    def _job(self, handle: EvalHandle) -> _Job:
        job = self._jobs.get(handle.id)
        if job is None:
            raise errors.NotFound(f"local evaluation {handle.id}: unknown or already collected handle")
        return job

    def poll(self, handle: EvalHandle) -> EvalResult | None:
        """The result when finished, else None.

        Raises:
            The worker's gradlab error (IntegrityError, ContractViolation, NotFound...), or
            EvaluationFailed for anything else, including a worker that died without answering.
        """
        answer = self.poll_json(handle)
        return None if answer is None else check_answer(handle, answer, f"local evaluation {handle.id}")

    def poll_json(self, handle: EvalHandle) -> dict[str, Any] | None:
        """A job's JSON answer when finished, else None (errors as :meth:`poll`)."""
        job = self._job(handle)
        self._start_queued()  # collects every finished worker, then fills free slots
        if job.answer is None:
            return None
        del self._jobs[handle.id]
        if job.conn is not None:
            job.conn.close()
        if job.answer[0] == "ok":
            return job.answer[1]
        raise _rebuild_error(job.answer[1], job.answer[2])

    def wait(self, handle: EvalHandle, timeout_s: float) -> None:
        """Block at most ``timeout_s`` seconds until the job's worker has answered or ended (a queued
        job: until any running worker has, which frees a slot). Returns at once for a finished or
        unknown job; :meth:`poll` then collects it. This is how :func:`evaluate_with` waits for a local
        evaluation: its answer is seen as soon as it is sent, not at the next poll."""
        from multiprocessing.connection import wait

        job = self._jobs.get(handle.id)
        if job is None or job.answer is not None:
            return
        running = [job] if job.process is not None else [
            j for j in self._jobs.values() if j.process is not None and j.answer is None]
        waitables = [w for j in running for w in (j.conn, j.process.sentinel)]
        if waitables:
            wait(waitables, timeout_s)
        else:  # nothing running yet (cannot happen after submit): look again after the interval
            time.sleep(timeout_s)

    def cancel(self, handle: EvalHandle) -> bool:
        """Drop a queued evaluation or terminate a running one; False when it had already finished."""
        job = self._jobs.pop(handle.id, None)
        if job is None:
            return False
        if handle.id in self._queue:
            self._queue.remove(handle.id)
            return True
        finished = job.answer is not None or (job.conn is not None and job.conn.poll())
        if job.process is not None and job.process.is_alive():
            job.process.terminate()
            job.process.join(5)
            if job.process.is_alive():  # hung (stopped, stuck in native code): SIGTERM is not enough
                job.process.kill()
                job.process.join(5)
        if job.conn is not None:
            job.conn.close()
        self._start_queued()
        return not finished

    def close(self) -> None:
        for job_id in list(self._jobs):
            self.cancel(self._jobs[job_id].handle)


# ----------------------------------------------------------------------------------------- modal


def get_backend(name: str = "local", **kwargs: Any) -> EvaluationBackend:
    """``local`` (default) or ``modal``, constructed with ``kwargs``.

    Raises:
        ConfigError: an unknown backend name.
    """
    if name == "local":
        return LocalBackend(**kwargs)
    if name == "modal":
        from gradlab.evaluation.modal import ModalBackend

        return ModalBackend(**kwargs)
    raise ConfigError(f"evaluation backend: expected 'local' or 'modal', found {name!r}")


def evaluate_with(
    backend: EvaluationBackend, request: EvalRequest, *, poll_interval_s: float = 0.2, timeout_s: float | None = None
) -> EvalResult:
    """Submit and poll until the result arrives: every ``poll_interval_s`` seconds, or, for a backend
    that can wait for its job (``wait(handle, timeout_s)``, the local one), as soon as it answers.

    Raises:
        BackendUnavailable: ``timeout_s`` passed (the evaluation is cancelled); or any ``poll`` error.
    """
    handle = backend.submit(request)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    wait = getattr(backend, "wait", None)
    while True:
        result = backend.poll(handle)
        if result is not None:
            return result
        if deadline is not None and time.monotonic() > deadline:
            backend.cancel(handle)
            raise BackendUnavailable(f"{backend.name} evaluation {handle.id} did not finish within {timeout_s:g} s")
        if callable(wait):
            wait(handle, poll_interval_s)
        else:
            time.sleep(poll_interval_s)


__all__ = [
    "BackendUnavailable", "EvalHandle", "EvaluationBackend", "EvaluationFailed", "LocalBackend", "evaluate_with",
    "get_backend", "prewarm",
]
