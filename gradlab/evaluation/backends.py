"""Evaluation backends behind one interface: ``submit(request) -> handle``, ``poll``, ``cancel``.

* ``local`` (default): each evaluation runs :func:`gradlab.evaluation.runner.run_evaluation_json` in
  its own spawned process; at most ``max_workers`` run at once (default: the cores left over by
  training, ``os.cpu_count() - reserved_cores``, at least 1); queued ones start as slots free up on
  the next ``submit``/``poll``. ``cancel`` drops a queued evaluation or terminates a running one.
  :func:`prewarm` keeps spare worker processes that have already imported torch, SB3 and
  gymnasium (3–8 s here), so an evaluation starts at once; a supervisor calls it when a run begins.
* ``modal``: a deployed Modal function (``deployments/modal/app.py``, app ``gradlab-eval``, function
  ``evaluate``) receives :func:`build_modal_payload`'s JSON (the request plus the checkpoint's
  weights-only files, base64) and returns the same result JSON as ``local``. Credentials are
  Modal's own (``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET`` or ``~/.modal.toml``); none are sent in the
  payload or baked into the image. The SDK sits behind :class:`ModalClient`, which tests replace.

Both return :class:`EvalResult`; a result whose JSON is malformed or that answers a different
checkpoint is refused with ``ContractViolation``.
"""

from __future__ import annotations

import atexit
import base64
import concurrent.futures
import contextlib
import itertools
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from gradlab import errors
from gradlab.contracts.base import Contract
from gradlab.errors import ConfigError, ContractViolation, GradlabError, PermanentError, TransientError
from gradlab.evaluation.result import EvalRequest, EvalResult
from gradlab.evaluation.runner import WEIGHTS_ONLY_FILES

logger = logging.getLogger(__name__)

MODAL_APP_NAME = "gradlab-eval"
MODAL_FUNCTION_NAME = "evaluate"
MODAL_PAYLOAD_FORMAT = "gradlab.eval-payload/1"


class BackendUnavailable(TransientError, ConnectionError):
    """The evaluation backend (Modal) could not be reached or did not answer in time."""


class EvaluationFailed(PermanentError, RuntimeError):
    """The evaluation itself failed on the backend (the message carries the remote error)."""


class EvalHandle(Contract):
    backend: str
    id: str
    checkpoint_sha256: str
    checkpoint_step: int


class EvaluationBackend(Protocol):
    name: str

    def submit(self, request: EvalRequest) -> EvalHandle: ...

    def poll(self, handle: EvalHandle) -> EvalResult | None: ...

    def cancel(self, handle: EvalHandle) -> bool: ...

    def close(self) -> None: ...


def _check_answer(handle: EvalHandle, data: Any, source: str) -> EvalResult:
    result = EvalResult.from_json(data, source=source)
    if result.checkpoint_sha256 != handle.checkpoint_sha256 or result.checkpoint_step != handle.checkpoint_step:
        raise ContractViolation(
            f"{source}: result is for checkpoint {result.checkpoint_sha256[:16]} step {result.checkpoint_step}, "
            f"requested {handle.checkpoint_sha256[:16]} step {handle.checkpoint_step}"
        )
    return result


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
        return None if answer is None else _check_answer(handle, answer, f"local evaluation {handle.id}")

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


class ModalClient(Protocol):
    """The boundary to Modal's SDK (replaced in tests: Modal cannot be reached from here)."""

    def spawn(self, payload: dict[str, Any]) -> str:
        """Start the function on ``payload``; returns the function-call id."""
        ...

    def get(self, call_id: str) -> Any:
        """The function's return value, or raise ``TimeoutError`` while it still runs."""
        ...

    def cancel(self, call_id: str) -> None: ...


class SdkModalClient:
    """:class:`ModalClient` over the ``modal`` SDK (``modal`` extra)."""

    def __init__(self, app_name: str = MODAL_APP_NAME, function_name: str = MODAL_FUNCTION_NAME):
        self.app_name = app_name
        self.function_name = function_name

    def spawn(self, payload: dict[str, Any]) -> str:
        import modal

        fn = modal.Function.from_name(self.app_name, self.function_name)
        return fn.spawn(payload).object_id

    def get(self, call_id: str) -> Any:
        import modal

        return modal.FunctionCall.from_id(call_id).get(timeout=0)

    def cancel(self, call_id: str) -> None:
        import modal

        modal.FunctionCall.from_id(call_id).cancel()


def build_modal_payload(request: EvalRequest) -> dict[str, Any]:
    """The JSON the Modal function receives: the request plus the weights-only checkpoint files.

    Shape: ``{"format": "gradlab.eval-payload/1", "request": <EvalRequest JSON, verify="weights_only">,
    "checkpoint_name": "<step>-<sha16>", "files": {name: base64}}`` with ``manifest.json``,
    ``policy.safetensors`` and ``policy_spec.json``. No credentials.

    Raises:
        NotFound: the checkpoint directory or one of those files is missing.
    """
    path = Path(request.checkpoint_dir)
    files = {}
    for name in ("manifest.json", *WEIGHTS_ONLY_FILES):
        fpath = path / name
        if not fpath.is_file():
            raise errors.NotFound(f"{fpath}: needed by the Modal evaluation payload but missing")
        files[name] = base64.b64encode(fpath.read_bytes()).decode("ascii")
    req = request.model_copy(update={"verify": "weights_only", "checkpoint_dir": path.name})
    return {"format": MODAL_PAYLOAD_FORMAT, "request": req.as_json(), "checkpoint_name": path.name, "files": files}


