"""What every evaluation backend shares: the interface, its handle, its errors and the check of an answer.

:class:`EvaluationBackend` is ``submit(request) -> handle``, ``poll``, ``cancel``, ``close``; the
backends are :mod:`gradlab.evaluation.backends` (``local``) and :mod:`gradlab.evaluation.modal`.
"""

from __future__ import annotations

from typing import Any, Protocol

from gradlab.contracts.base import Contract
from gradlab.errors import ContractViolation, PermanentError, TransientError
from gradlab.evaluation.result import EvalRequest, EvalResult


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


def check_answer(handle: EvalHandle, data: Any, source: str) -> EvalResult:
    """A backend's answer as an :class:`EvalResult`, refused unless it is for the handle's checkpoint.

    Raises:
        ContractViolation: malformed JSON, or a result for another checkpoint or step.
    """
    result = EvalResult.from_json(data, source=source)
    if result.checkpoint_sha256 != handle.checkpoint_sha256 or result.checkpoint_step != handle.checkpoint_step:
        raise ContractViolation(
            f"{source}: result is for checkpoint {result.checkpoint_sha256[:16]} step {result.checkpoint_step}, "
            f"requested {handle.checkpoint_sha256[:16]} step {handle.checkpoint_step}"
        )
    return result


__all__ = ["BackendUnavailable", "EvalHandle", "EvaluationBackend", "EvaluationFailed", "check_answer"]
