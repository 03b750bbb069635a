"""The command side of the warm flow (``gradlab.cli.warm_flow``): hand ``gradlab train`` over to it,
and what the command needs to know when it runs in the warm flow's child.

Requester (:func:`hand_off`, called by ``gradlab train`` after its cheap option checks and before
anything imports Prefect or torch): it sends ``{"op": "run", "argv", "env", "cwd"}`` with its
stdin, stdout and stderr (``SCM_RIGHTS``) to a ready warm flow, confirms the child (``go`` →
``ok``), then only relays SIGINT, SIGTERM, SIGHUP and SIGQUIT to it and returns the exit code the
child reports (or the one the zygote recorded for a child that died without a word). None when no
warm flow could take it (none ready, a stale fingerprint, other import-time settings, a request
that failed before ``ok``): the command then runs the flow in its own process.

In the child (the command running in-process there): :func:`after_reply` defers work until the
requester has its exit code, and :func:`imported_prefect_env` says which Prefect settings were
imported, so the command reads Prefect's settings again only when its own differ. The serving
side (:mod:`gradlab.cli.warm_flow`, a process entry point) sets both; nothing in ``gradlab.cli``
imports it.

Importing this module imports neither Prefect, torch nor the CLI's consoles (the warm flow imports
it before it serves).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

#: Set in the warm child's environment (the zygote's pid): that process never hands off again.
CHILD_ENV = "GRADLAB_WARM_FLOW"

#: Signals the requester relays to the child.
RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)

#: Set in the warm child's environment: when its command started (``time.monotonic()``).
COMMAND_STARTED_ENV = "GRADLAB_COMMAND_STARTED"

#: Seconds a command that has just started the daemon waits for it to start its warm flow.
DAEMON_APPEAR_S = 15.0

#: Seconds a requester waits for the zygote's exit record of a child that ended without a word.
EXIT_RECORD_WAIT_S = 3.0


# --------------------------------------------------------------------------------------------
# Requester side (the ``gradlab train`` command)


def hand_off(argv: list[str], *, home: Path | None = None, started_daemon: int | None = None,
             starting_daemon: int | None = None, started_at: float | None = None,
             say: Callable[[str], object] | None = None) -> int | None:
    """Run ``gradlab ARGV`` in a warm flow process, relaying signals; its exit code, or None.

    Args:
        argv: the ``gradlab`` arguments, e.g. ``["train", "CartPole-v1/ppo", "--seed", "0"]``.
        home: the gradlab data directory (default: the settings', and then nothing is handed off
            under ``GRADLAB_DAEMON=0``).
        started_daemon: the pid of the background daemon this command has just started
            (:func:`gradlab.runs.server.start_daemon`): its warm flow, started beside the server,
            is waited for while it imports (it is ready about when the server is). The child
            learns the server is its command's from ``GRADLAB_STARTED_DAEMON`` in the environment
            it inherits (:func:`gradlab.runs.server.ensure_server`).
        starting_daemon: the pid of a daemon another command started whose server does not
            answer yet: its warm flow is waited for as for ``started_daemon``'s.
        started_at: when the command started (``time.monotonic()``, one clock for every process
            here): the child counts its waits and its wall time from it (:data:`COMMAND_STARTED_ENV`).
        say: called with one line when the command waits for a warm flow still importing, and
            with one more saying how long that took once it is ready.

    Returns:
        The child's exit code; None when no warm flow could take it (see the module docstring):
        the caller runs the command itself. Cheap: reads a few files, imports neither Prefect nor
        torch.
    """
    from gradlab.learn import zygote  # here: a fresh shell's train starts the daemon before this import

    if os.environ.get(CHILD_ENV):
        return None
    if home is None:
        from gradlab.settings import load_settings

        settings = load_settings()
        if not settings.daemon:
            return None
        home = settings.home
    directory = zygote.flow_zygote_dir(home)
    # A warm flow still importing is waited for: this command's own imports would take as long.
    waited_from: list[float] = []

    def waiting() -> None:
        waited_from.append(time.monotonic())
        if say is not None:
            say("starting: the warm flow and the warm learner (they import Prefect, torch and the flow once, beside "
                "the local Prefect server's start-up); this command then runs in the warm flow")

    starter = started_daemon or starting_daemon
    ready = zygote.await_ready(directory, appear_s=DAEMON_APPEAR_S if starter else 0.0, starter_pid=starter,
                                on_wait=waiting)
    if not ready:
        if waited_from and say is not None:
            say(f"the warm flow did not start (its log: {directory / 'zygote.log'}); this command runs the flow "
                "itself")
        return None
    if waited_from and say is not None:
        say(f"the warm flow was ready after {time.monotonic() - waited_from[0]:,.1f} s")
    zygote.clear_exit_records(directory)
    mine, wanted = zygote.kind_fingerprint(zygote.FLOW_MODULE), zygote.launch_import_env()
    for info in ready:
        if info.fingerprint != mine:
            zygote.log.info("warm flow %d runs other code than this checkout: retiring it", info.pid)
            zygote.retire(info)
            continue
        if not info.serves(wanted):
            continue
        env = {**zygote.launch_environ(), CHILD_ENV: str(info.pid)}
        if started_at is not None:
            env[COMMAND_STARTED_ENV] = repr(started_at)
        request = {"op": "run", "argv": list(argv), "env": env, "cwd": os.getcwd()}
        try:
            sock, pid = _request_run(info.address, request)
        except (OSError, ValueError) as e:
            zygote.log.warning("warm flow %d did not take the run (%s): running it in this process", info.pid, e)
            continue
        with sock:
            return _relay(sock, pid, directory)
    return None


def _request_run(address: str, payload: dict) -> tuple[socket.socket, int]:
    """Send the request with fds 0, 1, 2; confirm the child. Returns the open connection and its pid."""
    from gradlab.learn import zygote

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(zygote.REQUEST_TIMEOUT_S)
        s.connect(address)
        socket.send_fds(s, [json.dumps(payload).encode() + b"\n"], [0, 1, 2])
        answer = json.loads(zygote.read_line(s) or b"{}")
        if "pid" not in answer:
            raise ValueError(answer.get("error") or "no answer")
        s.sendall(b"go\n")
        if zygote.read_line(s) != b"ok":
            raise OSError(f"warm flow child {answer['pid']} was not confirmed")
    except BaseException:
        s.close()
        raise
    return s, int(answer["pid"])


def _relay(sock: socket.socket, pid: int, directory: Path) -> int:
    """Relay signals to the child until it reports its exit code (or its connection closes)."""
    from gradlab.learn import zygote

    def forward(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in RELAYED}
    try:
        sock.settimeout(None)
        line = zygote.read_line(sock)  # PEP 475: a relayed signal does not end the wait
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    try:
        return int(json.loads(line)["exit"])
    except (ValueError, KeyError, TypeError):
        pass
    record = directory / f"{pid}.exit"
    deadline = time.monotonic() + EXIT_RECORD_WAIT_S
    while not record.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        code = int(record.read_text())
    except (OSError, ValueError):
        code = None
    from gradlab.cli.output import err_console

    err_console.print(f"[bold red]error:[/] the warm flow process {pid} ended without reporting a result "
                      f"(exit status {code if code is not None else 'unknown'}; its log: "
                      f"{directory / 'zygote.log'})", highlight=False)
    if code is None:
        return 1
    return 128 - code if code < 0 else code


def command_started() -> float:
    """When this command started (``time.monotonic()``): now, or in the warm flow's child, when its
    requester started (taken out of the environment, so nothing the child starts inherits it)."""
    value = os.environ.pop(COMMAND_STARTED_ENV, None)
    if value is not None and os.environ.get(CHILD_ENV):
        try:
            return min(float(value), time.monotonic())
        except ValueError:
            pass
    return time.monotonic()


# --------------------------------------------------------------------------------------------
# In the warm flow and its child (set by ``gradlab.cli.warm_flow``)


_imported_prefect_env: dict[str, str] | None = None
_in_child = False
_after_reply: list[Callable[[], object]] = []


def prefect_env(env) -> dict[str, str]:
    """The part of an environment Prefect reads its settings from (``PREFECT_*``, ``DO_NOT_TRACK``),
    less the ephemeral server's (a command with the local server never starts one)."""
    return {k: v for k, v in env.items()
            if (k.startswith("PREFECT_") and not k.startswith("PREFECT_SERVER_EPHEMERAL_")) or k == "DO_NOT_TRACK"}


def imported_prefect_env() -> dict[str, str] | None:
    """In the warm flow and its children: :func:`prefect_env` of the environment Prefect was
    imported with; elsewhere None."""
    return _imported_prefect_env


def note_prefect_env(env) -> None:
    """The warm flow, before it imports Prefect: record :func:`prefect_env` of ``env`` (what
    :func:`imported_prefect_env` returns there and in its children)."""
    global _imported_prefect_env
    _imported_prefect_env = prefect_env(env)


def enter_child() -> None:
    """The warm flow's child, once it has taken the requester's descriptors: from now on
    :func:`after_reply` defers its calls (to :func:`deferred_calls`)."""
    global _in_child
    _in_child = True


def after_reply(fn: Callable[[], object]) -> None:
    """Call ``fn()`` once the command's result has reached its requester (in the warm flow's child:
    after the exit code is reported, so the command's wall time does not include it), else now."""
    if _in_child:
        _after_reply.append(fn)
    else:
        fn()


def deferred_calls() -> list[Callable[[], object]]:
    """The calls :func:`after_reply` deferred, in order (the warm flow's child makes them once its
    exit code is reported)."""
    return list(_after_reply)