def handle_modal_payload(payload: Mapping[str, Any], workdir: Path) -> dict[str, Any]:
    """What the Modal function runs: unpack the files under ``workdir`` and evaluate.

    Returns:
        The result JSON (the same as the local backend's).

    Raises:
        ContractViolation: an unknown payload format or a file name that is not one of the shipped ones.
    """
    if not isinstance(payload, Mapping) or payload.get("format") != MODAL_PAYLOAD_FORMAT:
        found = payload.get("format") if isinstance(payload, Mapping) else type(payload).__name__
        raise ContractViolation(f"evaluation payload: format expected {MODAL_PAYLOAD_FORMAT!r}, found {found!r}")
    allowed = {"manifest.json", *WEIGHTS_ONLY_FILES}
    name = str(payload.get("checkpoint_name", "checkpoint"))
    if "/" in name or name in ("", ".", ".."):
        raise ContractViolation(f"evaluation payload: bad checkpoint_name {name!r}")
    ckpt = Path(workdir) / name
    ckpt.mkdir(parents=True, exist_ok=True)
    for fname, b64 in dict(payload.get("files", {})).items():
        if fname not in allowed:
            raise ContractViolation(f"evaluation payload: unexpected file {fname!r}; allowed: {sorted(allowed)}")
        (ckpt / fname).write_bytes(base64.b64decode(b64))
    request = dict(payload["request"])
    request["checkpoint_dir"] = str(ckpt)
    request["verify"] = "weights_only"
    from gradlab.evaluation.runner import run_evaluation_json

    return run_evaluation_json(request)


_PENDING = object()


def _pending_on_timeout(fn: Callable[[], Any]) -> Any:
    """``fn()``, or ``_PENDING`` when it raises ``TimeoutError`` (Modal: the call is still running)."""
    try:
        return fn()
    except TimeoutError:
        return _PENDING


def _call_with_timeout(fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gradlab-modal")
    future = pool.submit(fn)
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise BackendUnavailable(f"Modal: {what} did not answer within {timeout_s:g} s (network down?)") from None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _map_modal_error(e: BaseException, what: str) -> GradlabError:
    kind = type(e).__name__
    hint = f"Modal: {what} failed: {kind}: {e}"
    if kind == "AuthError":
        return ConfigError(f"{hint} (set MODAL_TOKEN_ID/MODAL_TOKEN_SECRET or run `modal token new`)")
    if kind == "NotFoundError":
        return ConfigError(f"{hint} (deploy it: `modal deploy deployments/modal/app.py`)")
    if isinstance(e, ConnectionError | OSError) or kind in ("ConnectionError", "ClientClosed", "ServiceError"):
        return BackendUnavailable(hint)
    if isinstance(e, GradlabError):
        return e
    return EvaluationFailed(hint)


class ModalBackend:
    """Evaluations on a deployed Modal function (see the module docstring).

    Args:
        client: the SDK boundary; default :class:`SdkModalClient`.
        timeout_s: limit on each call to Modal (spawn, get, cancel), seconds.
    """

    name = "modal"

    def __init__(self, client: ModalClient | None = None, *, timeout_s: float = 30.0):
        self.client = client or SdkModalClient()
        self.timeout_s = timeout_s

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        try:
            return _call_with_timeout(fn, self.timeout_s, what)
        except BackendUnavailable:
            raise
        except BaseException as e:  # noqa: BLE001 - mapped to gradlab errors
            raise _map_modal_error(e, what) from e

    def submit(self, request: EvalRequest) -> EvalHandle:
        """Raises: NotFound (checkpoint files), BackendUnavailable, ConfigError (auth, not deployed)."""
        payload = build_modal_payload(request)
        call_id = self._call(lambda: self.client.spawn(payload), "spawn")
        if not isinstance(call_id, str) or not call_id:
            raise ContractViolation(f"Modal: spawn returned {call_id!r}, expected a function-call id")
        return EvalHandle(backend=self.name, id=call_id, checkpoint_sha256=request.checkpoint_sha256,
                          checkpoint_step=request.checkpoint_step)

    def poll(self, handle: EvalHandle) -> EvalResult | None:
        """The result when finished, else None.

        Raises:
            BackendUnavailable: Modal unreachable. EvaluationFailed / the remote gradlab error: the
            function raised. ContractViolation: a malformed result or one for another checkpoint.
        """
        data = self._call(lambda: _pending_on_timeout(lambda: self.client.get(handle.id)), f"result of {handle.id}")
        if data is _PENDING:
            return None
        return _check_answer(handle, data, f"Modal evaluation {handle.id}")

    def cancel(self, handle: EvalHandle) -> bool:
        self._call(lambda: self.client.cancel(handle.id), f"cancel of {handle.id}")
        return True

    def close(self) -> None:
        pass


def get_backend(name: str = "local", **kwargs: Any) -> EvaluationBackend:
    """``local`` (default) or ``modal``, constructed with ``kwargs``.

    Raises:
        ConfigError: an unknown backend name.
    """
    if name == "local":
        return LocalBackend(**kwargs)
    if name == "modal":
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
    "BackendUnavailable", "EvalHandle", "EvaluationBackend", "EvaluationFailed", "LocalBackend",
    "ModalBackend", "ModalClient", "SdkModalClient", "build_modal_payload", "evaluate_with", "get_backend",
    "handle_modal_payload", "prewarm",
]
