"""The ``modal`` evaluation backend: a deployed Modal function evaluates a checkpoint.

The function (``deployments/modal/app.py``, app ``gradlab-eval``, function ``evaluate``) receives
:func:`build_modal_payload`'s JSON (the request plus the checkpoint's weights-only files, base64)
and returns the same result JSON as the ``local`` backend (:mod:`gradlab.evaluation.backends`).
Credentials are Modal's own (``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET`` or ``~/.modal.toml``); none
are sent in the payload or baked into the image. The SDK sits behind :class:`ModalClient`, which
tests replace.
"""

from __future__ import annotations

import base64
import concurrent.futures
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from gradlab import errors
from gradlab.errors import ConfigError, ContractViolation, GradlabError
from gradlab.evaluation.backend_api import BackendUnavailable, EvalHandle, EvaluationFailed, check_answer
from gradlab.evaluation.result import EvalRequest, EvalResult
from gradlab.evaluation.runner import WEIGHTS_ONLY_FILES

MODAL_APP_NAME = "gradlab-eval"
MODAL_FUNCTION_NAME = "evaluate"
MODAL_PAYLOAD_FORMAT = "gradlab.eval-payload/1"


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
        return check_answer(handle, data, f"Modal evaluation {handle.id}")

    def cancel(self, handle: EvalHandle) -> bool:
        self._call(lambda: self.client.cancel(handle.id), f"cancel of {handle.id}")
        return True

    def close(self) -> None:
        pass


__all__ = ["MODAL_APP_NAME", "MODAL_FUNCTION_NAME", "MODAL_PAYLOAD_FORMAT", "ModalBackend", "ModalClient",
           "SdkModalClient", "build_modal_payload", "handle_modal_payload"]
