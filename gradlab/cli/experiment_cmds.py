"""``gradlab experiment``: queued runs on Prefect deployments (DESIGN.md section 11).

``preflight`` checks, read-only, every service a queued run needs and says what is missing
(see :mod:`gradlab.deploy.preflight`). It imports neither prefect nor torch.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from gradlab.cli.output import console, print_json

experiment_app = typer.Typer(help="Queued runs: preflight checks (launch/status/... over Prefect deployments).",
                             no_args_is_help=True)

_STYLE = {"ok": "green", "fail": "red", "warn": "yellow", "skip": "dim"}


@experiment_app.command("preflight")
def preflight(
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    timeout_s: Annotated[float, typer.Option("--timeout", help="Timeout of each HTTP probe, seconds.")] = 2.0,
) -> None:
    """Check the Prefect API, work pools, deployments, stores and W&B; exit 1 if a required one fails.

    Read-only except one create-only probe object per store under `_preflight/<random>/`.
    """
    from gradlab.deploy.preflight import run_preflight

    report = run_preflight(timeout_s=timeout_s)
    if json_out:
        print_json(report.as_json())
    else:
        table = Table("check", "status", "detail")
        for c in report.checks:
            status = f"[{_STYLE[c.status]}]{c.status}[/]" + ("" if c.required else " (optional)")
            detail = escape(c.detail) + (f"\n[dim]→ {escape(c.fix)}[/]" if c.fix and c.status != "ok" else "")
            table.add_row(c.name, status, detail)
        console.print(table)
        if report.ok:
            console.print("[green]ready[/]: every required service answered")
        else:
            console.print(f"[red]missing[/]: {', '.join(c.name for c in report.missing)}")
    if not report.ok:
        raise typer.Exit(1)
