"""``gradlab server start|stop|status``: the local Prefect server kept in the background.

The first command that needs Prefect starts it by itself (:mod:`gradlab.runs.server`);
``start`` does so by hand (a chosen port, a longer wait, another idle timeout), ``stop`` ends it
now, ``status`` says whether it is up.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from gradlab.cli.output import console, err_console, fail, print_json

server_app = typer.Typer(help="The local Prefect server (with the warm flow and the warm learner) kept in the "
                              "background: it starts on first use and stops after an idle timeout.",
                         no_args_is_help=True)


def _seconds(option: str, text: str | None) -> float | None:
    """A duration option (``90``, ``90s``, ``5m``, ``1h``) in seconds; exits 1 on a bad one."""
    if text is None:
        return None
    from gradlab.cli.prefect_runs import parse_duration
    from gradlab.errors import ConfigError

    try:
        return parse_duration(text)
    except ConfigError:
        fail(f"{option} {text!r}: expected a duration like 90, 90s, 5m, 1h")


@server_app.command("start")
def start(
    port: Annotated[int | None, typer.Option(help="Port on 127.0.0.1 (default: a free one).")] = None,
    wait: Annotated[str | None, typer.Option("--wait", help="How long to wait for the server to answer (e.g. 300, "
                                             "5m; default GRADLAB_SERVER_START_TIMEOUT_S or 180 s).")] = None,
    idle_timeout: Annotated[str | None, typer.Option("--idle-timeout", help="Stop after this long with no run and no "
                                                     "command (e.g. 30m; 0 = never; default GRADLAB_DAEMON_IDLE_S "
                                                     "or 30 minutes).")] = None,
) -> None:
    """Start the Prefect server on 127.0.0.1, a warm flow and a warm learner in the background (no-op when up as asked; a
    server up with another --port or --idle-timeout is restarted as asked when no run trains on it, else exit 1)."""
    from gradlab.errors import GradlabError, TransientError
    from gradlab.runs.server import running_server, start_server
    from gradlab.settings import load_settings

    try:
        settings = load_settings()
    except GradlabError as e:
        fail(str(e))
    wait_s, idle_s = _seconds("--wait", wait), _seconds("--idle-timeout", idle_timeout)
    if wait_s is not None and wait_s <= 0:
        fail(f"--wait {wait!r}: expected a duration > 0")
    up = running_server(settings)
    if up is not None and _differs(up, port, idle_s):
        _move_or_exit(settings, up, port, idle_s, wait, idle_timeout)
        up = None
    was_up = up is not None
    try:
        # Also (re)starts the warm learner beside a running one.
        state = start_server(settings, port=port, timeout_s=wait_s, idle_s=idle_s,
                             say=lambda line: err_console.print(line, highlight=False, markup=False))
    except TransientError as e:
        fail(str(e))
    if was_up:
        console.print(f"Prefect server already up at {state.url} (pid {state.pid}); UI: {state.url}")
    else:
        console.print(f"Prefect server up at {state.url} (pid {state.pid}); UI: {state.url}")


def _differs(state, port: int | None, idle_s: float | None) -> bool:
    """True when ``--port`` or ``--idle-timeout`` asks for other than the running server has."""
    return (port is not None and state.url != f"http://127.0.0.1:{port}") or (idle_s is not None and state.idle_s != idle_s)


def _move_or_exit(settings, state, port: int | None, idle_s: float | None, wait: str | None,
                  idle_timeout: str | None) -> None:
    """Stop the server that is up so that ``start`` brings it back as asked, when nothing runs on it;
    else exit 1 saying what runs there and what to do."""
    from gradlab.runs.server import describe_s, stop_server
    from gradlab.runs.view import live_attempts
    from gradlab.stores import open_stores

    has = f"{state.url}, " + (f"idle timeout {describe_s(state.idle_s)}" if state.idle_s else "no idle timeout")
    asked = " ".join(filter(None, [f"--port {port}" if port is not None else None,
                                   f"--idle-timeout {idle_timeout}" if idle_timeout is not None else None,
                                   f"--wait {wait}" if wait is not None else None]))
    try:
        live = live_attempts(open_stores(settings))
    except Exception as e:  # noqa: BLE001 - any store failure: say so, move nothing
        fail(f"a Prefect server is already up ({has}), and whether runs train on it cannot be told "
             f"({settings.control_store_url}: {e}); `gradlab server stop` and then `gradlab server start {asked}`")
    if live:
        runs = ", ".join(f"{run_id} ({attempt_id})" for run_id, attempt_id in live)
        fail(f"a Prefect server is already up ({has}) and {len(live)} run(s) train on it: {runs}; it keeps "
             f"running as it is. When they have ended: `gradlab server stop` and then `gradlab server start {asked}`")
    err_console.print(f"a Prefect server is already up ({has}) and no run trains on it: restarting it with {asked}",
                      highlight=False)
    stop_server(settings)


@server_app.command("stop")
def stop(
    force: Annotated[bool, typer.Option("--force", help="Stop even while runs are training (they then hang and "
                                                         "end without a receipt).")] = False,
) -> None:
    """Stop the local server and its warm learner now (the next command that needs Prefect starts them again).

    Refused (exit 1) while the server is up and any run of this GRADLAB_HOME's stores is training
    (see :func:`gradlab.cli.runs_cmds.live_attempts`), unless ``--force``.
    """
    from gradlab.errors import GradlabError
    from gradlab.runs.server import daemon_alive, stop_server
    from gradlab.settings import load_settings

    settings = load_settings()
    # A live daemon (even one whose server.json is unreadable) may serve runs; with none, no run depends on it.
    if not force and daemon_alive(settings):
        refuse_while_training(settings)
    try:
        stopped = stop_server(settings)
    except GradlabError as e:
        fail(str(e))
    console.print("stopped" if stopped else f"no server was running (GRADLAB_HOME {escape(str(settings.home))})",
                  highlight=False)


def refuse_while_training(settings) -> None:
    """Exit 1 with one line naming the live runs when any attempt is training now; return otherwise.

    Args:
        settings: :class:`gradlab.settings.Settings` whose stores are read (control store only).
    """
    from gradlab.runs.view import live_attempts
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
    """Say whether the local server is up, where, until when, and whether its warm learner and warm flow are ready (exit 1 if not up)."""
    import time

    from gradlab.learn.zygote import flow_zygote_dir, ready_zygotes, starting_zygotes, zygote_dir
    from gradlab.runs.server import (
        client_alive,
        clients_dir,
        daemon_alive,
        describe_s,
        prefect_home,
        read_state,
        running_server,
    )
    from gradlab.settings import load_settings

    settings = load_settings()
    state = running_server(settings)
    recorded = read_state(settings)  # removed by running_server when stale
    starting = recorded is not None and recorded.ready is False and daemon_alive(settings)
    ready = [info.pid for info in ready_zygotes(zygote_dir(settings.home))]
    warming = starting_zygotes(zygote_dir(settings.home))
    flows_ready = [info.pid for info in ready_zygotes(flow_zygote_dir(settings.home))]
    flows_warming = starting_zygotes(flow_zygote_dir(settings.home))
    directory = clients_dir(prefect_home(settings))
    clients = sorted(int(p.name) for p in directory.iterdir() if client_alive(p)) if directory.is_dir() else []
    shown = state or (recorded if starting else None)
    idle_for = time.time() - shown.idle_since if shown is not None and shown.idle_since is not None else None
    if json_out:
        print_json({"running": state is not None, "starting": starting, "url": shown.url if shown else None,
                    "pid": shown.pid if shown else None, "server_pid": shown.server_pid if shown else None,
                    "idle_timeout_s": shown.idle_s if shown else None, "idle_for_s": idle_for, "clients": clients,
                    "warm_learner": {"ready": ready, "starting": warming},
                    "warm_flow": {"ready": flows_ready, "starting": flows_warming}})
    else:
        if state is not None:
            timeout = f"stops after {describe_s(state.idle_s)} without use" if state.idle_s else "no idle timeout"
            use = (f"in use by {len(clients)} command(s)" if clients else
                   f"idle for {idle_for:.0f} s" if idle_for is not None else "in use by a flow run")
            console.print(f"up at {state.url} (pid {state.pid}, Prefect server pid {state.server_pid}); "
                          f"{timeout}; {use}")
        elif starting:
            console.print(f"starting at {recorded.url} (pid {recorded.pid})")
        else:
            console.print(f"not running (GRADLAB_HOME {escape(str(settings.home))})", highlight=False)
        for what, up, coming in (("learner", ready, warming), ("flow", flows_ready, flows_warming)):
            warm = (f"ready (pid {', '.join(map(str, up))})" if up
                    else f"starting (pid {', '.join(map(str, coming))})" if coming else "none")
            console.print(f"warm {what}: {warm}")
    if state is None:
        raise typer.Exit(1)
