"""Two hosts on this machine, one Prefect server on PostgreSQL, moto's S3 server as the shared
stores (issue 21 item 4).

Each host is a PID + mount namespace (``unshare --pid --fork --mount-proc``) with its own
``GRADLAB_HOME`` and its own ``gradlab-local`` worker, so no host can see the other's pids: the
receipt proof must hold on lease expiry and epochs alone. The network is shared (loopback
routing to the server, PostgreSQL and S3). One server, one database and one deployment serve the
module's scenarios; everything started here is stopped at the end, failures included.

Scenario (a): host A's flow run is paused (SIGSTOP of every process of host A) past its lease; a
new attempt of the same run runs on host B; host A resumes (SIGCONT): A is fenced out and stops,
B finishes, exactly one promotion, nothing of A's is accepted after its lease expired.

Scenario (b): host A is cut off from the stores (its route to the S3 server resets every
connection) right after its learner started; its lease expires, host B runs a new attempt to the
end, and A's route comes back: no write of A after its lease expired is accepted, A stops and
says it was superseded.

Scenario (c): host A's worker, flow run and learner are killed after A published two
checkpoints, the newest of them then corrupted in the store; host B retries the run: it waits for
A's lease to expire (it cannot see A's pids), passes over the corrupted checkpoint, resumes from
the newest that verifies, and finishes with the one promotion.

Scenario (d): eight queued runs over both hosts at the pool's concurrency (one flow run per
worker): every one sealed ``succeeded`` with one promotion, both hosts used, and the server on
PostgreSQL never met ``database is locked``.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gradlab import receipts as rules
from gradlab.contracts.run_spec import new_run_id
from gradlab.outbox import Outbox
from gradlab.stores import Stores, keys, open_store
from tests.netlink import Link
from tests.runs.conftest import wait_for
from tests.s3server import free_port, running_s3_server

REPO = Path(__file__).resolve().parents[2]
LEASE_TTL_S = 8

pytestmark = pytest.mark.slow


def _pg_bin(name: str) -> str | None:
    """A PostgreSQL server binary: on PATH, else Debian's ``/usr/lib/postgresql/<major>/bin``."""
    return shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)


