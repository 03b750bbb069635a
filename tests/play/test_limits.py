"""The player's resources are bounded: a cap on live playback workers, a closed socket cancels its
worker, the session past the cap is told why, and Ctrl-C stops the server with a session open."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gradlab.play.protocol import PROTOCOL_VERSION
from tests.play.conftest import CARTPOLE_RUN_ID, RunningPlayer, running_player, write_cartpole_run

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MAX_SESSIONS = 2
#: Resident memory one playback worker may hold (torch, SB3, gymnasium and a CartPole session: about
#: 400 MB measured); the flood's total is held to the cap's workers and the reserve at this much each.
WORKER_RSS_BOUND = 700 * 2**20


def _workers(before: set[int]) -> list[psutil.Process]:
    """Live playback worker processes (multiprocessing spawn children of this process started by the test)."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if (proc.pid not in before and proc.status() != psutil.STATUS_ZOMBIE
                    and "spawn_main" in " ".join(proc.cmdline())):
                out.append(proc)
        except psutil.NoSuchProcess:
            continue
    return out


def _rss(procs: list[psutil.Process]) -> int:
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def _connect(player: RunningPlayer):
    from websockets.sync.client import connect

    return connect(f"ws://127.0.0.1:{player.config.port}/api/play", additional_headers={"Origin": player.base},
                   open_timeout=60, max_size=None)


def _hello(player: RunningPlayer) -> str:
    return json.dumps({"type": "hello", "protocol": PROTOCOL_VERSION, "token": player.token,
                       "run_id": CARTPOLE_RUN_ID, "step": 64, "fps": 0})


def _until(predicate, what: str, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _ready(ws) -> dict:
    msg = json.loads(ws.recv(timeout=180))
    assert msg["type"] == "ready", msg
    return msg


def _plays(ws) -> None:
    """The session sends a step and its JPEG frame."""
    while True:
        msg = ws.recv(timeout=120)
        if isinstance(msg, bytes):
            assert msg[12:14] == b"\xff\xd8"
            return
        assert json.loads(msg)["type"] != "error", msg


def _session_that_plays(player: RunningPlayer) -> None:
    """Connect until a session plays: while leavers' workers are being reclaimed the cap may still be
    reached, and the answer is then the cap's message."""
    deadline = time.monotonic() + 300
    while True:
        with _connect(player) as ws:
            ws.send(_hello(player))
            msg = json.loads(ws.recv(timeout=180))
            if msg["type"] == "ready":
                _plays(ws)
                return
            assert msg["type"] == "error" and "--max-sessions" in msg["message"], msg
        assert time.monotonic() < deadline, "no session could play"
        _until(lambda: len(player.config.workers) < MAX_SESSIONS, "leavers kept their workers")


def test_fifty_connect_disconnects_stay_bounded_the_cap_is_told_and_a_new_session_plays(gradlab_home: Path) -> None:
    from websockets.exceptions import ConnectionClosed

    from gradlab.checkpoints.resolve import resolve_checkpoint

    write_cartpole_run(gradlab_home / "runs")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with running_player(max_sessions=MAX_SESSIONS) as player:
        player.config.catalog.pin(resolve_checkpoint(f"{CARTPOLE_RUN_ID}:64"))
        player.config.prestart()  # as `gradlab play` does
        peak_count = peak_rss = 0
        for i in range(50):
            if i % 25 == 24:  # twice, a session that plays, then leaves
                _session_that_plays(player)
            else:
                with _connect(player) as ws:
                    ws.send(_hello(player))
            live = _workers(before)
            peak_count, peak_rss = max(peak_count, len(live)), max(peak_rss, _rss(live))
        assert peak_count <= MAX_SESSIONS + 1, peak_count  # the cap and the warm reserve, never more
        assert peak_rss <= (MAX_SESSIONS + 1) * WORKER_RSS_BOUND, peak_rss / 2**20
        # Every leaver's worker is cancelled: none stays counted against the cap.
        _until(lambda: not player.config.workers, "workers of closed sockets were not cancelled")
        assert len(_workers(before)) <= 1  # the reserve

        # Two live sessions take the cap; a third is told why and by what flag; closing one frees it.
        first, second = _connect(player), _connect(player)
        try:
            for ws in (first, second):
                ws.send(_hello(player))
            for ws in (first, second):
                _ready(ws)
                _plays(ws)
            with _connect(player) as third:
                third.send(_hello(player))
                busy = json.loads(third.recv(timeout=60))
                assert busy["type"] == "error"
                assert f"limit of {MAX_SESSIONS} live playback sessions" in busy["message"]
                assert "--max-sessions" in busy["message"]
                with pytest.raises(ConnectionClosed) as closed:
                    third.recv(timeout=60)
                assert closed.value.rcvd.code == 4429
            assert len(_workers(before)) <= MAX_SESSIONS + 1
        finally:
            first.close()
        _until(lambda: len(player.config.workers) < MAX_SESSIONS, "a closed session kept its worker")
        _session_that_plays(player)  # a new session still plays
        second.close()
    _until(lambda: not _workers(before), "workers outlived the player")


def test_ctrl_c_with_a_session_playing_stops_the_server_and_every_worker(gradlab_home: Path) -> None:
    from websockets.sync.client import connect

    write_cartpole_run(gradlab_home / "runs")
    proc = subprocess.Popen([sys.executable, "-m", "gradlab.cli.app", "play", f"{CARTPOLE_RUN_ID}:64", "--no-open",
                             "--fps", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=os.environ.copy())
    try:
        url = proc.stdout.readline().strip()
        origin, _, token = url.partition("#token=")
        origin = origin.split("/runs/")[0]
        port = int(origin.rsplit(":", 1)[1])
        with connect(f"ws://127.0.0.1:{port}/api/play", additional_headers={"Origin": origin}, open_timeout=60,
                     max_size=None) as ws:
            ws.send(json.dumps({"type": "hello", "protocol": PROTOCOL_VERSION, "token": token,
                                "run_id": CARTPOLE_RUN_ID, "step": 64, "fps": 0}))
            _ready(ws)
            _plays(ws)
            workers = psutil.Process(proc.pid).children(recursive=True)
            assert workers  # the session's worker and the reserve
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 0, proc.stderr.read()
        assert "stopped" in proc.stderr.read()
        # Every descendant ends; multiprocessing's resource tracker (a grandchild) leaves once its pipe
        # closes with the server, which on a loaded machine can be a moment after the server's exit.
        _, alive = psutil.wait_procs(workers, timeout=30)
        assert not [w for w in alive if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
