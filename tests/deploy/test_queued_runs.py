"""Queued runs end to end: a real Prefect server, the pools, the deployments of prefect.yaml, real
process workers, the real training-run flow and learner, and `gradlab experiment` over them.

One server, one deployment and two workers are shared by the tests of this module (the fixture
starts both, so any test runs alone too: the two-seed test and ``long_runs`` need one run per worker). Everything the module starts -- workers, the
flow-run processes and learners they started, the server -- is stopped at the end, failures included.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gradlab import receipts as rules
from gradlab.outbox import Outbox
from gradlab.runs.server import start_server, stop_server
from gradlab.settings import load_settings
from gradlab.stores import open_stores
from tests.process_env import session_environ, subprocess_env
from tests.runs.conftest import group_alive, pid_alive, wait_for

REPO = Path(__file__).resolve().parents[2]
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

pytestmark = pytest.mark.slow


@dataclass
class Queue:
    """The module's Prefect server, its environment, and the workers started on ``gradlab-local``."""

    home: Path
    api_url: str
    env: dict[str, str]
    workers: list[subprocess.Popen] = field(default_factory=list)

    def gradlab(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gradlab.cli.app", *args], capture_output=True, text=True,
                              cwd=REPO, env=self.env, timeout=timeout_s)

    def prefect(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "prefect", *args], capture_output=True, text=True, cwd=REPO,
                              env=self.env, timeout=timeout_s)

    def start_worker(self, name: str) -> None:
        log = (self.home / f"{name}.log").open("ab")
        try:
            self.workers.append(subprocess.Popen(
                [sys.executable, "-m", "prefect", "worker", "start", "--pool", "gradlab-local", "--type", "process",
                 "--limit", "1", "--name", name], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.home, env=self.env, start_new_session=True))
        finally:
            log.close()

    def online_workers(self) -> int:
        with self.client() as client:
            return sum(str(getattr(w.status, "value", w.status)) == "ONLINE"
                       for w in client.read_workers_for_work_pool("gradlab-local"))

    @contextlib.contextmanager
    def client(self):
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: self.api_url}), get_client(sync_client=True) as client:
            yield client

    def flow_run(self, flow_run_id: str):
        with self.client() as client:
            return client.read_flow_run(uuid.UUID(flow_run_id))

    def run_dir(self, run_id: str) -> Path:
        return self.home / "runs" / run_id


def _stop_groups(pgids: list[int], grace_s: float) -> None:
    """SIGTERM every process group, SIGKILL those still alive after ``grace_s`` seconds."""
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(group_alive(p) for p in pgids):
        time.sleep(0.2)
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def _our_processes(home: Path) -> list[int]:
    """Processes of this module (flow runs, learners): those whose environment names its home."""
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


