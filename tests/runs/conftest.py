"""Fixtures for end-to-end runs: one real Prefect server on 127.0.0.1 for the whole session.

Every ``gradlab train`` subprocess of these tests talks to that server (``PREFECT_API_URL``), as
a user with ``gradlab server start`` would; the server is always stopped, failures included.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.process_env import session_environ, subprocess_env

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, int]]:
    """(API URL, the server's GRADLAB_HOME, server pid): what ``gradlab server start`` gives a user,
    its warm learner zygote included."""
    from gradlab.runs.server import start_server, stop_server
    from gradlab.settings import load_settings

    home = tmp_path_factory.mktemp("prefect_server_home")
    old = os.environ.get("GRADLAB_HOME")
    os.environ["GRADLAB_HOME"] = str(home)
    try:
        settings = load_settings()
        with session_environ():  # its warm learner imports with the environment commands get
            # Never idle-stopped: the suite's commands reach it by PREFECT_API_URL, which the idle clock
            # does not count, and a loaded machine's session outlasts the 30 min default.
            state = start_server(settings, timeout_s=float(os.environ.get("GRADLAB_SERVER_START_TIMEOUT_S") or 120),
                                 idle_s=0)
    finally:
        if old is None:
            os.environ.pop("GRADLAB_HOME", None)
        else:
            os.environ["GRADLAB_HOME"] = old
    try:
        yield state.api_url, home, state.pid
    finally:
        stop_server(settings)


@pytest.fixture(scope="session")
def prefect_api(prefect_server: tuple[str, Path, int]) -> str:
    return prefect_server[0]


def gradlab_env(prefect_api: str, **extra: str) -> dict[str, str]:
    env = subprocess_env(**{"PREFECT_API_URL": prefect_api, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                            "WANDB_MODE": "offline", "WANDB_SILENT": "true", **extra})
    env.pop("GRADLAB_EXPERIMENTS", None)
    return env


def run_gradlab(args: list[str], env: dict[str, str], timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradlab.cli.app", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=timeout_s)


def start_gradlab(args: list[str], env: dict[str, str], *, own_group: bool = False) -> subprocess.Popen[str]:
    """Start ``gradlab ARGS``; ``own_group`` puts it in a process group of its own, as a shell puts a
    foreground command (so ``os.killpg(proc.pid, SIGINT)`` is a terminal's Ctrl-C)."""
    return subprocess.Popen([sys.executable, "-m", "gradlab.cli.app", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=env, start_new_session=own_group)


def last_json_line(stdout: str) -> dict:
    lines = [line for line in stdout.strip().splitlines() if line.strip()]
    assert lines, "no stdout"
    return json.loads(lines[-1])


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"{what}: not within {timeout_s} s")


def only_run_dir(home: Path) -> Path:
    runs = sorted((home / "runs").glob("gradlab-*"))
    return runs[-1] if runs else None  # type: ignore[return-value]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return any(pid_alive(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit() and _pgid(int(p.name)) == pgid)


def _pgid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[3])
    except (OSError, ValueError, IndexError):
        return None


def interrupt(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)


def stop_outside_a_write(pids: list[int], outbox: Path) -> None:
    """SIGSTOP ``pids`` at a moment none of them holds a write transaction on ``outbox`` (one stopped
    inside a millisecond write would keep SQLite's lock for the whole pause; the scenario is a run
    paused between writes)."""
    for _ in range(200):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass  # a short-lived helper of the run (a subprocess that already ended)
        probe = sqlite3.connect(str(outbox), timeout=0.2, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")  # takes the write lock only when nobody holds it
            probe.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            resume(pids)  # stopped mid-write: let it finish, then try again
            time.sleep(0.05)
        finally:
            probe.close()
    raise AssertionError(f"the run held {outbox}'s write lock at each of 200 pauses")


def resume(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
