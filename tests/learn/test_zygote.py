"""The warm learner parent (``gradlab.learn.zygote``): real zygote processes, real forked learners."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradlab.learn import zygote
from gradlab.outbox import Outbox
from gradlab.runs.paths import RunPaths
from gradlab.runs.process import LearnerProcess
from tests.learn.conftest import BANDIT, make_spec, write_spec

pytestmark = pytest.mark.slow  # real zygote processes that import torch and SB3, real learners

PPO = {"id": "sb3.ppo", "config": {"n_steps": 64, "batch_size": 128, "n_epochs": 2, "learning_rate": 3.0e-3}}


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"{what} within {timeout_s} s")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory):
    """One ready zygote kept by this test process; stopped at the end."""
    directory = tmp_path_factory.mktemp("zygote")
    pid = zygote.start_zygote(directory, keeper_pid=os.getpid())
    assert [p for p in zygote.starting_zygotes(directory)] == [pid]
    infos = _wait(lambda: zygote.ready_zygotes(directory), 180, "zygote ready")
    assert infos[0].pid == pid and not (directory / f"{pid}.pending").exists()
    yield directory, infos[0]
    zygote.stop_zygotes(directory)
    _wait(lambda: not _alive(pid), 10, "zygote gone")


def _run_dir(tmp_path: Path, timesteps: int, run_id: str = "gradlab-20260101T000000-2y90e7e5") -> RunPaths:
    paths = RunPaths(tmp_path / run_id).ensure()
    write_spec(make_spec(BANDIT, PPO, timesteps=timesteps, checkpoint_freq=1024, run_id=run_id), paths.spec)
    return paths


def test_forked_learner_is_set_up_like_a_started_one(warm, tmp_path: Path) -> None:
    directory, info = warm
    paths = _run_dir(tmp_path, timesteps=10_000_000)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    args = ["--spec", str(paths.spec), "--run-dir", str(paths.root), "--parent-pid", str(os.getpid())]
    pid = zygote.fork_learner(directory, args, log_path=paths.learner_log, cwd=cwd)
    assert pid is not None
    try:
        # Its own session and process group; the zygote is its parent; the requester's cwd.
        assert os.getpgid(pid) == pid and os.getsid(pid) == pid
        assert int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == info.pid
        assert os.readlink(f"/proc/{pid}/cwd") == str(cwd)
        outbox = Outbox(paths.outbox)
        _wait(lambda: outbox.count("learner_started"), 30, "learner_started")
        assert outbox.last("learner_started").payload["pid"] == pid
        # The ordinary stop protocol works on it (not our child: its end is read from the outbox).
        handle = LearnerProcess.attach(pid, paths)
        assert handle.exit_code() is None
        assert handle.stop("test over", grace_s=20.0) == 0
        finished = outbox.last("learner_finished").payload
        assert finished["stop_reason"] == "stop_requested"
        outbox.close()
    finally:
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
    log = paths.learner_log.read_text()
    assert "learner finished at step" in log and json.loads(log.strip().splitlines()[-1])["stop_reason"] == "stop_requested"
    # The zygote reaped its child and still serves.
    _wait(lambda: not Path(f"/proc/{pid}").exists(), 5, "child reaped")
    assert zygote.ready_zygotes(directory)[0].pid == info.pid


def test_learner_process_start_uses_the_zygote_and_trains_to_its_budget(warm, tmp_path: Path) -> None:
    directory, info = warm
    paths = _run_dir(tmp_path, timesteps=2048, run_id="gradlab-20260101T000000-b0d9e7a1")
    learner = LearnerProcess.start(paths, zygote=directory)
    assert learner.forked and learner._popen is None  # forked by the zygote, not our child
    assert learner.wait(60) == 0
    outbox = Outbox(paths.outbox)
    assert outbox.last("learner_finished").payload == {"final_step": 2048, "stop_reason": "budget"}
    assert outbox.count("checkpoint_ready") == 2
    outbox.close()


def test_a_killed_forked_learner_reports_the_signal(warm, tmp_path: Path) -> None:
    """The supervisor is not the forked learner's parent: the zygote records its exit status."""
    directory, _ = warm
    paths = _run_dir(tmp_path, timesteps=10_000_000, run_id="gradlab-20260101T000000-9e1f0c2b")
    learner = LearnerProcess.start(paths, zygote=directory)
    assert learner.forked and learner._popen is None
    outbox = Outbox(paths.outbox)
    _wait(lambda: outbox.count("metrics") >= 1, 60, "training under way")
    outbox.close()
    learner.kill()
    assert learner.exit_code() == -signal.SIGKILL
    assert (paths.root / f"learner-{learner.pid}.exit").read_text() == "-9"


def test_forked_learner_stops_when_its_supervisor_dies(warm, tmp_path: Path) -> None:
    directory, _ = warm
    paths = _run_dir(tmp_path, timesteps=10_000_000, run_id="gradlab-20260101T000000-5b1d0e4d")
    supervisor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    args = ["--spec", str(paths.spec), "--run-dir", str(paths.root), "--parent-pid", str(supervisor.pid)]
    pid = zygote.fork_learner(directory, args, log_path=paths.learner_log)
    assert pid is not None
    try:
        outbox = Outbox(paths.outbox)
        _wait(lambda: outbox.count("metrics") >= 2, 60, "training under way")
        supervisor.kill()
        supervisor.wait()
        _wait(lambda: outbox.count("learner_finished"), 30, "learner_finished after the supervisor died")
        assert outbox.last("learner_finished").payload["stop_reason"] == "supervisor_lost"
        outbox.close()
    finally:
        supervisor.kill()
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_no_zygote_or_other_import_settings_fall_back_to_a_new_process(warm, tmp_path: Path) -> None:
    directory, info = warm
    paths = _run_dir(tmp_path, timesteps=1024)
    assert zygote.fork_learner(tmp_path / "empty", ["--spec", str(paths.spec)], log_path=paths.learner_log) is None
    env = {**os.environ, "OMP_NUM_THREADS": "7"}  # read when torch is imported: the zygote's value differs
    assert info.import_env.get("OMP_NUM_THREADS") != "7"
    assert zygote.fork_learner(directory, ["--spec", str(paths.spec)], log_path=paths.learner_log, env=env) is None
    assert zygote.ready_zygotes(directory)[0].pid == info.pid  # not retired: it still serves others
    assert not paths.learner_log.exists()