@pytest.fixture(scope="module")
def queue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Queue]:
    home = tmp_path_factory.mktemp("queued_runs_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADLAB_HOME", str(home))
        mp.setenv("GRADLAB_CONFIG", str(home / "config.toml"))
        mp.delenv("PREFECT_API_URL", raising=False)
        settings = load_settings()
    with session_environ():  # its warm learner imports with the environment the workers get
        server = start_server(settings, timeout_s=120, idle_s=0)
    env = {**subprocess_env(), "GRADLAB_HOME": str(home), "GRADLAB_CONFIG": str(home / "config.toml"),
           "PREFECT_API_URL": server.api_url, "PREFECT_HOME": str(home / "prefect-client"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_WORKER_QUERY_SECONDS": "1",
           "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(home / "wandb")}
    for var in ("GRADLAB_EXPERIMENTS", "GRADLAB_CONTROL_STORE_URL", "GRADLAB_EVAL_STORE_URL", "GRADLAB_MODEL_STORE_URL"):
        env.pop(var, None)
    q = Queue(home=home, api_url=server.api_url, env=env)
    try:
        created = q.gradlab("pools", "create", "--json")
        assert created.returncode == 0, created.stderr
        assert {(r["name"], r["action"]) for r in json.loads(created.stdout)["applied"]} == {
            ("gradlab-local", "created"), ("gradlab-gpu", "created"), ("gpu", "created")}
        q.start_worker("worker-1")  # they start up while the deployments are made
        q.start_worker("worker-2")
        deployed = q.prefect("--no-prompt", "deploy", "--all")
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        wait_for(lambda: q.online_workers() >= 2, 120, "worker-1 and worker-2 online")
        yield q
    finally:
        _stop_groups([w.pid for w in q.workers], grace_s=5)  # workers before the server (docs/ARCHITECTURE.md, field notes)
        for worker in q.workers:
            worker.wait(timeout=10)
        for pid in _our_processes(home):  # a flow run or learner a stopped worker left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stop_server(settings)


@pytest.fixture
def stores_of(queue: Queue, monkeypatch: pytest.MonkeyPatch):
    """The stores the workers write (this test reads them with the module's GRADLAB_HOME)."""
    monkeypatch.setenv("GRADLAB_HOME", str(queue.home))
    monkeypatch.setenv("GRADLAB_CONFIG", str(queue.home / "config.toml"))
    return open_stores()


def _final_flow_run(queue: Queue, flow_run_id: str, timeout_s: float):
    return wait_for(lambda: (fr := queue.flow_run(flow_run_id)).state.is_final() and fr, timeout_s,
                    f"flow run {flow_run_id} final")


def _publications(stores, run_id: str) -> list[tuple[int, str]]:
    return [(p.step, p.sha256) for p in rules.list_publications(stores, run_id)]


def _learner_pid(queue: Queue, run_id: str) -> int:
    def started():
        path = queue.run_dir(run_id) / "outbox.sqlite"
        try:
            event = Outbox(path, readonly=True).last("learner_started") if path.exists() else None
        except (sqlite3.OperationalError, OSError):  # created, its tables not yet (OutboxError)
            return None
        return event and int(event.payload["pid"])

    return wait_for(started, 60, f"learner of {run_id} started")


def _launch(queue: Queue, *args: str) -> dict:
    launched = queue.gradlab("experiment", "launch", *args, "--json")
    assert launched.returncode == 0, launched.stderr
    return json.loads(launched.stdout)


def test_prefect_deployment_run_completes_with_a_succeeded_receipt(queue: Queue, stores_of) -> None:
    queued = queue.prefect("deployment", "run", "training-run/local", "-p", "recipe=gradlab__bandit/ppo")
    assert queued.returncode == 0, queued.stdout + queued.stderr
    flow_run_id = UUID_RE.search(queued.stdout).group(0)

    flow_run = _final_flow_run(queue, flow_run_id, 180)
    assert flow_run.state.type.value == "COMPLETED", flow_run.state.message
    # Queued without a run id: the flow reserved one and tagged its flow run with it.
    run_ids = [t for t in flow_run.tags if t.startswith("gradlab-")]
    assert len(run_ids) == 1 and set(flow_run.tags) == {"gradlab", "local", run_ids[0]}
    run_id = run_ids[0]
    terminal = rules.read_terminal(stores_of, run_id, "attempt-001")
    assert terminal.outcome == "succeeded", terminal.reason
    assert terminal.promotion is not None
    # The deployment's tags reach every task run (a tag concurrency limit counts task runs).
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with queue.client() as client:
        task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
    assert {f"open-run-{run_id}", f"seal-receipt-{run_id}"} <= {tr.name for tr in task_runs}
    assert any(tr.name.startswith(f"publish-{run_id}-step") for tr in task_runs)
    assert all({"gradlab", "local", run_id} <= set(tr.tags) for tr in task_runs), [tr.tags for tr in task_runs]

    # `experiment status` by the flow run id: Prefect state and receipt-level truth agree.
    shown = queue.gradlab("experiment", "status", "--run", flow_run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert status["run_id"] == run_id
    assert status["prefect"]["state"] == "Completed" and status["prefect"]["deployment"] == "training-run/local"
    assert status["prefect"]["ui_url"] == f"{queue.api_url[:-len('/api')]}/runs/flow-run/{flow_run_id}"
    assert status["stores"]["outcome"] == "succeeded"
    # At most the recipe's train.timesteps (fewer when the accepted evaluation stopped it early).
    assert status["stores"]["final_step"] == terminal.final_step and 0 < terminal.final_step <= 16384
    assert [c["step"] for c in status["stores"]["checkpoints"]] == [c.step for c in terminal.checkpoints]
    assert status["stores"]["promotion"]["checkpoint_step"] == terminal.promotion.checkpoint_step
    # Retry from the UI (`prefect flow-run retry`) reruns the same flow run, with no run id: the flow
    # finds its run by its tag, and the run gets a second attempt (drain only: the learner had finished).
    again = queue.prefect("flow-run", "retry", flow_run_id)
    assert again.returncode == 0, again.stdout + again.stderr
    rerun = _final_flow_run(queue, flow_run_id, 120)
    assert rerun.state.type.value == "COMPLETED" and rerun.run_count == 2, rerun.state.message
    attempts = rules.list_attempts(stores_of, run_id)
    assert [(a.attempt_id, a.mode) for a in attempts] == [("attempt-001", "fresh"), ("attempt-002", "drain")]
    drained = rules.read_terminal(stores_of, run_id, "attempt-002")
    assert drained.outcome == "succeeded" and drained.promotion == terminal.promotion
    # Logs: Prefect's flow-run log and the learner's log from the run directory on this machine.
    logs = queue.gradlab("experiment", "logs", "--run", run_id, "--tail", "3")
    assert logs.returncode == 0, logs.stderr
    assert f"== prefect logs of flow run {flow_run_id}" in logs.stdout
    assert f"== learner log {queue.run_dir(run_id) / 'learner.log'}" in logs.stdout


def _live_flow_runs(queue: Queue) -> set[str]:
    """This queue's flow runs that still have a live process (a worker's slot is held until it exits)."""
    with queue.client() as client:
        ours = {str(fr.id) for fr in client.read_flow_runs()}
    marker = b"PREFECT__FLOW_RUN_ID="
    live = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                live |= {v[len(marker):].decode() for v in (entry / "environ").read_bytes().split(b"\0")
                         if v.startswith(marker)}
        except OSError:
            continue
    return live & ours


def test_launch_two_seeds_one_per_worker(queue: Queue, stores_of) -> None:
    assert queue.online_workers() >= 2  # the fixture's two workers
    # Both workers free (limit 1 each): an earlier test's flow run holds its worker until its process exits.
    wait_for(lambda: not _live_flow_runs(queue), 120, "no flow run of an earlier test still running")
    logs_before = _worker_logs(queue)
    first = _launch(queue, "gradlab__bandit/ppo", "--seed", "1")
    assert first["parameters"] == {"recipe": "gradlab__bandit/ppo", "seed": 1, "overrides": [],
                                   "run_id": first["run_id"]}
    # The second one is followed until it ends (while the first runs on the other worker).
    followed = queue.gradlab("experiment", "launch", "gradlab__bandit/ppo", "--seed", "2", "--follow", "--json",
                             timeout_s=240)
    assert followed.returncode == 0, followed.stderr  # 0: its receipt says succeeded
    second = json.loads(followed.stdout)
    assert second["status"]["prefect"]["state"] == "Completed" and second["status"]["stores"]["outcome"] == "succeeded"
    assert "prefect Completed" in followed.stderr and "receipt: succeeded" in followed.stderr
    assert "checkpoint step 2048 published" in followed.stderr
    waited = queue.gradlab("experiment", "wait", "--run", first["run_id"], "--until", "terminal",
                           "--timeout", "3m", "--json", timeout_s=240)
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout) == {"run_id": first["run_id"], "until": "terminal", "reached": True,
                                         "state": "Completed", "outcome": "succeeded"}
    launched = [first, second]
    runs = [queue.flow_run(e["flow_run_id"]) for e in launched]
    for entry, seed in zip(launched, (1, 2), strict=True):
        terminal = rules.read_terminal(stores_of, entry["run_id"], "attempt-001")
        assert (terminal.outcome, terminal.seed) == ("succeeded", seed), terminal.reason
        assert terminal.promotion is not None and terminal.promotion.checkpoint_step <= terminal.final_step <= 16384
    # One per worker: both free, each took one of the two (when each ran is the processes' start-up
    # on a loaded machine: a run of ~15 s need not overlap the other).
    assert all(run.state.is_completed() for run in runs)
    takers = {}
    for path in logs_before:
        with path.open("rb") as f:
            f.seek(logs_before[path])
            logged = f.read().decode(errors="replace")
        # Both workers may try the same run at once: the server aborts the second submission.
        takers[path.stem] = {e["flow_run_id"] for e in launched if f"submitting flow run '{e['flow_run_id']}'" in logged
                             and f"Aborted submission of flow run '{e['flow_run_id']}'" not in logged}
    assert sorted(map(len, takers.values())) == [1, 1] and set.union(*takers.values()) == {
        e["flow_run_id"] for e in launched}, takers
    listed = queue.gradlab("experiment", "list", "--goal", "gradlab__bandit", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["run_id"]: r for r in json.loads(listed.stdout)}
    for entry, seed in zip(launched, (1, 2), strict=True):
        assert rows[entry["run_id"]] | {"created": None} == {
            "run_id": entry["run_id"], "flow_run_id": entry["flow_run_id"], "deployment": "training-run/local",
            "state": "Completed", "recipe": "gradlab__bandit/ppo", "seed": seed, "created": None, "flow_runs": 1,
            "outcome": "succeeded", "promoted_step": rules.read_promotion(stores_of, entry["run_id"]).checkpoint_step}
    assert queue.gradlab("experiment", "list", "--goal", "CartPole-v1", "--json").stdout.strip() == "[]"


def test_launch_validates_first_and_a_run_never_taken_is_refused_retry_then_cancelled(queue: Queue, stores_of) -> None:
    """The refusals of `experiment launch|wait|retry|cancel`, on a run no worker takes: the
    `gradlab-gpu` pool has no worker here, so a run queued on `training-run/gpu` stays Scheduled."""
    with queue.client() as client:
        before = len(client.read_flow_runs())
    bad = queue.gradlab("experiment", "launch", "gradlab__bandit/ppo", "--set", "train.timestepz=1")
    assert bad.returncode == 1 and "train.timestepz: unknown key (did you mean timesteps?)" in bad.stderr, bad.stderr
    with queue.client() as client:
        assert len(client.read_flow_runs()) == before  # validated before anything was queued

    entry = _launch(queue, "gradlab__bandit/ppo", "--deployment", "training-run/gpu")
    run_id = entry["run_id"]
    waited = queue.gradlab("experiment", "wait", "--run", run_id, "--until", "running", "--timeout", "1s", "--json")
    assert waited.returncode == 1, waited.stdout + waited.stderr  # timed out: never seen running
    summary = json.loads(waited.stdout)
    assert (summary["reached"], summary["outcome"]) == (False, None)
    assert summary["state"] in ("Scheduled", "Late")  # Prefect renames a scheduled run that is overdue
    live = queue.gradlab("experiment", "retry", "--run", run_id)
    assert live.returncode == 1 and f"flow run {entry['flow_run_id']} is still" in live.stderr, live.stderr
    assert "wait for it or cancel it first" in live.stderr

    cancelled = queue.gradlab("experiment", "cancel", "--run", run_id, "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout) == {"run_id": run_id, "cancelled": [
        {"flow_run_id": entry["flow_run_id"], "state": "CANCELLED"}]}  # never started: cancelled at once
    assert queue.flow_run(entry["flow_run_id"]).state.type.value == "CANCELLED"
    # No worker ever opened it: nothing in the stores to retry, and nothing left to cancel.
    never = queue.gradlab("experiment", "retry", "--run", run_id)
    assert never.returncode == 1 and "was never opened in the stores: launch it again instead" in never.stderr
    assert rules.list_attempts(stores_of, run_id) == []
    again = queue.gradlab("experiment", "cancel", "--run", entry["flow_run_id"])
    assert again.returncode == 1 and "nothing to cancel" in again.stderr


@pytest.fixture(scope="module")
def long_runs(queue: Queue) -> dict[str, dict]:
    """Two runs launched at once, one per worker (their start-ups overlap, which saves a minute):
    ``cancel``, a CartPole run the cancel test cancels, and ``kill``, a long bandit run whose
    learner is SIGKILLed here once two checkpoints are published (the retry test retries it)."""
    # The cancelled run's budget outlasts any wait here: CartPole's 100,000 steps take ~12 s now.
    runs = {"cancel": _launch(queue, "CartPole-v1/ppo", "--no-eval", "--set", "train.timesteps=4000000"),
            "kill": _launch(queue, "gradlab__bandit/ppo", "--no-eval", "--set", "train.timesteps=32768")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADLAB_HOME", str(queue.home))
        mp.setenv("GRADLAB_CONFIG", str(queue.home / "config.toml"))
        stores = open_stores()
    run_id = runs["kill"]["run_id"]
    learner = _learner_pid(queue, run_id)
    # Frozen once it has written two checkpoints, so that it cannot reach its last step while the
    # flow publishes them (a loaded machine publishes late): the retry then resumes, not drains.
    wait_for(lambda: _checkpoints_written(queue, run_id) >= 2, 120, "two checkpoints written", interval_s=0.05)
    os.kill(learner, signal.SIGSTOP)
    wait_for(lambda: len(_publications(stores, run_id)) >= 2, 120, "two published checkpoints")
    os.kill(learner, signal.SIGKILL)
    return runs


def _checkpoints_written(queue: Queue, run_id: str) -> int:
    try:
        with Outbox(queue.run_dir(run_id) / "outbox.sqlite", readonly=True) as outbox:
            return sum(e.kind == "checkpoint_ready" for e in outbox.read(0, 10_000))
    except (sqlite3.OperationalError, OSError):
        return 0


def test_cancel_stops_the_learner_and_keeps_every_published_checkpoint(queue: Queue, stores_of, long_runs) -> None:
    entry = long_runs["cancel"]
    run_id = entry["run_id"]
    running = queue.gradlab("experiment", "wait", "--run", run_id, "--until", "running", "--timeout", "90")
    assert running.returncode == 0, running.stderr
    learner = _learner_pid(queue, run_id)
    wait_for(lambda: len(_publications(stores_of, run_id)) >= 1, 120, "a published checkpoint")

    cancel = queue.gradlab("experiment", "cancel", "--run", run_id, "--json")
    assert cancel.returncode == 0, cancel.stderr
    assert json.loads(cancel.stdout) == {"run_id": run_id, "cancelled": [
        {"flow_run_id": entry["flow_run_id"], "state": "CANCELLING"}]}
    waited = queue.gradlab("experiment", "wait", "--run", run_id, "--until", "terminal", "--timeout", "90", "--json")
    assert json.loads(waited.stdout)["state"] == "Cancelled", waited.stdout + waited.stderr

    wait_for(lambda: not pid_alive(learner) and not group_alive(learner), 15, "learner and its group gone")
    terminal = rules.read_terminal(stores_of, run_id, "attempt-001")
    assert terminal.outcome == "cancelled", terminal.reason
    published = _publications(stores_of, run_id)
    assert published and [(c.step, c.sha256) for c in terminal.checkpoints] == published
    for c in terminal.checkpoints:  # intact: every bundle's manifest still names its sha256
        name = c.uri.rstrip("/").rsplit("/", 1)[-1]
        assert json.loads(stores_of.model.get(f"runs/{run_id}/checkpoints/{name}/manifest.json"))["sha256"] == c.sha256
    time.sleep(1.5)
    assert _publications(stores_of, run_id) == published  # nothing published after the cancel
    # Cancelling again is refused: nothing is scheduled or running.
    again = queue.gradlab("experiment", "cancel", "--run", run_id)
    assert again.returncode == 1 and "nothing to cancel" in again.stderr


def test_retry_after_a_sigkilled_learner_resumes_to_the_planned_steps(queue: Queue, stores_of, long_runs) -> None:
    entry = long_runs["kill"]  # its learner was SIGKILLed after two published checkpoints
    run_id = entry["run_id"]
    first = _final_flow_run(queue, entry["flow_run_id"], 90)
    assert first.state.type.value == "FAILED"
    failed = rules.read_terminal(stores_of, run_id, "attempt-001")
    assert failed.outcome == "failed" and "exited with code -9" in failed.reason
    published_before = _publications(stores_of, run_id)

    retried = queue.gradlab("experiment", "retry", "--run", run_id, "--json")
    assert retried.returncode == 0, retried.stderr
    second = json.loads(retried.stdout)
    assert second["parameters"] == {"run_id": run_id} and second["deployment"] == "training-run/local"
    assert second["flow_run_id"] != entry["flow_run_id"]
    waited = queue.gradlab("experiment", "wait", "--run", run_id, "--until", "terminal", "--timeout", "3m", "--json",
                           timeout_s=240)
    assert json.loads(waited.stdout)["outcome"] == "succeeded", waited.stdout + waited.stderr

    terminal = rules.read_terminal(stores_of, run_id, "attempt-002")
    assert terminal.outcome == "succeeded", terminal.reason
    assert terminal.final_step == 32768  # the planned step count, not more
    attempt = next(a for a in rules.list_attempts(stores_of, run_id) if a.attempt_id == "attempt-002")
    assert attempt.mode == "resume" and attempt.resume_from.step == published_before[-1][0]
    after = {(c.step, c.sha256) for c in terminal.checkpoints}
    assert set(published_before) <= after  # nothing published was lost or replaced
    status = json.loads(queue.gradlab("experiment", "status", "--run", run_id, "--json").stdout)
    assert [f["state"] for f in status["flow_runs"]] == ["Completed", "Failed"]
    assert [a["outcome"] for a in status["stores"]["attempts"]] == ["failed", "succeeded"]


def _worker_logs(queue: Queue) -> dict[Path, int]:
    return {p: p.stat().st_size for p in queue.home.glob("worker-*.log")}


def _flow_run_processes(flow_run_id: str) -> list[int]:
    """Live processes started for a flow run (the worker gives each ``PREFECT__FLOW_RUN_ID``)."""
    marker = f"PREFECT__FLOW_RUN_ID={flow_run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0") \
                    and pid_alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _logged_since(sizes: dict[Path, int], queue: Queue) -> str:
    text = ""
    for path in queue.home.glob("worker-*.log"):
        with path.open("rb") as f:
            f.seek(sizes.get(path, 0))
            text += f.read().decode(errors="replace")
    return text


@pytest.fixture(scope="module")
def fault_runs(queue: Queue) -> dict[str, dict]:
    """Two runs launched at once (one per worker when both are up): ``rejected``, whose policy never
    learns (learning rate 0: random arms, every evaluation rejected), and ``crash``, a long bandit
    run whose flow process the crash-hook test SIGKILLs. ``logs_before``: the worker logs' sizes."""
    logs_before = _worker_logs(queue)
    return {"logs_before": logs_before,
            "rejected": _launch(queue, "gradlab__bandit/ppo", "--set", "train.timesteps=4096",
                                "--set", "train.backend.config.learning_rate=0.0"),
            "crash": _launch(queue, "gradlab__bandit/ppo", "--no-eval", "--set", "train.timesteps=1048576")}


def test_a_rejected_run_ends_failed_in_prefect_with_no_traceback_in_the_worker_log(queue: Queue, stores_of,
                                                                                    fault_runs) -> None:
    entry = fault_runs["rejected"]
    flow_run = _final_flow_run(queue, entry["flow_run_id"], 180)
    terminal = rules.read_terminal(stores_of, entry["run_id"], "attempt-001")
    assert terminal.outcome == "failed" and "no checkpoint met the acceptance rule" in terminal.reason, terminal.reason
    assert flow_run.state.type.value == "FAILED"
    assert flow_run.state.message == f"failed: {terminal.reason}"
    # The engine writes its last lines after the final state: read the logs once its process is gone.
    wait_for(lambda: not _flow_run_processes(entry["flow_run_id"]), 60, "the flow run's process gone")
    logged = _logged_since(fault_runs["logs_before"], queue)
    assert "Traceback" not in logged and "Unexpected result" not in logged, logged[-4000:]
    # `experiment status` names the last evaluation; `experiment logs` names the task of every line.
    shown = queue.gradlab("experiment", "status", "--run", entry["run_id"])
    last = max(terminal.evaluations, key=lambda e: e.checkpoint_step)
    assert f"last evaluation: step {last.checkpoint_step} rejected" in shown.stdout, shown.stdout + shown.stderr

    def prefect_lines_now() -> list[str] | None:  # the flow's logs reach the API in batches
        logs = queue.gradlab("experiment", "logs", "--run", entry["run_id"])
        assert logs.returncode == 0, logs.stderr
        lines = logs.stdout.split("== learner log")[0].splitlines()[1:]
        return lines if any(f"[evaluate-{entry['run_id']}-step" in line for line in lines) else None

    prefect_lines = wait_for(prefect_lines_now, 120, "the flow run's task logs in `experiment logs`", interval_s=2)
    assert prefect_lines and all(re.match(r"^\S+ \S+\s+\[[^\]]+\] ", line) for line in prefect_lines if line), [
        line for line in prefect_lines if line and not re.match(r"^\S+ \S+\s+\[[^\]]+\] ", line)]
    assert any(f"[evaluate-{entry['run_id']}-step" in line for line in prefect_lines), prefect_lines


def test_a_sigkilled_flow_run_is_sealed_by_its_crash_hook_with_its_own_inventory(queue: Queue, stores_of,
                                                                                  fault_runs) -> None:
    from gradlab.receipts.lease import read_lease

    entry = fault_runs["crash"]
    run_id = entry["run_id"]
    learner = _learner_pid(queue, run_id)
    wait_for(lambda: len(_publications(stores_of, run_id)) >= 1, 120, "a published checkpoint")
    # A running run's status shows where its learner is, and how fast.
    status = json.loads(queue.gradlab("experiment", "status", "--run", run_id, "--json").stdout)
    live = status["stores"]["live"]
    assert live["timesteps"] == 1048576 and 0 < live["step"] < 1048576 and live["steps_per_s"] > 0, live
    shown = queue.gradlab("experiment", "status", "--run", run_id).stdout
    assert re.search(r"training: step [\d,]+/1,048,576 \([\d,]+ steps/s\)", shown), shown
    flow_pid = int(read_lease(stores_of.control, run_id).lease.owner.rpartition(":")[2])
    os.kill(flow_pid, signal.SIGKILL)

    # Prefect runs on_crashed in the worker's process a few seconds later: no `runs reconcile` needed.
    terminal = wait_for(lambda: rules.read_terminal(stores_of, run_id, "attempt-001"), 90, "the crash hook's receipt")
    assert terminal.outcome == "failed" and terminal.reason.startswith("crashed: "), terminal.reason
    published = [(p.step, p.sha256) for p in rules.list_publications(stores_of, run_id) if p.attempt_id == "attempt-001"]
    assert published and [(c.step, c.sha256) for c in terminal.checkpoints] == published
    # what the journal holds, by the outbox's mark the dead flow wrote (no other sink is claimed)
    assert terminal.metrics.local_high_water > 0 and terminal.metrics.sinks == {"journal": terminal.metrics.local_high_water}
    # the hook releases the lease after sealing, so a retry may start at once
    wait_for(lambda: read_lease(stores_of.control, run_id).lease.released, 60, "the crash hook's lease release")
    wait_for(lambda: not pid_alive(learner) and not group_alive(learner), 30, "the orphaned learner stopped")
    flow_run = _final_flow_run(queue, entry["flow_run_id"], 60)
    assert flow_run.state.type.value == "CRASHED"
