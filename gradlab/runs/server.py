"""The local Prefect server kept in the background, started on first use (docs/ARCHITECTURE.md section 11).

Prefect's ephemeral mode starts a server subprocess for every command (12–20 s on a quiet 2-core
box, up to a minute on a loaded one); a server kept up on 127.0.0.1 costs that once. The first
command that needs Prefect (``gradlab train``, ``gradlab experiment ...``, ``gradlab runs retry``)
starts it in the background, detached, with the warm learner beside it (``gradlab.learn.zygote``),
and says so in one line; later commands attach in about a second. It stops itself once nothing has
used it for ``idle_s`` seconds (``GRADLAB_DAEMON_IDLE_S``, default 30 minutes), as Gradle's daemon
does; ``gradlab server stop`` stops it now; ``GRADLAB_DAEMON=0`` opts out (every command then runs
on Prefect's ephemeral server, as before). ``gradlab server start`` starts the same thing by hand.

Processes: the daemon (``python -m gradlab.runs.daemon``) is the keeper: it starts ``prefect server
start`` in its own process group, the zygote and the warm flow (``gradlab.cli.warm_flow``), watches them, measures idleness and, on SIGTERM or
at the idle timeout, stops both and removes its files.

Files under ``$GRADLAB_HOME/prefect`` (also Prefect's ``PREFECT_HOME``: its database stays, so the
UI keeps the history of past runs)::

    server.json    ServerState: daemon pid, URL, ready or starting (removed when the daemon exits)
    clients/<pid>  one per command using the server now, holding that process's start time
                   (removed at its exit, or by the daemon once the process is gone)
    flow-runs/<id> one per flow run a local process executes: its pid and start time, written by
                   the flow as its body starts; a flow run still Running whose process is gone
                   (kill -9, or its end never reached the server) is set Crashed by the daemon,
                   which would otherwise count it as use for ever; removed by the daemon once the
                   process is gone (:func:`record_flow_run`)
    startup.json   the last measured start-up time, seconds: a command waits for a server
                   another command is starting about as long as starting one takes
                   (:func:`expected_startup_s`), then uses Prefect's ephemeral server
    daemon.log     the daemon's own lines; server.log: Prefect's

Who starts it: an exclusive ``flock`` on the ``$GRADLAB_HOME/prefect`` folder, taken by the command
that starts the daemon and inherited by the daemon, which holds it for its whole life. So "a daemon
is alive" is "the lock is held" (a ``server.json`` without a held lock is stale, from a daemon
killed with SIGKILL, and is removed), concurrent first commands start exactly one daemon, and the
lock is released by the kernel however the daemon ends.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from gradlab.errors import TransientError
from gradlab.learn.watch import pid_alive
from gradlab.settings import Settings

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ServerState:
    """What ``server.json`` records.

    Attributes:
        pid: the daemon (keeper) process; SIGTERM to it stops the server and the warm learner.
        url: ``http://127.0.0.1:PORT``, the UI; the API is ``url + "/api"``.
        home: Prefect's home folder (``$GRADLAB_HOME/prefect``).
        server_pid: the ``prefect server start`` process (its own process group), once started.
        idle_s: the idle timeout, seconds (0 = never).
        started_at: Unix time the daemon started.
        ready: True once the server answered its health check.
        idle_since: Unix time since which nothing used the server (None while in use).
    """

    pid: int
    url: str
    home: str
    server_pid: int | None = None
    idle_s: float = 0.0
    started_at: float = 0.0
    ready: bool = True
    idle_since: float | None = None

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"


def prefect_home(settings: Settings) -> Path:
    return settings.home / "prefect"


def state_file(home: Path) -> Path:
    return home / "server.json"


def clients_dir(home: Path) -> Path:
    return home / "clients"


def _state_file(settings: Settings) -> Path:
    return state_file(prefect_home(settings))


def read_state_file(home: Path) -> ServerState | None:
    """``home/server.json`` (None if absent or unreadable: not JSON, not an object, unknown fields)."""
    try:
        return ServerState(**json.loads(state_file(home).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def read_state(settings: Settings) -> ServerState | None:
    """The recorded state, whether or not its daemon still runs (None if absent or unreadable)."""
    return read_state_file(prefect_home(settings))


def write_state(home: Path, state: ServerState) -> None:
    """Write ``server.json`` atomically (a reader never sees half a file)."""
    partial = state_file(home).with_suffix(".partial")
    partial.write_text(json.dumps(asdict(state)))
    os.replace(partial, state_file(home))


def healthy(api_url: str, timeout_s: float = 1.0) -> bool:
    """True when ``GET {api_url}/health`` answers 200 within ``timeout_s`` seconds."""
    import urllib.request  # here: ~20 ms a fresh shell's command spends before it starts the daemon
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout_s) as r:
            return r.status == 200
    except OSError:
        return False


def _open_home(settings: Settings) -> int:
    home = prefect_home(settings)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return os.open(home, os.O_RDONLY | os.O_DIRECTORY)


def try_lock(settings: Settings) -> int | None:
    """Take the start lock (exclusive ``flock`` on ``$GRADLAB_HOME/prefect``) without waiting.

    Returns the locked descriptor (the caller closes it or hands it to the daemon), or None when a
    daemon holds it (it is starting or running).
    """
    fd = _open_home(settings)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def daemon_alive(settings: Settings) -> bool:
    """True while a daemon of this GRADLAB_HOME holds the start lock (starting or running)."""
    fd = try_lock(settings)
    if fd is None:
        return True
    os.close(fd)  # closing releases it
    return False


def clear_stale(home: Path) -> None:
    """Remove what a daemon leaves while it runs (state, client files); only when none runs."""
    state_file(home).unlink(missing_ok=True)
    state_file(home).with_suffix(".partial").unlink(missing_ok=True)
    shutil.rmtree(clients_dir(home), ignore_errors=True)


def running_server(settings: Settings) -> ServerState | None:
    """The recorded server if its daemon is alive and the server answers, else None.

    A state file whose daemon is gone (no one holds the lock) is stale and is removed.
    """
    state = read_state(settings)
    if state is None:
        return None
    if not daemon_alive(settings):
        clear_stale(prefect_home(settings))
        return None
    return state if state.ready and healthy(state.api_url, timeout_s=3.0) else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measured_startup_s(settings: Settings) -> float | None:
    """Seconds the last local server start-up took here (``startup.json``), None before any."""
    try:
        return max(float(json.loads((prefect_home(settings) / "startup.json").read_text())["seconds"]), 0.0)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def expected_startup_s(settings: Settings) -> float:
    """How long starting a local server takes here, seconds: twice the last measured start-up plus
    2 s (the load on a shared machine moves it by 2×), at most the configured start-up wait, which
    is also the answer before any start was measured."""
    seconds = measured_startup_s(settings)
    if seconds is None:
        return settings.server_start_timeout_s
    return min(2.0 * seconds + 2.0, settings.server_start_timeout_s)


def _spawn(settings: Settings, *, port: int | None, idle_s: float, start_timeout_s: float) -> tuple[int, int] | None:
    """Take the start lock and start the daemon detached (its own session, output to ``daemon.log``),
    handing it the lock: its pid and port (``port`` or a free one); None when the lock is held
    (a daemon runs or another command is starting one). It runs in ``/``: a relative GRADLAB_CACHE_DIR is made absolute."""
    if (fd := try_lock(settings)) is None:
        return None
    try:
        home = prefect_home(settings)
        clear_stale(home)
        port = port or free_port()
        cmd = [sys.executable, "-m", "gradlab.runs.daemon", "--prefect-home", str(home), "--gradlab-home",
               str(settings.home), "--port", str(port), "--idle-s", str(idle_s), "--start-timeout-s",
               str(start_timeout_s), "--lock-fd", str(fd)]
        env = {**os.environ, "GRADLAB_HOME": str(settings.home)}
        if cache := env.get("GRADLAB_CACHE_DIR"):
            env["GRADLAB_CACHE_DIR"] = str(Path(cache).absolute())
        with (home / "daemon.log").open("ab") as out:
            popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                     start_new_session=True, pass_fds=(fd,), cwd="/")
    finally:
        os.close(fd)
    return popen.pid, port


def _wait_ready(settings: Settings, timeout_s: float, daemon_pid: int | None,
                cancelled: Callable[[], bool] | None = None) -> ServerState | None:
    """Wait until the daemon says ready and its server answers; None at the timeout, once the
    daemon is gone (``daemon_pid`` given: that process; else: nobody holds the lock), or once
    ``cancelled()`` says so."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = read_state(settings)
        if state is not None and state.ready and healthy(state.api_url, timeout_s=2.0):
            return state
        gone = not pid_alive(daemon_pid) if daemon_pid is not None else not daemon_alive(settings)
        if gone or time.monotonic() >= deadline or (cancelled is not None and cancelled()):
            return None
        time.sleep(0.05)  # a look is a small file read (and a health request once ready): the run waits on it


