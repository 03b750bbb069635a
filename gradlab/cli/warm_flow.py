"""The warm supervising flow: ``gradlab train`` handed to a process that has Prefect imported already.

A ``gradlab train`` that runs its training-run flow in its own process first imports Prefect, the
flow and task modules and the supervisor (2–3 s on a quiet 2-core box, 10–20 s on a loaded one),
while its learner, forked warm by the learner zygote, is already training: publication,
evaluation, the stop request and the receipt all come that much later. The warm flow is a zygote
(``gradlab.learn.zygote``) of its own kind, kept beside the local Prefect server by the background
daemon (docs/ARCHITECTURE.md section 11): it imports :data:`PRELOAD` (Prefect, ``flows``,
``tasks``, the supervisor; torch, SB3 and gymnasium for the evaluation worker it forks) and no
more (no client, no thread: it checks), then waits on its Unix socket. Started with
``--learner-dir`` (the daemon does when both warm processes are missing), it first imports what a
learner shares with an evaluation worker (``zygote.SHARED_PRELOAD``) and forks the learner zygote
off it (``zygote_server.serve_detached``), so the two import torch and SB3 once, not twice beside
the server's start-up.

The command (:func:`gradlab.cli.warm_handoff.hand_off`, called by ``gradlab train`` after its
cheap option checks and before anything imports Prefect or torch) sends ``{"op": "run", "argv", "env", "cwd"}`` with its
stdin, stdout and stderr (``SCM_RIGHTS``); the zygote checks the peer's uid (``SO_PEERCRED``) and
forks a child that takes those descriptors, the environment and the working directory, starts a
session of its own, sets its signals as a fresh interpreter's (SIGPIPE ignored:
:func:`gradlab.learn.zygote_server.reset_signals`), and runs the ``gradlab`` command line with the
same arguments, in-process as the command would have (so the output, the ``--json`` line and the
exit code are the same, and a run paused past the keep-alive of its server connections goes on). The
requester confirms (``go`` → ``ok``, as for a learner), then only relays: SIGINT, SIGTERM, SIGHUP
and SIGQUIT go to the child, whose handlers are the command's own (first Ctrl-C: cancel, sealed
``cancelled``); the child reports ``{"exit": N}`` on the connection once its output is flushed; a
child that dies without a word is reported with the exit status the zygote recorded. A requester
that disappears (the connection closes) cancels the run as a Ctrl-C would.

The child forks two evaluation workers before it starts any thread (``gradlab.evaluation.backends
.prewarm`` with the ``fork`` start method): torch and the evaluation runner are imported already,
so the first two checkpoints' evaluations start at once (later ones start a process each).

A warm flow still importing is waited for (a fresh shell's first command starts the daemon,
which starts the warm flow as the server starts, and waits for it: ``hand_off``). Fallback: no
warm flow (``GRADLAB_DAEMON=0``, a daemon that could not start one, imports past
``gradlab.learn.zygote.STARTING_WAIT_S``), its code fingerprint is stale (it is retired) or it
was started with other import-time settings, or the request fails before ``ok``: ``hand_off``
returns None and the command runs the flow in its own process, as before.

This module is the serving side, a process entry point (``python -m gradlab.cli.warm_flow``,
started by :mod:`gradlab.runs.server`; ``gradlab.learn.zygote.FLOW_MODULE``): nothing in
``gradlab.cli`` imports it. What a command uses (the requester, :func:`warm_handoff.after_reply`,
the Prefect settings it was imported with) is :mod:`gradlab.cli.warm_handoff`, which this module
sets up in the child.

Files in ``$GRADLAB_HOME/zygote/flow``: as a learner zygote's (``<pid>.json``, ``<pid>.pending``,
``zygote.log``), plus ``<child pid>.exit`` (the zygote's record of a child's exit status).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

from gradlab.cli import warm_handoff
from gradlab.learn import zygote, zygote_server

log = logging.getLogger(__name__)

#: What the warm flow imports before it serves: the flow and everything it imports on its way to
#: the first checkpoint, and what an evaluation worker needs (forked from the flow's child). Not
#: the commands (``gradlab.cli.app`` and what it imports): their consoles (``gradlab.console``) are
#: made for the requester's terminal, in the child.
PRELOAD = (
    *zygote.SHARED_PRELOAD,
    "prefect", "prefect.flow_engine", "prefect.task_engine", "prefect.client.orchestration", "prefect.futures",
    "prefect.task_runners", "prefect.results", "prefect.artifacts",
    "flows.training_run", "flows.run_artifacts", "tasks.run_tasks",
    "gradlab.runs.driver", "gradlab.runs.supervisor", "gradlab.runs.operations", "gradlab.runs.process",
    "gradlab.runs.server", "gradlab.runs.progress", "gradlab.evaluation.backends", "gradlab.evaluation.runner",
    "gradlab.stores", "gradlab.receipts", "gradlab.metrics.journal", "gradlab.checkpoints",
    "gradlab.metrics.wandb_sink", "gradlab.envs.providers.builtin", "wandb",
    # What ``wandb.init`` imports on its first call (~0.25 s of its ~0.35 s offline, after the service):
    "wandb.apis.public", "wandb.sdk.launch", "wandb.sdk.lib.gitlib", "wandb.docker", "wandb._analytics", "requests",
    # Imported by the flow engine or the CLI on first use:
    "fastapi", "fastapi.routing", "starlette.requests", "prefect.utilities.visualization", "opentelemetry.metrics",
    "typer", "rich.progress", "rich.table",
)

#: Seconds the child's clean-up after its reply may take (threads joined, exit handlers) before it
#: exits regardless.
CLEANUP_S = 30.0


# --------------------------------------------------------------------------------------------
# Zygote side


class _FlowZygote(zygote_server.Zygote):
    module = zygote.FLOW_MODULE
    preload = PRELOAD

    def __init__(self, directory: Path, keeper_pid: int | None, learner_dir: Path | None = None) -> None:
        super().__init__(directory, keeper_pid)
        # Made before any import, as the flow's own state: its fingerprint and environment at start.
        self.learner = zygote_server.Zygote(learner_dir.absolute(), keeper_pid) if learner_dir is not None else None

    def serve(self) -> int:
        if self.learner is not None:
            # What the learner and the flow's evaluation workers both import is done once; the
            # learner zygote, forked off it, imports the rest of its own while the flow goes on
            # with Prefect's.
            try:
                for name in zygote.SHARED_PRELOAD:
                    __import__(name)
            except BaseException:
                self.learner._drop_pending()
                raise
            pid = zygote_server.serve_detached(self.learner, label="zygote")
            log.info("learner zygote %s forked off the warm flow's imports after %.1f s", pid,
                     time.monotonic() - self.started)
        warm_handoff.note_prefect_env(os.environ)
        # multiprocessing's resource tracker (a process, started by the first evaluation worker):
        # started here, its children share it, and none holds the requester's terminal or pipes.
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        return super().serve()

    def _op(self, op: str, request: dict, conn: socket.socket, listener: socket.socket, fds: list[int]) -> bool:
        if op != "run":
            return False
        try:
            argv = [str(a) for a in request["argv"]]
            env = {str(k): str(v) for k, v in request["env"].items()}
            cwd = str(request["cwd"])
        except (KeyError, AttributeError, TypeError) as e:
            conn.sendall(json.dumps({"error": f"malformed run request: {e}"}).encode() + b"\n")
            return True
        if len(fds) != 3:
            conn.sendall(json.dumps({"error": f"expected stdin, stdout and stderr, got {len(fds)} fds"}).encode()
                         + b"\n")
            return True
        stdio = list(fds)

        def become(ready_w: int, go_r: int) -> None:
            _become_flow(argv, env, cwd, stdio, conn, listener, ready_w, go_r)

        self._fork_confirmed(conn, become, exit_template=str(self.directory / "{pid}.exit"), what="flow",
                             detail="gradlab " + " ".join(argv))
        return True


def _become_flow(argv: list[str], env: dict[str, str], cwd: str, stdio: list[int], conn: socket.socket,
                 listener: socket.socket, ready_w: int, go_r: int) -> None:
    """In the forked child: take the requester's descriptors, environment and directory, run
    ``gradlab ARGV``, report the exit code on ``conn``, exit."""
    def setup() -> None:
        listener.close()
        os.setsid()
        zygote_server.reset_signals(signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGQUIT)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        for fd in stdio:
            if fd > 2:
                os.close(fd)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        zygote.adopt_launch_env(env)

    zygote_server.set_up_then_wait_for_go(setup, ready_w, go_r, what="flow")
    warm_handoff.enter_child()
    code = 1
    try:
        for handler in list(logging.root.handlers):  # the zygote's log lines are not the command's
            logging.root.removeHandler(handler)
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=stream.isatty())
        os.register_at_fork(after_in_child=lambda: _detach_forked(conn))
        # Before any thread exists: forked evaluation workers with torch imported, ready at once.
        from gradlab.evaluation.backends import prewarm

        prewarm(2, start_method="fork")
        _watch_requester(conn)
        sys.argv = ["gradlab", *argv]
        from gradlab.cli.app import main

        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - the requester's stderr gets the traceback
        traceback.print_exc()
    finally:
        _finish(conn, code)


def _detach_forked(conn: socket.socket) -> None:
    """In a process forked by the warm child (its evaluation worker): drop the requester's
    connection and terminal, which only the child itself answers for."""
    conn.close()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _watch_requester(conn: socket.socket) -> None:
    """A thread that cancels the run (as a Ctrl-C would) when the requester's connection closes."""
    import threading

    def watch() -> None:
        try:
            conn.settimeout(None)
            while conn.recv(64):
                pass
        except OSError:
            pass
        if not _finishing:
            from gradlab.runs.driver import cancel_by_user

            cancel_by_user("the `gradlab train` command that started this run ended (killed, or its terminal closed)")

    threading.Thread(target=watch, name="gradlab-warm-flow-requester", daemon=True).start()


