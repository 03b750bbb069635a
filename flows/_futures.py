"""Whether a submitted task has ended, asked of the task runner's own future rather than of the API."""

from __future__ import annotations

from typing import Any


def task_finished(future: Any) -> bool:
    """True once the task behind a Prefect future has ended (Completed, Failed, Crashed...).

    A ``ThreadPoolTaskRunner`` future wraps a ``concurrent.futures.Future``: its ``done()`` is
    asked. ``PrefectFuture.state`` of an unfinished task reads the task run from the API instead,
    one request per future per call, and sees the end only once Prefect's events have reached the
    server; on a loaded machine that can lag for minutes or never arrive, so a bounded-submission
    loop that polls it can wait forever on a task that has long ended. Other futures (no wrapped
    one) fall back to the API state.
    """
    wrapped = getattr(future, "wrapped_future", None)
    if wrapped is not None and callable(getattr(wrapped, "done", None)):
        return bool(wrapped.done())
    return bool(future.state.is_final())