def _waiting_line(url: str, timeout_s: float, log_path: Path) -> str:
    return (f"waiting up to {timeout_s:.0f} s for the Prefect server at {url} to answer GET /api/health "
            f"(its database migrations and services start first; --wait or GRADLAB_SERVER_START_TIMEOUT_S "
            f"waits longer; log: {log_path})")


def start_server(settings: Settings, *, port: int | None = None, timeout_s: float | None = None,
                 idle_s: float | None = None, say: Callable[[str], None] | None = None) -> ServerState:
    """Start the background server (``gradlab server start``) and wait until it answers.

    Args:
        settings: whose ``GRADLAB_HOME`` holds the server's files.
        port: port on 127.0.0.1 (default: a free one).
        timeout_s: seconds to wait for the health check (default ``settings.server_start_timeout_s``).
        idle_s: the idle timeout, seconds, 0 = never (default ``settings.daemon_idle_s``).
        say: called with one line saying what is waited for (default: nothing is said).

    Returns:
        The running server (the one already up, when there is one; its warm learner is restarted
        if it is missing).

    Raises:
        TransientError: it did not answer within ``timeout_s`` (the line names the log).
    """
    timeout_s = settings.server_start_timeout_s if timeout_s is None else timeout_s
    idle_s = settings.daemon_idle_s if idle_s is None else idle_s
    existing = running_server(settings)
    if existing is not None:
        _warm_learner(settings, existing.pid, existing.api_url)
        return existing
    home = prefect_home(settings)
    spawned = _spawn(settings, port=port, idle_s=idle_s, start_timeout_s=timeout_s)
    pid = None
    if spawned is None:  # another command is starting one: wait for that one
        recorded = read_state(settings)
        if say is not None:
            say(_waiting_line(recorded.url if recorded else "(starting)", timeout_s, home / "server.log"))
        state = _wait_ready(settings, timeout_s, None)
    else:
        pid, port = spawned
        if say is not None:
            say(_waiting_line(f"http://127.0.0.1:{port}", timeout_s, home / "server.log"))
        state = _wait_ready(settings, timeout_s, pid)
    if state is None:
        stopped = not daemon_alive(settings)  # e.g. `gradlab server stop` meanwhile: not a slow start
        if pid is not None and not stopped:  # the one this call started (one another command started is left to it)
            stop_server(settings)
        why = "'s daemon stopped before it answered" if stopped else f" did not answer GET /api/health within " \
            f"{timeout_s:.0f} s (a loaded machine may need --wait or GRADLAB_SERVER_START_TIMEOUT_S)"
        raise TransientError(f"the Prefect server{why}; see {home / 'server.log'} and {home / 'daemon.log'}")
    return state