@contextlib.contextmanager
def _postgres() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on 127.0.0.1 run as user ``postgres`` (it refuses root);
    yields the SQLAlchemy URL of its ``prefect`` database (the README's queued-runs setup)."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        user = None
    if initdb is None or pg_ctl is None or user is None or shutil.which("runuser") is None:
        pytest.skip("needs PostgreSQL (Debian's postgresql package: initdb, pg_ctl, user postgres) and runuser")
    root = Path(tempfile.mkdtemp(prefix="gradlab-pg-"))
    os.chown(root, user.pw_uid, user.pw_gid)
    port = free_port()

    def as_postgres(*argv: str) -> None:
        out = subprocess.run(["runuser", "-u", "postgres", "--", *argv], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"{argv[0]}: {out.stdout}{out.stderr}"

    data = root / "data"
    try:
        as_postgres(initdb, "-D", str(data), "-U", "prefect", "--auth=trust", "-E", "UTF8")
        as_postgres(pg_ctl, "-D", str(data), "-l", str(root / "postgres.log"), "-w", "-t", "120", "-o",
                    f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c max_connections=200", "start")
        as_postgres(str(Path(pg_ctl).with_name("createdb")) if Path(pg_ctl).with_name("createdb").exists()
                    else "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "prefect", "prefect")
        yield f"postgresql+asyncpg://prefect@127.0.0.1:{port}/prefect"
    finally:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            as_postgres(pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)


def _host_processes(home: Path) -> list[int]:
    """Every process of a host (worker, flow runs, learners): those whose environment names its home."""
    marker = f"GRADLAB_HOME={home}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@dataclass
class Host:
    """One simulated host: its home, environment and worker (in its own PID + mount namespace)."""

    name: str
    home: Path
    env: dict[str, str]
    worker: subprocess.Popen | None = None

    def start_worker(self) -> None:
        log = (self.home / "worker.log").open("ab")
        try:
            self.worker = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "prefect", "worker", "start",
                 "--pool", "gradlab-local", "--type", "process", "--limit", "1", "--name", self.name],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.home, env=self.env,
                start_new_session=True)
        finally:
            log.close()

    def signal_all(self, sig: signal.Signals) -> list[int]:
        pids = _host_processes(self.home)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    def kill_all(self) -> None:
        """SIGKILL every process of the host (worker, flow runs, learners) and reap the worker."""
        self.signal_all(signal.SIGCONT)
        wait_for(lambda: not self.signal_all(signal.SIGKILL), 60, f"{self.name}'s processes gone")
        if self.worker is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.worker.wait(timeout=10)
            self.worker = None

    def stop(self) -> None:
        self.signal_all(signal.SIGCONT)
        self.signal_all(signal.SIGKILL)
        if self.worker is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.worker.wait(timeout=10)


@dataclass
class Deployment:
    """The module's server (on PostgreSQL), stores (moto S3) and hosts."""

    api_url: str
    database_url: str
    env: dict[str, str]
    stores: Stores
    s3_port: int
    hosts: dict[str, Host] = field(default_factory=dict)

    def cli(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=REPO, env=self.env,
                              timeout=timeout_s)

    @contextlib.contextmanager
    def client(self):
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: self.api_url}), get_client(sync_client=True) as client:
            yield client

    def online(self, name: str) -> bool:
        with self.client() as client:
            return any(w.name == name and str(getattr(w.status, "value", w.status)) == "ONLINE"
                       for w in client.read_workers_for_work_pool("gradlab-local"))

    def queue_run(self, run_id: str, *overrides: str, recipe: str = "gradlab__bandit/ppo") -> str:
        params = ["-p", f"recipe={recipe}", "-p", f"run_id={run_id}",
                  "-p", f"overrides={json.dumps(list(overrides))}"]
        out = self.cli("prefect", "deployment", "run", "training-run/local", *params)
        assert out.returncode == 0, out.stdout + out.stderr
        with self.client() as client:
            runs = client.read_flow_runs()
        return str(next(fr.id for fr in sorted(runs, key=lambda fr: fr.created, reverse=True)
                        if (fr.parameters or {}).get("run_id") == run_id))

    def flow_run(self, flow_run_id: str):
        with self.client() as client:
            return client.read_flow_run(uuid.UUID(flow_run_id))

    def final(self, flow_run_id: str, timeout_s: float):
        return wait_for(lambda: (fr := self.flow_run(flow_run_id)).state.is_final() and fr, timeout_s,
                        f"flow run {flow_run_id} final")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare")
    root = tmp_path_factory.mktemp("two_hosts")
    with contextlib.ExitStack() as stack:
        database_url = stack.enter_context(_postgres())
        s3 = stack.enter_context(running_s3_server())  # this process reads the stores too
        credentials = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
        stores_env = {**credentials, "GRADLAB_S3_ENDPOINT_URL": s3.endpoint_url,
                      **{f"GRADLAB_{n.upper()}_STORE_URL": s3.url(n) for n in ("control", "eval", "model")}}
        port = free_port()
        api_url = f"http://127.0.0.1:{port}/api"
        base = {k: v for k, v in os.environ.items() if not k.startswith(("GRADLAB_", "PREFECT_", "AWS_"))}
        base.update({"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
                     "PREFECT_API_URL": api_url, "PREFECT_WORKER_QUERY_SECONDS": "1",
                     "PREFECT_HOME": str(root / "prefect-client"), **stores_env})
        server_env = {**base, "PREFECT_API_DATABASE_CONNECTION_URL": database_url, "PREFECT_HOME": str(root / "server"),
                      "PREFECT_UI_ENABLED": "false"}
        server_log = (root / "server.log").open("ab")
        server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                                   str(port)], stdout=server_log, stderr=subprocess.STDOUT, env=server_env, cwd=root,
                                  start_new_session=True)
        stack.callback(lambda: (os.killpg(server.pid, signal.SIGKILL), server.wait(timeout=30)))
        env = {**base, "GRADLAB_HOME": str(root / "operator"), "GRADLAB_CONFIG": str(root / "operator" / "config.toml")}
        stores = Stores(*(open_store(s3.url(n)) for n in ("control", "eval", "model")))
        dep = Deployment(api_url=api_url, database_url=database_url, env=env, stores=stores, s3_port=s3.port)
        wait_for(lambda: _healthy(api_url), 180,
                 f"Prefect server on PostgreSQL at {api_url} (log: {root / 'server.log'})")
        created = dep.cli("gradlab.cli.app", "pools", "create", "--json")
        assert created.returncode == 0, created.stderr
        deployed = dep.cli("prefect", "--no-prompt", "deploy", "--name", "local")
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        for name in ("host-a", "host-b"):
            home = root / name
            home.mkdir()
            host = Host(name=name, home=home, env={**base, "GRADLAB_HOME": str(home),
                                                   "GRADLAB_CONFIG": str(home / "config.toml"),
                                                   "GRADLAB_LEASE_TTL_S": str(LEASE_TTL_S)})
            dep.hosts[name] = host
            stack.callback(host.stop)
        yield dep