def test_a_zygote_with_other_code_is_retired_not_used(warm, tmp_path: Path) -> None:
    _, info = warm
    # A second zygote folder whose only entry claims another fingerprint, pointing at a fresh zygote.
    stale_dir = tmp_path / "stale"
    pid = zygote.start_zygote(stale_dir, keeper_pid=os.getpid())
    try:
        real = _wait(lambda: zygote.ready_zygotes(stale_dir), 180, "second zygote ready")[0]
        (stale_dir / f"{pid}.json").write_text(real.model_copy(update={"fingerprint": "0" * 64}).model_dump_json())
        paths = _run_dir(tmp_path, timesteps=1024)
        assert zygote.fork_learner(stale_dir, ["--spec", str(paths.spec)], log_path=paths.learner_log) is None
        _wait(lambda: not _alive(pid), 10, "stale zygote retired")
        assert zygote.ready_zygotes(stale_dir) == []
    finally:
        zygote.stop_zygotes(stale_dir)


def test_a_zygote_exits_when_its_keeper_is_gone(tmp_path: Path) -> None:
    keeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pid = zygote.start_zygote(tmp_path, keeper_pid=keeper.pid)
    try:
        _wait(lambda: zygote.ready_zygotes(tmp_path), 180, "zygote ready")
        keeper.kill()
        keeper.wait()
        _wait(lambda: not _alive(pid), 10, "zygote gone after its keeper")
        assert not (tmp_path / f"{pid}.json").exists()
        # None left: a new one starts (kept by this process, so it cannot outlive the test even if
        # it is still importing when stop_zygotes below runs).
        assert zygote.ensure_zygote(tmp_path, keeper_pid=os.getpid()) is not None
    finally:
        keeper.kill()
        zygote.stop_zygotes(tmp_path)


def test_a_malformed_request_is_answered_and_the_zygote_keeps_serving(warm) -> None:
    directory, info = warm
    assert "error" in zygote._request(info.address, {"op": "fork", "argv": ["x"]})
    assert "unknown op" in zygote._request(info.address, {"op": "launch"})["error"]
    for payload in (b"[1]\n", b"null\n", b"5\n"):  # valid JSON, not an object
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(info.address)
            s.sendall(payload)
            assert json.loads(zygote.read_line(s)) == {"error": "expected a JSON object"}
    assert zygote.ready_zygotes(directory)[0].pid == info.pid


def test_a_silent_client_does_not_stall_the_zygote(warm, tmp_path: Path) -> None:
    directory, info = warm
    paths = _run_dir(tmp_path, timesteps=1024, run_id="gradlab-20260101T000000-51e9c0a7")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.connect(info.address)  # and never writes
        started = time.monotonic()
        learner = LearnerProcess.start(paths, zygote=directory)
        waited = time.monotonic() - started
    assert learner.forked and waited < zygote.READ_TIMEOUT_S + 3.0
    assert learner.wait(60) == 0


def test_a_requester_that_goes_away_gets_no_learner(warm, tmp_path: Path) -> None:
    """A requester that gave up (and started a learner of its own) must not get a second one."""
    directory, info = warm
    paths = _run_dir(tmp_path, timesteps=1024, run_id="gradlab-20260101T000000-90a3e11c")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(info.address)
        s.sendall(json.dumps({"op": "fork", "argv": ["--spec", str(paths.spec), "--run-dir", str(paths.root)],
                              "env": dict(os.environ), "cwd": str(tmp_path), "log": str(paths.learner_log),
                              "exit_file": str(paths.root / "learner-{pid}.exit")}).encode() + b"\n")
        pid = json.loads(zygote.read_line(s))["pid"]
    # Closed without confirming: the child is killed before it runs the learner.
    exit_file = paths.root / f"learner-{pid}.exit"
    _wait(exit_file.exists, 10, "the unborn learner reaped")
    assert int(exit_file.read_text()) in (-signal.SIGKILL, 1)
    assert not paths.outbox.exists()
    assert zygote.ready_zygotes(directory)[0].pid == info.pid


def test_a_recycled_pid_is_never_taken_for_a_zygote(tmp_path: Path) -> None:
    """A zygote killed by SIGKILL leaves its files; its pid may name another process later."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        info = zygote.ZygoteInfo(pid=other.pid, address="\0nowhere", fingerprint=zygote.fingerprint(),
                                 import_env=zygote.import_env(os.environ), keeper_pid=None, ready_at=0.0)
        (tmp_path / f"{other.pid}.json").write_text(info.model_dump_json())
        (tmp_path / f"{other.pid}.pending").write_text("0")
        assert zygote.ready_zygotes(tmp_path) == [] and zygote.starting_zygotes(tmp_path) == []
        assert not (tmp_path / f"{other.pid}.json").exists() and not (tmp_path / f"{other.pid}.pending").exists()
        (tmp_path / f"{other.pid}.json").write_text(info.model_dump_json())
        assert zygote.stop_zygotes(tmp_path, grace_s=1.0) == 0
        assert other.poll() is None  # untouched
    finally:
        other.kill()
        other.wait()
