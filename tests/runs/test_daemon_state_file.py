"""The background server's ``server.json``: a damaged or removed file is rewritten by its live daemon,
so later commands find the server again and ``gradlab server stop`` never reports a stop it did not do.

The daemon's watch loop runs here in a thread with a stand-in server process (``sleep``) and an API
port nobody listens on (counted as busy), so no Prefect server is started.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from gradlab.runs.daemon import Daemon
from gradlab.runs.server import ServerState, read_state_file, state_file, write_state


def _wait(condition, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_a_damaged_server_json_is_rewritten_by_the_live_daemon(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port with nothing listening: the flow-run count fails fast (busy)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tmp_path / "prefect"
    home.mkdir()
    daemon = Daemon(prefect_home=home, gradlab_home=tmp_path, port=port, idle_s=1.0, start_timeout_s=5.0)
    daemon.server = subprocess.Popen(["sleep", "120"])
    daemon.state = ServerState(**{**daemon.state.__dict__, "server_pid": daemon.server.pid, "ready": True})
    write_state(home, daemon.state)
    watcher = threading.Thread(target=daemon._watch, daemon=True)
    watcher.start()
    try:
        for damage in ('{"pid": 1, "url": "htt', "[1, 2]", None):
            if damage is None:
                state_file(home).unlink()
            else:
                state_file(home).write_text(damage)
            assert _wait(lambda: read_state_file(home) == daemon.state), damage
    finally:
        daemon.stopping = "test"
        watcher.join(timeout=30)
        daemon.server.kill()
        daemon.server.wait()
    assert not watcher.is_alive()
