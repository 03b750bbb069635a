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
    from gradlab.runs.server import running_server, start_server
    from gradlab.settings import load_settings

    settings = load_settings()
    was_up = running_server(settings) is not None
    try:
        state = start_server(settings, port=port)  # also (re)starts the warm learner beside a running one
    except TransientError as e:
        fail(str(e))
    if was_up:
        console.print(f"Prefect server already up at {state.url} (pid {state.pid}); UI: {state.url}")
    else:
        console.print(f"Prefect server up at {state.url} (pid {state.pid}); UI: {state.url}")


@server_app.command("stop")
def stop(
    force: Annotated[bool, typer.Option("--force", help="Stop even while runs are training (they then hang and "
                                                         "end without a receipt).")] = False,
) -> None:
    """Stop the server started by gradlab server start, and its warm learner.

    Refused (exit 1) while the server is up and any run of this GRADLAB_HOME's stores is training
    (see :func:`gradlab.cli.runs_cmds.live_attempts`), unless ``--force``.
    """
    from gradlab.runs.server import running_server, stop_server
    from gradlab.settings import load_settings

    settings = load_settings()
    if not force and running_server(settings) is not None:  # with no server up, no run depends on it
        refuse_while_training(settings)
    console.print("stopped" if stop_server(settings) else "no server was running")


def refuse_while_training(settings) -> None:
    """Exit 1 with one line naming the live runs when any attempt is training now; return otherwise.

    Args:
        settings: :class:`gradlab.settings.Settings` whose stores are read (control store only).
    """
    from gradlab.cli.runs_cmds import live_attempts
    from gradlab.stores import open_stores

    try:
        live = live_attempts(open_stores(settings))
    except Exception as e:  # noqa: BLE001 - any store failure: say so, stop nothing
        fail(f"cannot tell whether runs are training ({settings.control_store_url}: {e}); "
             "pass --force to stop the server anyway")
    if live:
        runs = ", ".join(f"{run_id} ({attempt_id})" for run_id, attempt_id in live)
        fail(f"refusing to stop the server: {len(live)} run(s) still training: {runs}; stopping it now would "
             "leave them hanging without a receipt. Wait for them to end, cancel them with Ctrl-C, "
             "or pass --force")


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
