"""The warm flow that starts the learner zygote off its own imports (``zygote.start_zygote(learner_dir=)``,
``gradlab.learn.zygote_server.serve_detached``): real processes, a real forked learner."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from gradlab.learn import zygote
from gradlab.outbox import Outbox
from gradlab.runs.paths import RunPaths
from gradlab.runs.process import LearnerProcess
from gradlab.runs.server import PREFECT_CLIENT_DEFAULTS
from tests.learn.conftest import BANDIT, make_spec, write_spec
from tests.learn.test_zygote import PPO, _alive, _wait

pytestmark = pytest.mark.slow  # real zygote processes that import torch, SB3 and Prefect

def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _flow_env(**extra: str) -> dict[str, str]:
    return {**PREFECT_CLIENT_DEFAULTS, **zygote.launch_environ(), **extra}


def test_the_warm_flow_forks_the_learner_zygote_off_its_imports(tmp_path: Path) -> None:
    learner_dir, flow_dir = tmp_path / "zygote", tmp_path / "zygote" / "flow"
    flow_pid = zygote.start_zygote(flow_dir, keeper_pid=os.getpid(), module=zygote.FLOW_MODULE, env=_flow_env(),
                                   learner_dir=learner_dir)
    try:
        # Both folders say a zygote is coming from the moment it is started: a command looking for a
        # learner waits for this one instead of starting a cold learner.
        assert zygote.starting_zygotes(learner_dir) == [flow_pid] == zygote.starting_zygotes(flow_dir)
        assert not zygote.needs_zygote(learner_dir) and not zygote.needs_zygote(
            flow_dir, module=zygote.FLOW_MODULE, env=_flow_env())
        learner = zygote.await_ready(learner_dir, timeout_s=180)
        assert len(learner) == 1 and learner[0].pid != flow_pid
        info = learner[0]
        # A process of its own: not the flow's child, its own session, the learner's fingerprint.
        assert _ppid(info.pid) != flow_pid and os.getsid(info.pid) != os.getsid(flow_pid)
        assert info.fingerprint == zygote.kind_fingerprint(zygote.LEARNER_MODULE)
        assert info.keeper_pid == os.getpid()
        assert not (learner_dir / f"{flow_pid}.pending").exists()
        flow = zygote.await_ready(flow_dir, timeout_s=180)
        assert [f.pid for f in flow] == [flow_pid]
        # Each logs to its own folder under its own name and pid.
        learner_log = (learner_dir / "zygote.log").read_text()
        assert f"zygote[{info.pid}] INFO: zygote {info.pid} ready after" in learner_log
        assert f"learner zygote {info.pid} forked off the warm flow's imports" in (flow_dir / "zygote.log").read_text()
        # The learner it forks trains like any other.
        run_id = "gradlab-20260101T000000-7a1c0e55"
        paths = RunPaths(tmp_path / run_id).ensure()
        write_spec(make_spec(BANDIT, PPO, timesteps=2048, checkpoint_freq=1024, run_id=run_id), paths.spec)
        process = LearnerProcess.start(paths, zygote=learner_dir)
        assert process.forked and _ppid(process.pid) == info.pid
        assert process.wait(120) == 0
        outbox = Outbox(paths.outbox)
        assert outbox.last("learner_finished").payload == {"final_step": 2048, "stop_reason": "budget"}
        outbox.close()
    finally:
        stopped = zygote.stop_zygotes(learner_dir) + zygote.stop_zygotes(flow_dir)
    assert stopped == 2
    _wait(lambda: not _alive(flow_pid) and not _alive(info.pid), 15, "both zygotes gone")


def test_a_warm_flow_whose_imports_fail_leaves_nothing_to_wait_for(tmp_path: Path) -> None:
    """Neither folder keeps a ``.pending`` file of a process that will never be ready."""
    broken = tmp_path / "broken"
    (broken / "torch").mkdir(parents=True)
    (broken / "torch" / "__init__.py").write_text("raise ImportError('a broken torch, for the test')\n")
    learner_dir, flow_dir = tmp_path / "zygote", tmp_path / "zygote" / "flow"
    env = _flow_env(PYTHONPATH=os.pathsep.join([str(broken), *sys.path[1:]]))
    flow_pid = zygote.start_zygote(flow_dir, keeper_pid=os.getpid(), module=zygote.FLOW_MODULE, env=env,
                                   learner_dir=learner_dir)
    _wait(lambda: not _alive(flow_pid), 60, "the warm flow exited")
    assert zygote.await_ready(learner_dir, timeout_s=5) == [] and zygote.await_ready(flow_dir, timeout_s=5) == []
    assert list(learner_dir.glob("*.pending")) == [] and list(flow_dir.glob("*.pending")) == []
    assert "a broken torch, for the test" in (flow_dir / "zygote.log").read_text()


def test_a_learner_zygote_killed_while_importing_is_not_waited_for(tmp_path: Path) -> None:
    """It is "starting" for exactly as long as it lives: its own ``.pending`` replaces the warm
    flow's in its folder before it imports, so its death is seen, and a new one may start."""
    learner_dir, flow_dir = tmp_path / "zygote", tmp_path / "zygote" / "flow"
    flow_pid = zygote.start_zygote(flow_dir, keeper_pid=os.getpid(), module=zygote.FLOW_MODULE, env=_flow_env(),
                                   learner_dir=learner_dir)
    try:
        importing = _wait(lambda: [p for p in zygote.starting_zygotes(learner_dir) if p != flow_pid], 180,
                          "the learner zygote forked off the warm flow")
        assert zygote.starting_zygotes(learner_dir) == importing  # the flow's .pending there is gone
        os.kill(importing[0], signal.SIGKILL)
        _wait(lambda: not _alive(importing[0]), 10, "the learner zygote gone")
        started = time.monotonic()
        assert zygote.await_ready(learner_dir) == [] and time.monotonic() - started < 5.0
        assert zygote.needs_zygote(learner_dir) and list(learner_dir.glob("*.pending")) == []
        assert [f.pid for f in zygote.await_ready(flow_dir, timeout_s=180)] == [flow_pid]  # the flow serves on
    finally:
        zygote.stop_zygotes(learner_dir)
        zygote.stop_zygotes(flow_dir)
    _wait(lambda: not _alive(flow_pid), 15, "the warm flow gone")


def _kernel_thread() -> int | None:
    """A live process with an empty command line that is not a zombie: a kernel thread."""
    for entry in sorted(Path("/proc").iterdir(), key=lambda p: (len(p.name), p.name)):
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes() == b"" and _alive(int(entry.name)):
                    return int(entry.name)
            except OSError:
                continue
    return None


def test_an_old_pending_file_naming_a_kernel_thread_is_stale(tmp_path: Path) -> None:
    """An empty ``/proc/PID/cmdline`` means "in exec" only just after the file was written; later it
    is a kernel thread (a file left from before a reboot): never waited for, never signalled."""
    pid = _kernel_thread()
    if pid is None:
        pytest.skip("no kernel thread is visible in this PID namespace")
    pending = tmp_path / f"{pid}.pending"
    pending.write_text("0")
    assert zygote.starting_zygotes(tmp_path) == [pid]  # just written: may be a zygote mid-exec
    old = time.time() - zygote.EXEC_GRACE_S - 1
    os.utime(pending, (old, old))
    assert zygote.starting_zygotes(tmp_path) == [] and not pending.exists()
    pending.write_text("0")
    os.utime(pending, (old, old))
    assert zygote.stop_zygotes(tmp_path, grace_s=0.5) == 0 and _alive(pid)
