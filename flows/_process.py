"""The record that lets the background daemon tell a killed flow process from a live one."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def record_this_flow_run(settings: Any = None) -> Path | None:
    """Record this process as the one executing the current flow run
    (:func:`gradlab.runs.server.record_flow_run`, docs/ARCHITECTURE.md section 11); None outside a
    flow run or where the record could not be written. Call it first thing in a flow body.

    The record stays after the body ends: the daemon removes it once the process is gone, and sets
    the run Crashed if its end never reached Prefect (the process killed, the server stopped first).
    """
    from prefect.context import FlowRunContext

    from gradlab.runs.server import record_flow_run
    from gradlab.settings import load_settings

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return None
    return record_flow_run(settings or load_settings(), str(ctx.flow_run.id))
