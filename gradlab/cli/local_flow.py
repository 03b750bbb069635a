"""A supervising flow run inside the command's own process (``train``, ``runs retry``, ``sweep``):
Prefect pointed at its API, the first Ctrl-C turned into a clean cancel, the training-run flow
called and its terminal receipt read back.

Prefect and the flows are imported only when a function here runs.
"""

from __future__ import annotations

import os

from rich.markup import escape

from gradlab.cli.output import err_console, say_text


def configure_prefect(waiting=None, cancelled=None) -> str:
    """Point Prefect at its API for this command; quiet its logs and telemetry.

    The API is ``PREFECT_API_URL`` / ``[prefect] api_url`` when configured, else the local server
    kept in the background (started now if none is up, which says so in one line on stderr; see
    :mod:`gradlab.runs.server`), else (``GRADLAB_DAEMON=0``, or it did not answer in time)
    Prefect's ephemeral server, started inside this command.

    Args:
        waiting: ``(what, usual_seconds)`` callback, called before waiting for the local server
            (:func:`gradlab.runs.server.ensure_server`); the progress display shows it.
        cancelled: a ``() -> bool`` that ends that wait once true (the command was cancelled).

    Returns:
        A short description of the API in use (its URL, or why it is the ephemeral server).
    """
    from gradlab.runs.server import PREFECT_CLIENT_DEFAULTS
    from gradlab.settings import load_settings

    settings = load_settings()
    # Quiet logs; Prefect's client telemetry (and its first-run notice, printed into the progress
    # display) off, as the server's analytics are; a user who wants it sets DO_NOT_TRACK=0.
    for key, value in PREFECT_CLIENT_DEFAULTS.items():
        os.environ.setdefault(key, value)
    # Prefect waits 20 s for its ephemeral server by default; a loaded 2-core box needs longer.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", f"{settings.server_start_timeout_s:.0f}")
    try:
        if os.environ.get("PREFECT_API_URL"):
            return os.environ["PREFECT_API_URL"]
        from gradlab.runs.server import ensure_server

        if settings.prefect_api_url:
            os.environ["PREFECT_API_URL"] = settings.prefect_api_url
            return settings.prefect_api_url
        state = ensure_server(settings, say=say_text, waiting=waiting, cancelled=cancelled)
        if state is not None:
            os.environ["PREFECT_API_URL"] = state.api_url
            return state.api_url
        why = "GRADLAB_DAEMON=0" if not settings.daemon else "no local server answered in time"
        return f"ephemeral ({why}: Prefect starts a server inside this command)"
    finally:
        _reread_prefect_settings()


def _reread_prefect_settings() -> None:
    """In a process that imported Prefect before this command's environment was set (the warm
    flow, ``gradlab.cli.warm_flow``): Prefect's settings and logging read again from it. Prefect
    reads its settings once, at import (``prefect.context.GLOBAL_SETTINGS_CONTEXT``)."""
    import sys

    if "prefect.context" not in sys.modules:
        return
    from gradlab.cli import warm_handoff

    if warm_handoff.imported_prefect_env() == warm_handoff.prefect_env(os.environ):
        return  # imported with these very settings (the warm flow's usual case)
    from prefect.context import refresh_global_settings_context
    from prefect.logging.configuration import PROCESS_LOGGING_CONFIG, setup_logging

    refresh_global_settings_context()
    if PROCESS_LOGGING_CONFIG:
        setup_logging(incremental=False)