#: Set by a command that started the daemon and handed itself to the warm flow
#: (:mod:`gradlab.cli.warm_handoff`): the daemon's pid, so the warm flow's child waits for that
#: server as the one its command started, not as one another command is starting.
STARTED_DAEMON_ENV = "GRADLAB_STARTED_DAEMON"


def start_daemon(settings: Settings, *, say: Callable[[str], None]) -> int | None:
    """Start the background daemon unless one runs or is starting; returns its pid, else None.

    Does not wait: the daemon starts the server and, beside it, the warm learner and the warm flow
    (:mod:`gradlab.runs.daemon`). Says one line when it starts one.
    """
    spawned = _spawn(settings, port=None, idle_s=settings.daemon_idle_s, start_timeout_s=settings.server_start_timeout_s)
    if spawned is None:
        return None
    pid, port = spawned
    idle = settings.daemon_idle_s
    lasts = f"it stops after {describe_s(idle)} without use" if idle else "it stays up"
    say(f"Prefect: started a local server, a warm flow and a warm learner in the background at http://127.0.0.1:{port} "
        f"({lasts}; `gradlab server stop` stops it, GRADLAB_DAEMON=0 opts out)")
    return pid


def ensure_server(settings: Settings, *, say: Callable[[str], None],
                  waiting: Callable[[str, float | None], None] | None = None,
                  cancelled: Callable[[], bool] | None = None) -> ServerState | None:
    """The background server for a command that needs Prefect: reuse it, or start it, or None.

    None when ``settings.daemon`` is off (``GRADLAB_DAEMON=0``) or when no server answered in time;
    the command then runs on Prefect's ephemeral server, as it would alone. A server another
    command is starting is waited for at most :func:`expected_startup_s` (what starting one would
    take); one this command starts, at most ``settings.server_start_timeout_s``. Registers this
    process as a client (:func:`register_client`) so the server is not idle while it runs.

    Args:
        say: called with each line for the user (one when this command starts the server, one
            when it gives up on it).
        waiting: called once before waiting for a server to answer, with what is awaited and how
            long the last start took here (seconds; None before any start was measured).
        cancelled: ends the wait (None is returned, nothing said) once it returns True: the
            command was cancelled (Ctrl-C) meanwhile.
    """
    if not settings.daemon:
        return None
    state = running_server(settings)
    if state is None:
        home = prefect_home(settings)
        # A command that started one (or handed itself to this process after starting one) waits
        # for that one and never starts a second: a daemon that failed is not tried twice.
        mine = os.environ.get(STARTED_DAEMON_ENV, "")
        pid = int(mine) if mine.isdigit() else start_daemon(settings, say=say)
        if pid is not None:
            budget, waited_for = settings.server_start_timeout_s, pid
        else:
            budget, waited_for = expected_startup_s(settings), None
        if waiting is not None:
            whose = "the local Prefect server" if waited_for is not None else "the local Prefect server another command is starting"
            waiting(f"{whose} (at most {budget:,.0f} s)", measured_startup_s(settings))
        state = _wait_ready(settings, budget, waited_for, cancelled)
        if state is None:
            if cancelled is not None and cancelled():
                return None
            whose = "the local server this command started" if waited_for is not None else \
                "the local server another command is starting"
            why = "stopped before it answered" if waited_for is not None and not pid_alive(waited_for) else \
                f"did not answer within {budget:.0f} s"
            say(f"Prefect: {whose} {why} (see {home / 'daemon.log'}); this command uses Prefect's ephemeral "
                "server instead")
            return None
    register_client(settings)
    return state