_finishing = False


def _finish(conn: socket.socket, code: int) -> None:
    """Flush, let go of the requester's descriptors, report ``code``, then clean up and exit."""
    global _finishing
    _finishing = True
    try:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)  # the requester's pipes close with it, not with this process
        os.close(devnull)
        try:
            conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
        except OSError:
            pass
        import threading

        # Whatever the clean-up waits on, this process ends: it stays registered as a client of the
        # server while it lives, and a client keeps the server from idling out.
        watchdog = threading.Timer(CLEANUP_S, os._exit, args=(code,))
        watchdog.daemon = True
        watchdog.start()
        for fn in warm_handoff.deferred_calls():
            try:
                fn()
            except Exception:  # noqa: BLE001 - conveniences for the next command only
                traceback.print_exc()
        import atexit

        threading._shutdown()  # what the interpreter does at exit: non-daemon threads, executors
        atexit._run_exitfuncs()  # the client registration, multiprocessing's workers, logging
    finally:
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    from gradlab.learn.zygote_server import serve_main

    return serve_main(argv, prog="python -m gradlab.cli.warm_flow", description=__doc__.splitlines()[0],
                      folder="warm flow's folder ($GRADLAB_HOME/zygote/flow)", label="warm-flow",
                      zygote_class=_FlowZygote, learner_dir_option=True)


if __name__ == "__main__":
    # Run as ``python -m``: serve from the importable module, so ``gradlab.cli.warm_flow`` is one module.
    from gradlab.cli import warm_flow

    sys.exit(warm_flow.main())