def run_flow(**params):
    """Call the training-run flow in this process.

    Args:
        params: the ``training-run`` flow's parameters (:func:`flows.training_run.training_run`).

    Returns:
        (the terminal receipt JSON of the attempt this flow ran: a run that succeeded returns it, a
        Failed or Cancelled state carries it, and the receipt store's copy of that attempt's receipt
        is preferred (the authority; for an attempt superseded while it ran, the receipt its
        successor sealed, not the successor's own); else the latest attempt's stored receipt, else
        None; the flow run's final Prefect state).
    """
    from prefect import tags
    from prefect.context import SettingsContext, get_settings_context

    from flows.training_run import training_run

    # The engine joins a heartbeat thread at flow end (~1 s, docs/ARCHITECTURE.md, field notes): off
    # for local runs. The current settings with that one field changed (what ``temporary_settings``
    # gives, without validating every settings source again: ~20 ms on the run's critical path).
    context = get_settings_context()
    settings = context.settings.model_copy(
        update={"flows": context.settings.flows.model_copy(update={"heartbeat_frequency": None})})
    # The flow run is created with its run-id tag (no update of the flow run for it, section 11).
    run_tags = [params["run_id"]] if params.get("run_id") else []
    with SettingsContext(profile=context.profile, settings=settings), tags(*run_tags):
        state = training_run(**params, return_state=True)
    receipt = state.result(raise_on_failure=False) if state.is_completed() else _carried_receipt(state)
    if isinstance(receipt, dict) and not state.is_completed():
        receipt = stored_receipt(receipt["run_id"], receipt["attempt_id"]) or receipt
    if not isinstance(receipt, dict):
        receipt = stored_receipt(params["run_id"]) if params.get("run_id") else None
    return receipt, state


def _carried_receipt(state) -> dict | None:
    """The receipt a Failed or Cancelled training-run state carries (``RunNotSucceeded``), or None."""
    from flows.training_run import RunNotSucceeded

    try:
        data = state.result(raise_on_failure=False)
    except Exception:  # noqa: BLE001 - no result to read (a crash): the receipt store answers
        return None
    receipt = getattr(data, "receipt", None) if isinstance(data, RunNotSucceeded) else None
    return receipt if isinstance(receipt, dict) and {"run_id", "attempt_id"} <= receipt.keys() else None


def stored_receipt(run_id: str, attempt_id: str | None = None) -> dict | None:
    """The terminal receipt of attempt ``attempt_id`` (default: the run's latest) from the receipt store.

    Returns:
        The receipt JSON; None when it is not sealed or the store cannot be read (said on stderr).
    """
    from gradlab.runs.view import latest_terminal_receipt
    from gradlab.stores import open_stores

    try:
        if attempt_id is None:
            return latest_terminal_receipt(open_stores(), run_id)
        from gradlab.receipts.terminal import read_terminal

        receipt = read_terminal(open_stores(), run_id, attempt_id)
        return None if receipt is None else receipt.model_dump(mode="json")
    except Exception as e:  # noqa: BLE001 - reported as 'no receipt'
        err_console.print(f"cannot read the receipt store: {escape(str(e))}")
    return None


DUPLICATE_SIGINT_S = 0.5
"""A SIGINT this soon after the first is the same Ctrl-C delivered twice: once by the terminal to
the process group and once relayed by a parent in it (``uv run`` relays SIGINT when it has no
TTY), so it does not count as the second Ctrl-C."""


def cancel_on_ctrl_c() -> None:
    """First Ctrl-C: cancel cleanly (the supervisor stops the learner and seals ``cancelled``);
    second (more than :data:`DUPLICATE_SIGINT_S` later): interrupt at once."""
    import signal
    import time

    from gradlab.runs.driver import SEALING, USER_CANCEL, cancel_by_user

    first: list[float] = []

    def on_sigint(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
        if USER_CANCEL.is_set():
            if first and time.monotonic() - first[0] < DUPLICATE_SIGINT_S:
                return
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        first.append(time.monotonic())
        cancel_by_user()
        if SEALING.is_set():
            err_console.print("sealing the receipt now: the wait on W&B stops and its metrics stay pending for it "
                              "(Ctrl-C again to abort at once)")
        else:
            err_console.print("cancelling: the learner stops and a cancelled receipt is sealed "
                              "(Ctrl-C again to abort at once, without a receipt)")

    signal.signal(signal.SIGINT, on_sigint)
