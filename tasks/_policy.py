"""Retry policy shared by every task: retry transient errors only, with exponential backoff."""

from __future__ import annotations

from typing import Any

from gradlab.errors import TransientError

RETRIES = 4
#: 1, 2, 4, 8 s between tries (prefect.tasks.exponential_backoff(backoff_factor=1) without jitter).
RETRY_DELAYS_S = [1.0, 2.0, 4.0, 8.0]


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: True only when the failure is a :class:`TransientError`."""
    try:
        exc = state.result(raise_on_failure=False)
    except Exception as e:  # noqa: BLE001 - a result that cannot be read is not retried
        exc = e
    return isinstance(exc, TransientError | ConnectionError | TimeoutError)