def describe_s(seconds: float) -> str:
    """``1800`` → ``30 min``, ``90`` → ``90 s``, ``7200`` → ``2 h``: a duration as people say it."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 120:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def client_alive(path: Path) -> bool:
    """True while the process a client file names runs (same pid and start time: a recycled pid is not)."""
    try:
        pid = int(path.name)
        ticks = path.read_text().strip()
    except (OSError, ValueError):
        return False
    return _runs(pid, ticks)


def _runs(pid: int, ticks: str) -> bool:
    """True while process ``pid`` runs and started at ``ticks`` (empty: not recorded, any start)."""
    return pid_alive(pid) and (not ticks or start_ticks(pid) in (None, ticks))


_registered: set[Path] = set()


def register_client(settings: Settings) -> None:
    """Mark this process as using the server until it exits (``clients/<pid>``, removed at exit)."""
    directory = clients_dir(prefect_home(settings))
    path = directory / str(os.getpid())
    if path in _registered:
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(start_ticks(os.getpid()) or "")
    except OSError as e:  # the server then only counts this command's runs as activity
        log.warning("could not register with the local Prefect server: %s", e)
        return
    _registered.add(path)
    atexit.register(path.unlink, missing_ok=True)  # removing it also touches the folder: the last use


def warm_learner_dir(settings: Settings) -> Path | None:
    """The warm learner's folder (``gradlab.learn.zygote``) when this process may have it fork its
    learner, else None (a cold start).

    With the daemon on, always: its server is the one commands use. With ``GRADLAB_DAEMON=0``,
    only when this process's Prefect API (``PREFECT_API_URL`` / ``[prefect] api_url``) is the local
    server that keeps it: the opt-out means no background process serves a command that did not
    ask for it, but one pointed at that server by hand has asked.
    """
    # The zygote module (and pydantic) only where used here: a fresh shell's command and the daemon
    # then start the server ~50 ms sooner.
    from gradlab.learn.zygote import zygote_dir

    directory = zygote_dir(settings.home)
    if settings.daemon:
        return directory
    api = os.environ.get("PREFECT_API_URL") or settings.prefect_api_url
    state = read_state(settings)
    if api and state is not None and api.rstrip("/") == state.api_url.rstrip("/"):
        return directory
    return None


def flow_runs_dir(home: Path) -> Path:
    return home / "flow-runs"


def record_flow_run(settings: Settings, flow_run_id: str) -> Path | None:
    """Record that this process executes flow run ``flow_run_id`` (``flow-runs/<id>``: pid and start
    ticks), so the daemon can tell a Running flow run whose process was killed from a live one.

    The file outlives the flow body on purpose: the flow run's final state reaches Prefect only
    after the body returns, so the daemon removes the file once the process is gone (and sets the
    run Crashed if it is still Running then). Returns the file, or None where it could not be
    written (logged: the daemon then counts that flow run as use until it ends, as before).
    """
    directory = flow_runs_dir(prefect_home(settings))
    path = directory / flow_run_id
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{os.getpid()} {start_ticks(os.getpid()) or ''}")
    except OSError as e:
        log.warning("could not record flow run %s with the local Prefect server: %s", flow_run_id, e)
        return None
    return path


def flow_run_process_gone(path: Path) -> int | None:
    """The pid a ``flow-runs/<id>`` file names when that process no longer runs (a recycled pid, one
    with another start time, counts as gone); None while it runs or when the file cannot be read."""
    try:
        pid_text, _, ticks = path.read_text().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    return None if _runs(pid, ticks.strip()) else pid


#: Prefect settings every gradlab command sets for itself unless already set
#: (``gradlab.cli.local_flow.configure_prefect``): quiet logs, no telemetry. The warm flow imports Prefect with them.
PREFECT_CLIENT_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
}


def warm_processes(home: Path, *, keeper_pid: int, api_url: str | None = None) -> None:
    """Start the warm learner and the warm flow (``gradlab.cli.warm_flow``) beside the server where
    missing or stale (both: one process importing torch and SB3 once, ``zygote.start_zygote``'s
    ``learner_dir``). The warm flow imports Prefect with the settings a command using this server
    would have (``api_url``, :data:`PREFECT_CLIENT_DEFAULTS`): Prefect need not read them again.

    Raises:
        OSError: one could not be started.
    """
    from gradlab.learn import zygote as z

    env = {**PREFECT_CLIENT_DEFAULTS, **z.launch_environ()}
    if api_url is not None:
        env["PREFECT_API_URL"] = api_url
    learner = z.needs_zygote(z.zygote_dir(home))
    if z.needs_zygote(z.flow_zygote_dir(home), module=z.FLOW_MODULE, env=env):
        z.start_zygote(z.flow_zygote_dir(home), keeper_pid=keeper_pid, module=z.FLOW_MODULE, env=env,
                       learner_dir=z.zygote_dir(home) if learner else None)
    elif learner:
        z.start_zygote(z.zygote_dir(home), keeper_pid=keeper_pid)


def _warm_learner(settings: Settings, keeper_pid: int, api_url: str | None = None) -> None:
    """Start the zygotes beside the server if they are missing; a convenience, so a failure only warns."""
    try:
        warm_processes(settings.home, keeper_pid=keeper_pid, api_url=api_url)
    except OSError as e:
        log.warning("no warm learner or flow (%s): runs start fresh processes instead", e)


def stop_server(settings: Settings, grace_s: float = 30.0) -> bool:
    """Stop the background server and its warm learner; True if a daemon was running.

    SIGTERM to the daemon (which stops the server and the zygote and removes its files), then, if
    it is still there after ``grace_s`` seconds, SIGKILL of the daemon and of the server's process
    group. Without a live daemon, only stale files and stray zygotes are removed.
    """
    home = prefect_home(settings)
    if not daemon_alive(settings):
        clear_stale(home)
        _stop_zygotes(settings)
        return False
    deadline = time.monotonic() + grace_s
    state = read_state(settings)
    while state is None and time.monotonic() < deadline and daemon_alive(settings):  # it writes it first thing
        time.sleep(0.1)
        state = read_state(settings)
    if state is not None and _is_daemon(state.pid):
        try:
            os.kill(state.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    while daemon_alive(settings) and time.monotonic() < deadline:
        time.sleep(0.1)
    if state is None and daemon_alive(settings):  # it rewrites an unreadable server.json within a poll
        raise TransientError(f"a server daemon holds the lock on {home} but {state_file(home)} stayed unreadable "
                             f"for {grace_s:.0f} s: nothing stopped (see {home / 'daemon.log'})")
    if daemon_alive(settings) and state is not None:
        log.warning("the server's daemon %d did not stop within %.0f s: killing it", state.pid, grace_s)
        if _is_daemon(state.pid):
            os.kill(state.pid, signal.SIGKILL)
        if state.server_pid:
            stop_pid(state.server_pid, grace_s=1.0)
    _stop_zygotes(settings)
    clear_stale(home)
    return True


def _stop_zygotes(settings: Settings) -> None:
    from gradlab.learn.zygote import flow_zygote_dir, stop_zygotes, zygote_dir

    try:
        stop_zygotes(zygote_dir(settings.home))
        stop_zygotes(flow_zygote_dir(settings.home))
    except OSError as e:
        log.warning("could not stop the warm learner: %s", e)


def _is_daemon(pid: int) -> bool:
    """True when ``pid`` runs ``gradlab.runs.daemon`` (a recycled pid is never signalled)."""
    try:
        return b"gradlab.runs.daemon" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def stop_pid(pid: int, grace_s: float = 10.0) -> bool:
    """SIGTERM process group ``pid``, SIGKILL it after ``grace_s`` seconds; False if it was gone."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True