@pytest.fixture(autouse=True)
def separate_scenarios(deployment: Deployment) -> Iterator[None]:
    """Each scenario ends with both hosts' processes gone and no flow run left running: a flow
    run whose host was killed stays ``RUNNING`` on the server and holds one of the pool's two
    slots, so a failed or killed scenario would otherwise starve the next. Such runs are marked
    ``CRASHED``, as an operator (or a zombie-run automation) would."""
    yield
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    for host in deployment.hosts.values():
        host.kill_all()
    with deployment.client() as client:
        unfinished = client.read_flow_runs(flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
            type=FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED,
                                              StateType.CANCELLING]))))
        for run in unfinished:
            client.set_flow_run_state(run.id, Crashed(message="its host was stopped at the end of a scenario"),
                                      force=True)


def _healthy(api_url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def _learner_started(host: Host, run_id: str):
    path = host.home / "runs" / run_id / "outbox.sqlite"
    try:
        return Outbox(path, readonly=True).last("learner_started") if path.exists() else None
    except Exception:  # noqa: BLE001 - created, its tables not yet
        return None


@pytest.mark.timeout(1800)  # two flow runs and a lease expiry, on top of a server and a database
def test_a_paused_host_is_fenced_out_and_the_other_host_finishes(deployment: Deployment) -> None:
    a, b = deployment.hosts["host-a"], deployment.hosts["host-b"]
    stores = deployment.stores
    run_id = new_run_id()
    a.start_worker()
    wait_for(lambda: deployment.online("host-a"), 120, "host A's worker online")
    # Long enough that host A is still training when it is paused, with checkpoints far enough
    # apart that it has published none by then (an unfinished upload of one is replaced by B:
    # tests/receipts/test_receipts.py).
    first = deployment.queue_run(run_id, "train.timesteps=2000000", "train.checkpoint_freq=32768")
    started = wait_for(lambda: _learner_started(a, run_id), 180, "host A's learner started")
    assert (started.payload["attempt"], started.payload["epoch"]) == ("attempt-001", 1)
    lease = rules.read_lease(stores.control, run_id).lease
    assert lease.owner_pid_namespace is not None and lease.owner_pid < 100  # a pid of host A's namespace
    paused = a.signal_all(signal.SIGSTOP)  # the lid closes: worker, flow run, learner
    assert paused
    expired = wait_for(lambda: (held := rules.read_lease(stores.control, run_id)) and not held.lease.is_live()
                       and held.lease, 3 * LEASE_TTL_S + 30, "host A's lease to expire")
    assert (expired.holder, expired.generation) == ("attempt-001", 1)

    b.start_worker()
    wait_for(lambda: deployment.online("host-b"), 120, "host B's worker online")
    second = deployment.queue_run(run_id, "train.timesteps=2000000", "train.checkpoint_freq=32768")
    done = deployment.final(second, 420)
    assert done.state.type.value == "COMPLETED", done.state.message

    a.signal_all(signal.SIGCONT)  # host A wakes up
    stale = deployment.final(first, 180)
    assert stale.state.type.value != "COMPLETED"
    wait_for(lambda: not any(pid for pid in _host_processes(a.home) if _is_learner(pid)), 60,
             "host A's learner to stop")

    # Nothing of host A's was accepted after its lease expired (A had published nothing before its pause).
    _fenced_out_and_taken_over(stores, run_id, (first, second), expired)
    # Host A said why it stopped, and wrote no receipt of its own.
    assert not (a.home / "runs" / run_id / "attempts" / "attempt-001.json").exists()
    assert "superseded" in (stale.state.message or "").lower(), stale.state.message

    def said_superseded() -> bool:  # the flow's logs reach the API in batches: wait for the last one
        with deployment.client() as client:
            logs = client.read_logs(log_filter=_flow_run_logs(first))
        return any("superseded" in log.message.lower() for log in logs)

    wait_for(said_superseded, 120, "host A's flow run logs to say it was superseded")


def _fenced_out_and_taken_over(stores: Stores, run_id: str, flow_runs: tuple[str, str], expired) -> None:
    """Attempt 1 (flow run ``flow_runs[0]``, lease ``expired``) was sealed ``superseded`` by attempt 2
    (``flow_runs[1]``), which succeeded with the one promotion; every publication, evaluation and the
    stop request are attempt 2's, and it released the lease."""
    attempts = rules.list_attempts(stores, run_id)
    assert [(x.attempt_id, x.epoch, x.flow_run_id) for x in attempts] == [("attempt-001", 1, flow_runs[0]),
                                                                          ("attempt-002", 2, flow_runs[1])]
    old = rules.read_terminal(stores, run_id, "attempt-001")
    new = rules.read_terminal(stores, run_id, "attempt-002")
    assert old.outcome == "superseded" and (old.superseded_by.attempt_id, old.superseded_by.epoch) == ("attempt-002", 2)
    assert old.superseded_by.lease_expired_at == expired.expires_at
    assert new.outcome == "succeeded" and new.epoch == 2, new.reason
    promotion = rules.read_promotion(stores, run_id)
    assert (promotion.attempt_id, promotion.epoch) == ("attempt-002", 2)
    assert new.promotion.sha256 == promotion.checkpoint_sha256
    assert {(p.attempt_id, p.epoch) for p in rules.list_publications(stores, run_id)} == {("attempt-002", 2)}
    records = [rec for _, rec in rules.list_evaluations(stores, run_id) if rec is not None]
    assert records and {(r.attempt_id, r.epoch) for r in records} == {("attempt-002", 2)}
    stop = rules.read_stop_request(stores, run_id)
    assert stop is None or (stop.attempt_id, stop.epoch) == ("attempt-002", 2)
    held = rules.read_lease(stores.control, run_id).lease
    assert (held.holder, held.generation, held.released) == ("attempt-002", 2, True)


def _flow_run_logs(flow_run_id: str):
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    return LogFilter(flow_run_id=LogFilterFlowRunId(any_=[uuid.UUID(flow_run_id)]))


def _is_learner(pid: int) -> bool:
    try:
        return b"gradlab.learn" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.timeout(1800)
def test_a_host_cut_off_from_the_stores_is_fenced_out_and_none_of_its_late_writes_is_accepted(
        deployment: Deployment) -> None:
    stores = deployment.stores
    a, b = deployment.hosts["host-a"], deployment.hosts["host-b"]
    a.kill_all()
    b.kill_all()
    link = Link(deployment.s3_port)
    direct = a.env["GRADLAB_S3_ENDPOINT_URL"]
    a.env["GRADLAB_S3_ENDPOINT_URL"] = link.endpoint_url  # host A reaches the stores only through the link
    try:
        a.start_worker()
        wait_for(lambda: deployment.online("host-a"), 120, "host A's worker online")
        run_id = new_run_id()
        # Checkpoints far apart: host A is cut off before it could publish one.
        first = deployment.queue_run(run_id, "train.timesteps=2000000", "train.checkpoint_freq=32768")
        started = wait_for(lambda: _learner_started(a, run_id), 180, "host A's learner started")
        link.cut()
        assert (started.payload["attempt"], started.payload["epoch"]) == ("attempt-001", 1)
        expired = wait_for(lambda: (held := rules.read_lease(stores.control, run_id)) and not held.lease.is_live()
                           and held.lease, 3 * LEASE_TTL_S + 60, "host A's lease to expire")
        assert (expired.holder, expired.generation) == ("attempt-001", 1)

        b.start_worker()
        wait_for(lambda: deployment.online("host-b"), 120, "host B's worker online")
        second = deployment.queue_run(run_id, "train.timesteps=2000000", "train.checkpoint_freq=32768")
        done = deployment.final(second, 600)
        assert done.state.type.value == "COMPLETED", done.state.message
        link.restore()  # host A's route comes back
        stale = deployment.final(first, 300)
        assert stale.state.type.value != "COMPLETED"
        wait_for(lambda: not any(pid for pid in _host_processes(a.home) if _is_learner(pid)), 120,
                 "host A's learner to stop")
    finally:  # host A's worker knows only the link: it goes, and the next one gets the direct route
        a.kill_all()
        link.close()
        a.env["GRADLAB_S3_ENDPOINT_URL"] = direct
    # Nothing host A tried once its route came back was accepted.
    _fenced_out_and_taken_over(stores, run_id, (first, second), expired)
    assert "superseded" in (stale.state.message or "").lower(), stale.state.message


def _only(deployment: Deployment, name: str) -> Host:
    """Host ``name`` with a live worker and the other host's processes gone, so that only ``name`` takes runs."""
    for other, host in deployment.hosts.items():
        if other != name:
            host.kill_all()
    host = deployment.hosts[name]
    if host.worker is None or host.worker.poll() is not None:
        host.start_worker()
    wait_for(lambda: deployment.online(name), 120, f"{name}'s worker online")
    return host


@pytest.mark.timeout(1800)
def test_a_killed_host_is_retried_on_the_other_which_resumes_from_the_newest_verifying_checkpoint(
        deployment: Deployment) -> None:
    stores = deployment.stores
    a = _only(deployment, "host-a")
    b = deployment.hosts["host-b"]
    run_id = new_run_id()
    # CartPole's checkpoints below ~40k steps are far from its acceptance (return 475): two of them
    # are published before anything could be promoted.
    first = deployment.queue_run(run_id, "train.checkpoint_freq=4096", recipe="CartPole-v1/ppo")
    published = wait_for(lambda: len(pubs := rules.list_publications(stores, run_id)) >= 2 and pubs, 300,
                         "two checkpoints published by host A")
    a.kill_all()  # the host dies: worker, flow run, learner, evaluation workers
    assert rules.read_promotion(stores, run_id) is None
    published = sorted(rules.list_publications(stores, run_id), key=lambda p: p.step)
    assert {(p.attempt_id, p.epoch) for p in published} == {("attempt-001", 1)}
    newest, below = published[-1], published[-2]
    key = keys.checkpoint_file(run_id, newest.step, newest.sha256, "policy.safetensors")
    data, etag = stores.model.get_with_etag(key)
    stores.model.put_if_match(key, data[:-1] + bytes([data[-1] ^ 0xFF]), etag)  # a bad copy in the store
    assert rules.read_lease(stores.control, run_id).lease.holder == "attempt-001"

    b.start_worker()
    wait_for(lambda: deployment.online("host-b"), 120, "host B's worker online")
    second = deployment.queue_run(run_id, recipe="CartPole-v1/ppo")
    done = deployment.final(second, 600)
    assert done.state.type.value == "COMPLETED", done.state.message

    attempts = rules.list_attempts(stores, run_id)
    assert [(x.attempt_id, x.epoch, x.flow_run_id) for x in attempts] == [("attempt-001", 1, first),
                                                                          ("attempt-002", 2, second)]
    retry = attempts[1]
    assert retry.mode == "resume"
    assert (retry.resume_from.step, retry.resume_from.sha256) == (below.step, below.sha256)
    [skipped] = retry.skipped_checkpoints
    assert skipped.startswith(f"step {newest.step}: {stores.model.url(key)}: sha256 expected"), skipped
    started = _learner_started(b, run_id)
    assert (started.payload["attempt"], started.payload["epoch"]) == ("attempt-002", 2)
    assert started.payload["step"] == below.step  # the learner went on from the checkpoint it was given
    old = rules.read_terminal(stores, run_id, "attempt-001")
    new = rules.read_terminal(stores, run_id, "attempt-002")
    # Host B sealed attempt 1 once its lease expired (no pid of A's was judged), naming its successor
    # and the checkpoints attempt 1 had published.
    assert old.outcome == "superseded", old.reason
    assert (old.superseded_by.attempt_id, old.superseded_by.epoch) == ("attempt-002", 2)
    assert old.superseded_by.lease_expired_at is not None
    assert [(c.step, c.sha256) for c in old.checkpoints] == [(p.step, p.sha256) for p in published]
    assert new.outcome == "succeeded" and new.epoch == 2, new.reason
    promotion = rules.read_promotion(stores, run_id)
    assert (promotion.attempt_id, promotion.epoch) == ("attempt-002", 2)
    assert promotion.checkpoint_step > below.step and new.promotion.sha256 == promotion.checkpoint_sha256
    # Attempt 1's checkpoints stay its own; the retry published only above where it resumed.
    later = [p for p in rules.list_publications(stores, run_id) if p.attempt_id == "attempt-002"]
    assert later and all(p.epoch == 2 and p.step > below.step for p in later)
    held = rules.read_lease(stores.control, run_id).lease
    assert (held.holder, held.generation, held.released) == ("attempt-002", 2, True)


@pytest.mark.timeout(1800)
def test_eight_queued_runs_over_both_hosts_all_succeed_on_postgres(deployment: Deployment) -> None:
    stores = deployment.stores
    for name, host in deployment.hosts.items():
        if host.worker is None or host.worker.poll() is not None:
            host.start_worker()
        wait_for(lambda name=name: deployment.online(name), 120, f"{name}'s worker online")
    run_ids = [new_run_id() for _ in range(8)]
    flow_runs = [deployment.queue_run(run_id) for run_id in run_ids]
    for flow_run_id in flow_runs:
        done = deployment.final(flow_run_id, 900)
        assert done.state.type.value == "COMPLETED", (flow_run_id, done.state.message)
    ran_on = {name: [r for r in run_ids if (host.home / "runs" / r).is_dir()] for name, host in deployment.hosts.items()}
    assert sorted(r for runs in ran_on.values() for r in runs) == sorted(run_ids), ran_on  # each on one host
    assert all(ran_on.values()), ran_on  # both hosts took runs
    for run_id, flow_run_id in zip(run_ids, flow_runs, strict=True):
        [attempt] = rules.list_attempts(stores, run_id)
        assert (attempt.attempt_id, attempt.epoch, attempt.flow_run_id) == ("attempt-001", 1, flow_run_id)
        receipt = rules.read_terminal(stores, run_id, "attempt-001")
        assert receipt.outcome == "succeeded", receipt.reason
        promotion = rules.read_promotion(stores, run_id)
        assert (promotion.attempt_id, promotion.epoch) == ("attempt-001", 1)
        assert receipt.promotion.sha256 == promotion.checkpoint_sha256
    server_log = (Path(deployment.env["GRADLAB_HOME"]).parent / "server.log").read_text(errors="replace")
    assert "database is locked" not in server_log
    # Prefect's own records of these runs are in PostgreSQL, each completed.
    rows = _psql(deployment.database_url, "SELECT id, state_type FROM flow_run WHERE id IN ({})".format(
        ", ".join(f"'{f}'" for f in flow_runs)))
    assert sorted(rows) == sorted((f, "COMPLETED") for f in flow_runs)


def _psql(database_url: str, query: str) -> list[tuple[str, ...]]:
    """Rows of ``query`` on the deployment's PostgreSQL database (psql, unaligned, tab-separated)."""
    from urllib.parse import urlsplit

    url = urlsplit(database_url.replace("postgresql+asyncpg", "postgresql", 1))
    psql = _pg_bin("psql")
    assert psql is not None
    out = subprocess.run([psql, "-h", url.hostname, "-p", str(url.port), "-U", url.username, "-d", url.path.lstrip("/"),
                          "-At", "-F", "\t", "-c", query], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [tuple(line.split("\t")) for line in out.stdout.splitlines() if line]
