"""The local Prefect server started in the background on first use (``gradlab.runs.server``).

Real daemons, real ``prefect server`` processes, each under the test's own GRADLAB_HOME with
``GRADLAB_DAEMON=1`` (every other test runs with it off, tests/conftest.py). Every test stops what
it started, failures included; waits are on conditions.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gradlab.learn.watch import pid_alive
from gradlab.learn.zygote import flow_zygote_dir, ready_zygotes, zygote_dir
from gradlab.runs.server import (
    clients_dir,
    daemon_alive,
    ensure_server,
    flow_runs_dir,
    prefect_home,
    read_state,
    start_ticks,
    stop_server,
    try_lock,
)
from gradlab.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
STARTED = "Prefect: started a local server, a warm flow and a warm learner in the background at http://127.0.0.1:"


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "GRADLAB_DAEMON": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true", **extra}
    env.pop("PREFECT_API_URL", None)
    env.pop("GRADLAB_EXPERIMENTS", None)
    return env


def gradlab(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradlab.cli.app", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=timeout)


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"{what}: not within {timeout_s} s")


@pytest.fixture
def settings(gradlab_home: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GRADLAB_DAEMON", "1")
    s = load_settings()
    assert s.daemon and s.home == gradlab_home
    yield s
    stop_server(s)  # whatever a test left running


def _nothing_left(home: Path, pids: list[int]) -> None:
    """No process of the daemon's lives, and no daemon file stays (logs, Prefect's database and the
    measured start-up excepted)."""
    for pid in pids:
        wait_for(lambda pid=pid: not pid_alive(pid), 30, f"process {pid} gone")
    phome = home / "prefect"
    assert not (phome / "server.json").exists() and not (phome / "clients").exists()
    assert sorted(p.name for p in phome.iterdir() if p.suffix in (".json", ".partial", ".pending")) == ["startup.json"]
    for directory in (zygote_dir(home), flow_zygote_dir(home)):
        assert not list(directory.glob("*.json")) and not list(directory.glob("*.pending"))
        assert not list(directory.glob("*.exit"))  # the warm flow's records of the commands it ran
    records = phome / "flow-runs"
    assert not records.is_dir() or list(records.iterdir()) == []  # every flow run had ended


def test_a_stale_state_file_is_removed(settings) -> None:
    """A daemon killed with SIGKILL leaves server.json; with no one holding the lock it is stale."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    phome = prefect_home(settings)
    phome.mkdir(parents=True)
    (phome / "server.json").write_text(json.dumps({"pid": dead.pid, "url": "http://127.0.0.1:9", "home": str(phome)}))
    (phome / "clients").mkdir()
    (phome / "clients" / str(dead.pid)).write_text("1")
    out = gradlab("server", "status", env=_env())
    assert out.returncode == 1 and out.stdout.splitlines()[0] == f"not running (GRADLAB_HOME {settings.home})"
    assert not (phome / "server.json").exists() and not (phome / "clients").exists()
    out = gradlab("server", "stop", env=_env())
    assert out.returncode == 0 and out.stdout.strip() == f"no server was running (GRADLAB_HOME {settings.home})"


