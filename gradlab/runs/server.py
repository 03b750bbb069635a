"""A local Prefect server kept up between commands (``gradlab server start|stop|status``).

Prefect's ephemeral mode starts a server subprocess for every command (12–20 s here, see
docs/ARCHITECTURE.md, field notes); a server kept running on 127.0.0.1 costs that once. Its state file
``$GRADLAB_HOME/prefect/server.json`` records pid and URL; ``gradlab train`` uses the server when
the state file names a live, healthy one and ``PREFECT_API_URL`` is not set. Beside the server runs
a warm learner parent (``gradlab.learn.zygote``, kept by the server's pid), so a learner starts
with its imports already done.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gradlab.errors import TransientError
from gradlab.learn.zygote import ensure_zygote, stop_zygotes, zygote_dir
from gradlab.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerState:
    pid: int
    url: str
    home: str

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"


def prefect_home(settings: Settings) -> Path:
    return settings.home / "prefect"


def _state_file(settings: Settings) -> Path:
    return prefect_home(settings) / "server.json"


def healthy(api_url: str, timeout_s: float = 1.0) -> bool:
    """True when ``GET {api_url}/health`` answers 200 within ``timeout_s`` seconds."""
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout_s) as r:
            return r.status == 200
    except OSError:
        return False


def running_server(settings: Settings) -> ServerState | None:
    """The recorded server if it is alive and healthy, else None."""
    path = _state_file(settings)
    try:
        state = ServerState(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    try:
        os.kill(state.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return state if healthy(state.api_url) else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(settings: Settings, *, port: int | None = None, timeout_s: float = 90.0) -> ServerState:
    """Start ``prefect server start`` on 127.0.0.1 in the background and wait until healthy.

    Returns the running server when one is already up. Raises ``TransientError`` when it does not
    become healthy within ``timeout_s`` seconds (its log is ``$GRADLAB_HOME/prefect/server.log``).
    """
    existing = running_server(settings)
    if existing is not None:
        _warm_learner(settings, existing.pid)
        return existing
    home = prefect_home(settings)
    home.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    with (home / "server.log").open("ab") as log:
        popen = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port),
             "--analytics-off"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )
    state = ServerState(pid=popen.pid, url=f"http://127.0.0.1:{port}", home=str(home))
    # A warm learner parent beside the server: it imports while the server starts (see gradlab.learn.zygote).
    _warm_learner(settings, popen.pid)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise TransientError(f"prefect server exited with {popen.returncode}; see {home / 'server.log'}")
        if healthy(state.api_url):
            _state_file(settings).write_text(json.dumps(state.__dict__))
            return state
        time.sleep(0.25)
    stop_pid(popen.pid)
    raise TransientError(f"prefect server not healthy after {timeout_s:.0f} s; see {home / 'server.log'}")


def _warm_learner(settings: Settings, server_pid: int) -> None:
    """Start the zygote beside the server; a convenience, so a failure only warns."""
    try:
        ensure_zygote(zygote_dir(settings.home), keeper_pid=server_pid)
    except OSError as e:
        log.warning("no warm learner (%s): runs start a fresh learner process instead", e)


def stop_server(settings: Settings) -> bool:
    """Stop the recorded server (SIGTERM, then SIGKILL of its group) and its zygote. True if a server was running."""
    try:
        stop_zygotes(zygote_dir(settings.home))
    except OSError as e:
        log.warning("could not stop the warm learner: %s", e)
    path = _state_file(settings)
    try:
        state = ServerState(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return False
    stopped = stop_pid(state.pid)
    path.unlink(missing_ok=True)
    return stopped


def stop_pid(pid: int, grace_s: float = 10.0) -> bool:
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
