"""``gradlab server start|stop|status``: keep a local Prefect server up between runs."""

from __future__ import annotations

from typing import Annotated

import typer

from gradlab.cli.output import console, fail, print_json

server_app = typer.Typer(help="Keep a local Prefect server up so runs skip Prefect's start-up.", no_args_is_help=True)


@server_app.command("start")
def start(port: Annotated[int | None, typer.Option(help="Port on 127.0.0.1 (default: a free one).")] = None) -> None:
    """Start a Prefect server on 127.0.0.1 and a warm learner in the background (no-op when up)."""
    from gradlab.errors import TransientError
    from gradlab.runs.server import start_server
    from gradlab.settings import load_settings

    try:
        state = start_server(load_settings(), port=port)
    except TransientError as e:
        fail(str(e))
    console.print(f"Prefect server up at {state.url} (pid {state.pid}); UI: {state.url}")


@server_app.command("stop")
def stop() -> None:
    """Stop the server started by gradlab server start, and its warm learner."""
    from gradlab.runs.server import stop_server
    from gradlab.settings import load_settings

    console.print("stopped" if stop_server(load_settings()) else "no server was running")


@server_app.command("status")
def status(json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Say whether a local server is up, where, and whether its warm learner is ready."""
    from gradlab.learn.zygote import ready_zygotes, starting_zygotes, zygote_dir
    from gradlab.runs.server import running_server
    from gradlab.settings import load_settings

    settings = load_settings()
    state = running_server(settings)
    ready = [info.pid for info in ready_zygotes(zygote_dir(settings.home))]
    starting = starting_zygotes(zygote_dir(settings.home))
    if json_out:
        print_json({"running": state is not None, "url": state.url if state else None, "pid": state.pid if state else None,
                    "warm_learner": {"ready": ready, "starting": starting}})
    else:
        console.print(f"up at {state.url} (pid {state.pid})" if state else "not running")
        warm = (f"ready (pid {', '.join(map(str, ready))})" if ready
                else f"starting (pid {', '.join(map(str, starting))})" if starting else "none")
        console.print(f"warm learner: {warm}")
    if state is None:
        raise typer.Exit(1)