def test_the_opt_out_uses_a_warm_learner_only_when_pointed_at_its_server(gradlab_home: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A server an earlier daemon left up keeps its warm learner; GRADLAB_DAEMON=0 commands start
    their learner cold unless their Prefect API is that server (set by hand)."""
    from gradlab.learn.zygote import zygote_dir
    from gradlab.runs.server import ServerState, warm_learner_dir, write_state

    phome = gradlab_home / "prefect"
    phome.mkdir(parents=True, exist_ok=True)
    write_state(phome, ServerState(pid=os.getpid(), url="http://127.0.0.1:4321", home=str(phome)))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("GRADLAB_DAEMON", "1")
    assert warm_learner_dir(load_settings()) == zygote_dir(gradlab_home)
    monkeypatch.setenv("GRADLAB_DAEMON", "0")
    assert warm_learner_dir(load_settings()) is None  # Prefect's ephemeral server: nothing of the daemon's
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9999/api")
    assert warm_learner_dir(load_settings()) is None  # another server
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4321/api/")
    assert warm_learner_dir(load_settings()) == zygote_dir(gradlab_home)


@pytest.mark.slow
def test_a_cold_learners_line_says_why_it_is_cold(settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's first line names what keeps a warm learner for the next run: the local server's
    daemon when one runs (the run restarts its warm processes), else nothing (another server's API,
    or the daemon opted out)."""
    from gradlab.cli.train_cmds import _learner_start

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9999/api")  # another server: no daemon here
    assert _learner_start(True, load_settings()) == "warm: forked by the warm learner"
    assert _learner_start(False, load_settings()).endswith(
        "no local server runs here to keep a warm learner (the Prefect API is the one PREFECT_API_URL or "
        "[prefect] api_url names; `gradlab server start` starts a local one)")
    monkeypatch.setenv("GRADLAB_DAEMON", "0")
    assert _learner_start(False, load_settings()).endswith("GRADLAB_DAEMON=0 keeps no warm learner")
    monkeypatch.setenv("GRADLAB_DAEMON", "1")
    out = gradlab("server", "start", env=_env())
    assert out.returncode == 0, out.stderr
    state = read_state(settings)
    # Pointed at the local server by hand, or by default: its daemon keeps the warm learner.
    monkeypatch.setenv("PREFECT_API_URL", f"{state.api_url}")
    assert _learner_start(False, load_settings()).endswith("the local server's warm learner serves the next run")
    monkeypatch.delenv("PREFECT_API_URL")
    assert _learner_start(False, load_settings()).endswith("the local server's warm learner serves the next run")


def test_opt_out_starts_nothing(settings) -> None:
    """GRADLAB_DAEMON=0: experiment commands refuse as before; train's Prefect is the ephemeral one."""
    out = gradlab("experiment", "list", env=_env(GRADLAB_DAEMON="0"))
    assert out.returncode == 1
    assert "no Prefect server" in out.stderr and "GRADLAB_DAEMON=0" in out.stderr
    code = "from gradlab.cli.local_flow import configure_prefect; print(configure_prefect())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env=_env(GRADLAB_DAEMON="0"), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ephemeral (GRADLAB_DAEMON=0: Prefect starts a server inside this command)"
    assert "Prefect: started" not in out.stderr
    assert not (prefect_home(settings) / "server.json").exists() and not daemon_alive(settings)


@pytest.mark.parametrize(("args", "said"), [
    (["nosuch/ppo"], "unknown goal 'nosuch'; known goals: "),
    (["CartPole-v1/ppp"], "goal 'CartPole-v1' has no recipe 'ppp' (did you mean CartPole-v1/ppo?)"),
    (["CartPole-v1"], "'CartPole-v1' is a goal; name one of its recipes: GOAL/RECIPE, e.g. CartPole-v1/a2c, "),
    (["CartPole-v1/ppo", "--seed", "-1"], "--seed: expected 0..1048576, found -1"),
])
def test_a_fresh_shells_train_of_a_bad_ref_or_seed_starts_nothing(settings, args: list[str], said: str) -> None:
    """A mistyped GOAL/RECIPE or a seed out of range in a fresh shell is refused before the daemon
    starts: one line, exit 1, no daemon, no server (no state file, no daemon log)."""
    out = gradlab("train", *args, env=_env(), timeout=120)
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith(f"error: {said}"), out.stderr
    assert "Prefect: started" not in out.stderr and "starting:" not in out.stderr
    assert not daemon_alive(settings)
    assert not (prefect_home(settings) / "server.json").exists() and not (prefect_home(settings) / "daemon.log").exists()


def test_a_daemon_someone_else_is_starting_is_waited_for_no_longer_than_a_start(settings) -> None:
    """The lock held (a daemon is starting) and never ready: a command gives up after what a start
    takes here (twice the last measured one, 1 s, plus 2 s), says so, and falls back to Prefect's
    ephemeral server."""
    phome = prefect_home(settings)
    phome.mkdir(parents=True)
    (phome / "startup.json").write_text(json.dumps({"seconds": 1.0}))
    fd = try_lock(settings)
    assert fd is not None
    try:
        assert daemon_alive(settings) and try_lock(settings) is None  # nobody else can start one now
        lines: list[str] = []
        t0 = time.monotonic()
        assert ensure_server(settings, say=lines.append) is None
        waited = time.monotonic() - t0
    finally:
        os.close(fd)
    assert 4.0 <= waited < 4.0 + 5.0
    assert lines == [f"Prefect: the local server another command is starting did not answer within 4 s (see "
                     f"{phome / 'daemon.log'}); this command uses Prefect's ephemeral server instead"]
    assert not (phome / "server.json").exists()  # it started none of its own
    assert not daemon_alive(settings)


def _forked_flows(home: Path) -> list[str]:
    log = flow_zygote_dir(home) / "zygote.log"
    return [line for line in log.read_text().splitlines() if " INFO: forked flow " in line] if log.is_file() else []


@pytest.mark.slow
def test_the_first_command_starts_it_the_next_reuses_it_and_stop_leaves_nothing(settings) -> None:
    """Also the warm flow (gradlab.cli.warm_flow): later trains run in a process forked by it, with
    the command's own output and exit code; Ctrl-C relayed to it seals cancelled; without it, the
    command runs the flow itself."""
    home = settings.home
    out = gradlab("experiment", "list", env=_env())  # the first command that needs Prefect
    assert out.returncode == 0, out.stderr
    started = [line for line in out.stderr.splitlines() if line.startswith("Prefect: started")]
    assert len(started) == 1 and started[0].startswith(STARTED), out.stderr
    state = read_state(settings)
    assert state is not None and state.ready and f" at {state.url} (" in started[0]
    assert "it stops after 30 min without use" in started[0]
    with urllib.request.urlopen(f"{state.url}/ui-settings", timeout=10) as r:  # the UI asks its own server
        assert json.loads(r.read())["api_url"] == state.api_url
    zygote = wait_for(lambda: ready_zygotes(zygote_dir(home)), 180, "the warm learner ready")[0]
    assert zygote.keeper_pid == state.pid
    flow = wait_for(lambda: ready_zygotes(flow_zygote_dir(home)), 180, "the warm flow ready")[0]
    assert flow.keeper_pid == state.pid

    out = gradlab("train", "gradlab__bandit/ppo", "--json", env=_env())  # a later command: attaches
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Prefect: started" not in out.stderr
    assert f"Prefect API: {state.api_url}" in out.stderr and "(warm: forked by the warm learner)" in out.stderr
    receipt = json.loads(out.stdout.strip().splitlines()[-1])
    assert receipt["outcome"] == "succeeded" and receipt["promotion"] is not None
    forked = _forked_flows(home)
    assert len(forked) == 1 and f"warm-flow[{flow.pid}]" in forked[0], forked
    assert "(gradlab train gradlab__bandit/ppo --seed 0 --eval-backend local --json)" in forked[0]
    assert read_state(settings).pid == state.pid  # the same daemon

    # A failure in the warm flow's child (a bad --set is found where the run is prepared; an unknown
    # goal is refused before the hand-off): its message and exit code come back.
    out = gradlab("train", "gradlab__bandit/ppo", "--set", "train.timestepz=1", env=_env())
    assert out.returncode == 1 and "train.timestepz: unknown key" in out.stderr and out.stdout == "", out.stderr
    assert len(_forked_flows(home)) == 2

    # Ctrl-C (SIGINT to the command) is relayed to the warm flow's child: a cancelled receipt.
    before = {p.name for p in (home / "runs").iterdir()}
    proc = subprocess.Popen([sys.executable, "-m", "gradlab.cli.app", "train", "gradlab__bandit/ppo", "--no-eval",
                             "--set", "train.timesteps=50000000", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=_env())
    try:
        run_dir = wait_for(lambda: next((p for p in (home / "runs").iterdir() if p.name not in before), None), 120,
                           "the run's folder")

        def training() -> bool:
            from gradlab.outbox import Outbox

            try:
                return any(e.kind == "metrics" for e in Outbox(run_dir / "outbox.sqlite", readonly=True).read(0, 50))
            except Exception:  # noqa: BLE001 - not created yet
                return False

        wait_for(training, 120, "the cancelled run training")
        # The flow's process is on record (the daemon crashes the flow run if that process is killed):
        # the warm flow's child, not the command.
        # (Earlier commands' records stay until the daemon's next look finds their processes gone.)
        # An earlier command's flow process may still be exiting: wait until only one is alive.
        def live_flows() -> list[int]:
            pids = [int(r.read_text().split()[0]) for r in flow_runs_dir(prefect_home(settings)).iterdir()]
            return [pid for pid in pids if pid_alive(pid)]

        wait_for(lambda: len(live_flows()) == 1, 60, "one live flow-runs record (the cancelled run's)")
        live = live_flows()
        assert len(live) == 1, live
        flow_pid = live[0]
        assert flow_pid != proc.pid
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr[-3000:]
    assert "cancelling: the learner stops and a cancelled receipt is sealed" in stderr
    cancelled = json.loads(stdout.strip().splitlines()[-1])
    assert cancelled["outcome"] == "cancelled" and cancelled["run_id"] == run_dir.name, cancelled
    assert "Ctrl-C" in cancelled["reason"]
    assert len(_forked_flows(home)) == 3
    wait_for(lambda: list(flow_runs_dir(prefect_home(settings)).iterdir()) == [], 120,
             "the ended flows' records removed by the daemon once their processes were gone")

    # Without a warm flow (gone), the command runs the flow in its own process, as before.
    from gradlab.learn.zygote import retire

    retire(flow)
    wait_for(lambda: not pid_alive(flow.pid), 30, "the warm flow gone")
    out = gradlab("train", "gradlab__bandit/ppo", "--seed", "1", "--json", env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["outcome"] == "succeeded"
    assert len(_forked_flows(home)) == 3  # not handed off
    wait_for(lambda: ready_zygotes(flow_zygote_dir(home)), 180, "the warm flow back")  # the command restarts it

    out = gradlab("server", "status", "--json", env=_env())
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert status["running"] and status["pid"] == state.pid and status["idle_timeout_s"] == 1800
    assert status["clients"] == []  # the train command has exited
    assert status["warm_flow"]["ready"] and status["warm_learner"]["ready"]

    out = gradlab("server", "stop", env=_env())
    assert out.returncode == 0 and out.stdout.strip() == "stopped", out.stderr
    _nothing_left(home, [state.pid, state.server_pid, zygote.pid, *status["warm_flow"]["ready"]])
    assert not daemon_alive(settings)


@pytest.mark.slow
def test_a_fresh_shells_first_train_is_handed_to_the_warm_flow_the_daemon_starts(settings) -> None:
    """The first command of a fresh home starts the daemon before anything else; the daemon starts
    the warm learner and the warm flow as its server starts (their imports overlap it), and the
    command hands itself to the warm flow instead of importing Prefect and torch beside them: its
    learner is forked by the warm learner, its flow runs in the warm flow's child, which waits for
    the server as the one its command started."""
    home = settings.home
    out = gradlab("train", "gradlab__bandit/ppo", "--json", env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    started = [line for line in out.stderr.splitlines() if line.startswith("Prefect: started")]
    assert len(started) == 1 and started[0].startswith(STARTED), out.stderr
    assert "(warm: forked by the warm learner)" in out.stderr, out.stderr
    assert "another command is starting" not in out.stderr  # the child knows the server is its command's
    assert "starting: the warm flow and the warm learner" in out.stderr  # the wait for them is said,
    assert "the warm flow was ready after " in out.stderr  # and how long it took
    assert "importing Prefect" not in out.stderr  # the warm flow imported it
    receipt = json.loads(out.stdout.strip().splitlines()[-1])
    assert receipt["outcome"] == "succeeded" and receipt["promotion"] is not None
    state = read_state(settings)
    flow = ready_zygotes(flow_zygote_dir(home))[0]
    forked = _forked_flows(home)
    assert len(forked) == 1 and f"warm-flow[{flow.pid}]" in forked[0], forked
    assert flow.keeper_pid == state.pid
    # Both warm processes were started before the server answered (from the logs' wall-clock times:
    # a zygote's "ready after S s" line less its S).
    def at(line: str) -> float:
        return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()

    daemon_log = (prefect_home(settings) / "daemon.log").read_text().splitlines()
    healthy_at = next(at(line) for line in daemon_log if "prefect server healthy after" in line)
    for directory in (zygote_dir(home), flow_zygote_dir(home)):
        ready = next(line for line in (directory / "zygote.log").read_text().splitlines() if " ready after " in line)
        started_at = at(ready) - float(ready.split(" ready after ")[1].split()[0])
        assert started_at <= healthy_at, (ready, healthy_at)


def test_a_fresh_shells_train_starts_the_daemon_before_its_heavy_imports(settings) -> None:
    """`gradlab train` checks its GOAL/RECIPE's files and starts the daemon
    (gradlab.cli.train_cmds._start_local_server) before it imports the warm hand-off's zygote
    module, pydantic or http.client (~40 ms sooner, docs/BENCHMARKS.md)."""
    probe = ("import sys; import gradlab.cli.app; from gradlab.cli import train_cmds; "
             "train_cmds._check_ref_files('gradlab__bandit/ppo'); "
             "from gradlab.settings import load_settings; pid = train_cmds._start_local_server(load_settings()); "
             "print(pid, sorted(m for m in ('gradlab.learn.zygote', 'pydantic', 'http.client') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO,
                         env=_env(COLUMNS="60"), timeout=120)
    pid, imported = out.stdout.split(" ", 1)
    assert pid.isdigit() and imported.strip() == "[]", out.stdout + out.stderr
    assert out.stderr.startswith(STARTED) and out.stderr.count("\n") == 1, out.stderr  # one line, however narrow
    wait_for(lambda: daemon_alive(settings), 60, "the daemon holds its lock")


@pytest.mark.slow
def test_two_first_trains_at_once_both_run_in_the_warm_flow(settings) -> None:
    """The command that did not start the daemon (another was starting it) also waits for the warm
    flow instead of importing Prefect itself; one warm flow and one warm learner serve both."""
    home = settings.home
    procs = [subprocess.Popen([sys.executable, "-m", "gradlab.cli.app", "train", "gradlab__bandit/ppo", "--seed",
                               str(seed), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=REPO, env=_env()) for seed in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-3000:] for _, e in outs]
    for out, err in outs:
        assert json.loads(out.strip().splitlines()[-1])["outcome"] == "succeeded"
        assert "(warm: forked by the warm learner)" in err, err
    assert sum(err.count("Prefect: started") for _, err in outs) == 1
    forked = _forked_flows(home)  # each command ran in a child of the warm flow, not in its own process
    assert len(forked) == 2 and all(any(f"--seed {seed} " in line for line in forked) for seed in (0, 1)), forked
    assert len(ready_zygotes(zygote_dir(home))) == 1 and len(ready_zygotes(flow_zygote_dir(home))) == 1


@pytest.mark.slow
def test_a_new_homes_server_starts_from_the_database_the_first_one_migrated(settings, tmp_path: Path) -> None:
    """The first server on an empty database keeps a pre-migrated copy (gradlab.runs.prefect_db);
    the server of another new home starts from it, skips the migrations and the block
    registration (its block types are the copy's), and serves a run."""
    cache = tmp_path / "cache"
    env = _env(GRADLAB_CACHE_DIR=str(cache))
    out = gradlab("server", "start", env=env)
    assert out.returncode == 0, out.stderr
    daemon_log = prefect_home(settings) / "daemon.log"
    wait_for(lambda: "kept a pre-migrated copy of the Prefect database" in daemon_log.read_text(), 120,
             "the copy kept (just after the server answers)")
    assert "from the pre-migrated copy" not in daemon_log.read_text()
    block_types = _block_types(read_state(settings).api_url)
    assert len(block_types) > 5 and (prefect_home(settings) / "memo_store.toml").is_file()  # registered here
    out = gradlab("server", "stop", env=env)
    assert out.returncode == 0, out.stderr

    other = tmp_path / "other-home"
    env = {**env, "GRADLAB_HOME": str(other), "GRADLAB_CONFIG": str(other / "config.toml")}
    try:
        out = gradlab("train", "gradlab__bandit/ppo", "--json", env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        assert json.loads(out.stdout.strip().splitlines()[-1])["outcome"] == "succeeded"
        log = (other / "prefect" / "daemon.log").read_text()
        assert "prefect database from the pre-migrated copy" in log and "kept a pre-migrated copy" not in log
        assert "block types as registered there" in log
        # Prefect registered nothing (it records a registration in memo_store.toml), and serves the
        # copy's block types all the same.
        assert not (other / "prefect" / "memo_store.toml").exists()
        state = json.loads((other / "prefect" / "server.json").read_text())
        assert _block_types(state["url"] + "/api") == block_types
    finally:
        gradlab("server", "stop", env=env)


@pytest.mark.slow
def test_a_cache_that_cannot_be_written_leaves_the_server_up(settings, tmp_path: Path) -> None:
    """Keeping the copy is optional: a cache path that is a file is logged, and the server goes on."""
    cache = tmp_path / "cache-is-a-file"
    cache.write_text("not a folder")
    env = _env(GRADLAB_CACHE_DIR=str(cache))
    out = gradlab("server", "start", env=env)
    assert out.returncode == 0, out.stderr
    daemon_log = prefect_home(settings) / "daemon.log"
    wait_for(lambda: "could not keep a pre-migrated copy" in daemon_log.read_text(), 120, "the copy given up")
    assert gradlab("server", "status", env=env).returncode == 0 and daemon_alive(settings)
    assert len(_block_types(read_state(settings).api_url)) > 5
    assert cache.read_text() == "not a folder"


@pytest.mark.slow
def test_a_relative_cache_dir_is_the_commands_not_the_daemons(settings, tmp_path: Path) -> None:
    """The daemon runs in /: a relative GRADLAB_CACHE_DIR names a folder under the command's directory."""
    env = _env(GRADLAB_CACHE_DIR="relative-cache", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "gradlab.cli.app", "server", "start"], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    daemon_log = prefect_home(settings) / "daemon.log"
    wait_for(lambda: "kept a pre-migrated copy" in daemon_log.read_text(), 120, "the copy kept")
    assert f"{tmp_path}/relative-cache/prefect-db/" in daemon_log.read_text()
    assert list((tmp_path / "relative-cache" / "prefect-db").glob("*/prefect.db"))


@pytest.mark.slow
def test_a_copy_its_server_cannot_start_on_is_removed_and_the_next_start_migrates_its_own(
        settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy whose bytes match its record but name a revision this Prefect does not know (another
    build's migrations): its server exits while starting; the daemon removes the copy and the
    home's database, and the next start migrates its own."""
    import sqlite3

    from gradlab.runs import prefect_db

    monkeypatch.setenv("GRADLAB_CACHE_DIR", str(tmp_path / "cache"))
    env = _env()
    folder = prefect_db.template_dir()
    folder.mkdir(parents=True)
    with sqlite3.connect(folder / prefect_db.DATABASE) as db:
        db.executescript("CREATE TABLE alembic_version (version_num TEXT); INSERT INTO alembic_version VALUES "
                         "('deadbeef0000'); CREATE TABLE block_type (id TEXT); INSERT INTO block_type VALUES ('1');")
    db.close()
    (folder / prefect_db.RECORD).write_text(json.dumps({
        "sha256": prefect_db._sha256(folder / prefect_db.DATABASE), "prefect": folder.name,
        "collections": prefect_db.installed_collections()}))
    out = gradlab("server", "start", env=env)
    assert out.returncode != 0, out.stderr
    log = (prefect_home(settings) / "daemon.log").read_text()
    assert "prefect database from the pre-migrated copy" in log
    assert "the Prefect server exited while starting on the pre-migrated database" in log
    assert not folder.exists() and not (prefect_home(settings) / "prefect.db").exists()
    out = gradlab("server", "start", env=env)
    assert out.returncode == 0, out.stderr
    assert len(_block_types(read_state(settings).api_url)) > 5


@pytest.mark.slow
def test_a_server_killed_while_starting_on_a_copy_leaves_the_copy(settings, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal (a user's kill, the OOM killer) says nothing against the copy: it stays."""
    from gradlab.runs import prefect_db

    monkeypatch.setenv("GRADLAB_CACHE_DIR", str(tmp_path / "cache"))
    out = gradlab("server", "start", env=_env())
    assert out.returncode == 0, out.stderr
    wait_for(lambda: prefect_db._current(prefect_db.template_dir()), 120, "the copy kept")
    assert gradlab("server", "stop", env=_env()).returncode == 0
    other = tmp_path / "other-home"
    env = {**_env(), "GRADLAB_HOME": str(other), "GRADLAB_CONFIG": str(other / "config.toml")}
    proc = subprocess.Popen([sys.executable, "-m", "gradlab.cli.app", "server", "start"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        state = other / "prefect" / "server.json"
        server_pid = wait_for(lambda: state.is_file() and json.loads(state.read_text()).get("server_pid"), 120,
                              "the server started")
        os.kill(server_pid, signal.SIGKILL)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        gradlab("server", "stop", env=env)
    log = (other / "prefect" / "daemon.log").read_text()
    assert "from the pre-migrated copy" in log and "exited with -9 while starting" in log, log
    assert "exited while starting on the pre-migrated database" not in log
    assert prefect_db._current(prefect_db.template_dir())


def _block_types(api_url: str) -> list[str]:
    request = urllib.request.Request(f"{api_url}/block_types/filter", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return sorted(t["slug"] for t in json.loads(r.read()))


@pytest.mark.slow
def test_ctrl_c_while_the_handed_off_command_waits_for_the_server_ends_it_recording_nothing(settings) -> None:
    """A server that does not answer (stopped): the first Ctrl-C ends the wait of the warm flow's
    child at once, stops the learner and exits 1 with nothing recorded (the flow never started)."""
    home = settings.home
    proc = subprocess.Popen([sys.executable, "-m", "gradlab.cli.app", "train", "gradlab__bandit/ppo", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=_env())
    server_pid = None
    try:
        state = wait_for(lambda: (st := read_state(settings)) is not None and st.server_pid and st, 120,
                         "the server started")
        server_pid = state.server_pid
        os.kill(server_pid, signal.SIGSTOP)  # it never answers now
        wait_for(lambda: _forked_flows(home), 180, "the command handed to the warm flow")
        run_dir = wait_for(lambda: next((home / "runs").iterdir(), None) if (home / "runs").is_dir() else None, 120,
                           "the run's folder")
        # The learner ready: the command has its Ctrl-C handler by then (set right after the start).
        wait_for(lambda: (log := run_dir / "learner.log").is_file() and "ready; waiting" in log.read_text(), 180,
                 "the learner ready, waiting for its supervisor")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if server_pid is not None:
            os.kill(server_pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr[-3000:]
    assert (f"run {run_dir.name}: cancelled (Ctrl-C) before its supervising flow started: nothing was recorded"
            in " ".join(stderr.split())), stderr[-3000:]
    assert stdout == ""
    assert not (home / "stores" / "control" / "runs" / run_dir.name).exists()


@pytest.mark.slow
def test_a_server_that_fails_to_start_is_not_started_twice_and_the_command_says_why(settings) -> None:
    (prefect_home(settings) / "prefect.db" / "x").mkdir(parents=True)  # no database can be opened
    out = gradlab("train", "gradlab__bandit/ppo", "--json", env=_env())
    assert out.returncode == 0, out.stderr[-3000:]  # on Prefect's ephemeral server
    assert json.loads(out.stdout.strip().splitlines()[-1])["outcome"] == "succeeded"
    assert out.stderr.count("Prefect: started") == 1
    assert ("Prefect: the local server this command started stopped before it answered (see "
            f"{prefect_home(settings) / 'daemon.log'})") in " ".join(out.stderr.split())
    assert (prefect_home(settings) / "daemon.log").read_text().count("INFO: started (idle timeout") == 1
    assert not daemon_alive(settings)  # (handed to the warm flow or not: whichever was first)


@pytest.mark.slow
def test_concurrent_first_commands_start_one_daemon_which_stops_when_idle(settings) -> None:
    env = _env(GRADLAB_DAEMON_IDLE_S="6")
    procs = [subprocess.Popen([sys.executable, "-m", "gradlab.cli.app", "experiment", "list", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
             for _ in range(3)]
    # This test process uses the server too (a registered client, as a command registers itself),
    # so a loaded machine's slow commands cannot let it idle out before it is looked at.
    state = wait_for(lambda: (s := read_state(settings)) is not None and s.ready and s, 300, "the server ready")
    client = clients_dir(prefect_home(settings)) / str(os.getpid())
    client.write_text(start_ticks(os.getpid()) or "")
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e for _, e in outs]
    assert sum(err.count("Prefect: started") for _, err in outs) == 1
    log = (prefect_home(settings) / "daemon.log").read_text()
    assert log.count("INFO: started (idle timeout 6.0 s") == 1  # one daemon, one prefect server
    assert state.idle_s == 6.0 and read_state(settings) is not None

    # A flow run left Running by a process that was killed (its flow-runs/ record names a pid that
    # is gone) is marked Crashed and is no use: without that, the daemon would never idle out.
    # One whose record is older than its Running state is an earlier try's (a retry whose process
    # has not started its flow yet): left alone.
    retried = _a_running_flow_run_whose_process_was_killed(state.api_url, prefect_home(settings), record_first=True)
    crashed = _a_running_flow_run_whose_process_was_killed(state.api_url, prefect_home(settings))
    run = wait_for(lambda: (r := _flow_run(state.api_url, crashed))["state"]["type"] == "CRASHED" and r, 120,
                   "the killed process's flow run marked Crashed")
    assert "ended without reporting a final state" in run["state"]["message"]
    assert not (flow_runs_dir(prefect_home(settings)) / crashed).exists()
    assert _flow_run(state.api_url, retried)["state"]["type"] == "RUNNING"
    _post(f"{state.api_url}/flow_runs/{retried}/set_state", {"state": {"type": "COMPLETED"}, "force": True})
    wait_for(lambda: not (flow_runs_dir(prefect_home(settings)) / retried).exists(), 120,
             "the ended run's stale record removed")

    # A command still using it (this process) keeps it up past the idle timeout; once it is gone,
    # the server stops.
    held_until = time.monotonic() + 6.0 + 3.0
    while time.monotonic() < held_until:
        assert daemon_alive(settings), "stopped while a command was using it"
        time.sleep(0.2)
    client.unlink()
    wait_for(lambda: not daemon_alive(settings), 120, "the daemon gone after 6 idle seconds")
    log = (prefect_home(settings) / "daemon.log").read_text()
    assert "(idle timeout 6 s): stopping" in log and log.rstrip().endswith("INFO: stopped")
    _nothing_left(settings.home, [state.pid, state.server_pid])


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"},
                                     method="POST")
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


def _flow_run(api_url: str, flow_run_id: str) -> dict:
    with urllib.request.urlopen(f"{api_url}/flow_runs/{flow_run_id}", timeout=30) as r:
        return json.loads(r.read())


def _a_running_flow_run_whose_process_was_killed(api_url: str, home: Path, *, record_first: bool = False) -> str:
    """A Running flow run (created through the API) recorded as executed by a process now gone;
    ``record_first``: the record written before the run went Running (an earlier try's)."""
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    ticks = start_ticks(victim.pid)
    victim.kill()  # kill -9: no flow code runs after it
    victim.wait()
    flow = _post(f"{api_url}/flows/", {"name": "training-run"})
    kind = "PENDING" if record_first else "RUNNING"
    flow_run_id = _post(f"{api_url}/flow_runs/", {"flow_id": flow["id"], "name": "killed-mid-run",
                                                  "state": {"type": kind, "name": kind.title()}})["id"]
    flow_runs_dir(home).mkdir(parents=True, exist_ok=True)
    (flow_runs_dir(home) / flow_run_id).write_text(f"{victim.pid} {ticks}")
    if record_first:
        time.sleep(0.01)  # (file times and the server's clock are one clock: a tick apart)
        _post(f"{api_url}/flow_runs/{flow_run_id}/set_state", {"state": {"type": "RUNNING", "name": "Running"},
                                                               "force": True})
    return flow_run_id


def test_daemon_settings_come_from_the_environment_over_the_config_file(gradlab_home: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from gradlab.errors import ConfigError

    config = gradlab_home / "config.toml"
    config.write_text("[daemon]\nenabled = false\nidle_s = 60\nstart_timeout_s = 300\n")
    monkeypatch.delenv("GRADLAB_DAEMON")
    s = load_settings()
    assert (s.daemon, s.daemon_idle_s, s.server_start_timeout_s) == (False, 60.0, 300.0)
    monkeypatch.setenv("GRADLAB_DAEMON", "1")
    monkeypatch.setenv("GRADLAB_DAEMON_IDLE_S", "0")
    s = load_settings()
    assert (s.daemon, s.daemon_idle_s, s.server_start_timeout_s) == (True, 0.0, 300.0)
    monkeypatch.setenv("GRADLAB_DAEMON", "maybe")
    with pytest.raises(ConfigError, match=r"^GRADLAB_DAEMON: expected 1 or 0 \(true/false\), found 'maybe'$"):
        load_settings()
    monkeypatch.setenv("GRADLAB_DAEMON", "0")
    config.write_text("[daemon]\nstart_timeout_s = 0\n")
    with pytest.raises(ConfigError, match=rf"^{config}: daemon.start_timeout_s: expected a number of seconds > 0, "
                                          "found 0$"):
        load_settings()
