"""Faults, each ending with nothing published lost or overwritten (issue: the training run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gradlab import receipts as rules
from gradlab.outbox import Outbox
from gradlab.stores import open_stores
from tests.runs.conftest import (
    gradlab_env,
    group_alive,
    last_json_line,
    only_run_dir,
    pid_alive,
    run_gradlab,
    start_gradlab,
    stop_outside_a_write,
    wait_for,
)
from tests.s3server import s3_server  # noqa: F401  (fixture)

LONG_BANDIT = ["train", "gradlab__bandit/ppo", "--no-eval", "--set", "train.timesteps=65536", "--json"]


def _learner_pid(run_dir: Path) -> int:
    event = Outbox(run_dir / "outbox.sqlite", readonly=True).last("learner_started")
    return int(event.payload["pid"])


def _local_checkpoints(outbox: Path) -> int:
    """Checkpoints the learner has written (0 while its outbox is still being created)."""
    try:
        return len(Outbox(outbox, readonly=True).read(kind="checkpoint_ready", limit=10))
    except Exception:  # noqa: BLE001 - the learner is still creating its tables: none yet
        return 0


def _publications(run_id: str) -> list[tuple[int, str]]:
    return [(p.step, p.sha256) for p in rules.list_publications(open_stores(), run_id)]


def _flow_runs_of(prefect_api: str, run_id: str) -> list:
    """The flow runs of gradlab run ``run_id``: the flow tags its flow run with the run id (filtered
    by the server, so other tests' runs on the same server never crowd it out of a page)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_api}), get_client(sync_client=True) as client:
        return list(client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[run_id]))))


def _started_run(home: Path) -> Path:
    return wait_for(lambda: (d := only_run_dir(home)) and (d / "outbox.sqlite").exists() and d, 60, "run directory")


@pytest.mark.slow
def test_sigkill_of_the_learner_then_retry_resumes_to_the_planned_steps(prefect_api: str, gradlab_home: Path) -> None:
    env = gradlab_env(prefect_api)
    proc = start_gradlab(LONG_BANDIT, env)
    try:
        run_dir = _started_run(gradlab_home)
        run_id = run_dir.name
        # Freeze the learner as soon as it has written two checkpoints, so it is killed mid-run
        # however far ahead of the publications it is on a loaded machine (the bandit trains fast).
        outbox = run_dir / "outbox.sqlite"
        wait_for(lambda: _local_checkpoints(outbox) >= 2, 120, "two local checkpoints", interval_s=0.02)
        learner = _learner_pid(run_dir)
        stop_outside_a_write([learner], outbox)  # between writes: not holding the outbox's lock
        assert Outbox(outbox, readonly=True).last("learner_finished") is None
        wait_for(lambda: len(_publications(run_id)) >= 2, 120, "two published checkpoints")
        os.kill(learner, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1, err[-3000:]
    first = last_json_line(out)
    assert first["outcome"] == "failed"
    assert "exited with code -9 before finishing (killed by SIGKILL, not by an error of its own" in first["reason"]
    published_before = _publications(run_id)
    assert [(c["step"], c["sha256"]) for c in first["checkpoints"]] == published_before
    last_step = published_before[-1][0]

    retry = run_gradlab(["runs", "retry", run_id, "--json"], env, timeout_s=300)
    assert retry.returncode == 0, retry.stderr[-3000:]
    second = last_json_line(retry.stdout)
    assert second["attempt_id"] == "attempt-002"
    assert second["outcome"] == "succeeded", second["reason"]
    assert second["final_step"] == 65536  # the planned step count, not more
    # The retry says what it does and shows its progress as train does (off a terminal: lines).
    said = " ".join(retry.stderr.split())
    assert (f"run {run_id}: attempt 2; the learner resumes from the newest checkpoint that verifies "
            f"(published: step {last_step:,}; a newer local one verified against its manifest goes first)") in said
    assert f"Prefect API: {prefect_api}" in said and "step 65,536/65,536" in said
    attempt = next(a for a in rules.list_attempts(open_stores(), run_id) if a.attempt_id == "attempt-002")
    assert attempt.mode == "resume" and attempt.resume_from.step == last_step
    after = {(c["step"], c["sha256"]) for c in second["checkpoints"]}
    assert set(published_before) <= after  # nothing published was lost or replaced
    assert max(step for step, _ in after) == 65536


def _ctrl_c(proc) -> tuple[str, str]:
    """A terminal's Ctrl-C (SIGINT to the command's whole process group); its output once it ends."""
    try:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        return proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_cancels_cleanly_while_evaluating(prefect_api: str, gradlab_home: Path) -> None:
    """A terminal's Ctrl-C goes to the whole foreground process group: the evaluation processes and
    W&B's service get it too. The run must still end ``cancelled``, without tracebacks."""
    env = gradlab_env(prefect_api)
    proc = start_gradlab(["train", "CartPole-v1/ppo", "--json"], env, own_group=True)
    try:
        run_dir = _started_run(gradlab_home)
        wait_for(lambda: len(_publications(run_dir.name)) >= 1, 120, "a published checkpoint")
        learner = _learner_pid(run_dir)
    finally:
        out, err = _ctrl_c(proc)
    assert proc.returncode == 1, err[-3000:]
    receipt = last_json_line(out)
    assert (receipt["outcome"], receipt["reason"]) == ("cancelled", "interrupted by the user (Ctrl-C)")
    assert receipt["metrics"]["pending"] == []  # W&B (offline) survived the Ctrl-C and got every event
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "Crash detected" not in err, err[-3000:]
    assert "cancelling: the learner stops" in err
    wait_for(lambda: not pid_alive(learner) and not group_alive(learner), 15, "learner gone")


@pytest.mark.slow
def test_ctrl_c_before_the_flow_has_started_still_seals_cancelled(prefect_api: str, gradlab_home: Path) -> None:
    env = gradlab_env(prefect_api)
    proc = start_gradlab(LONG_BANDIT, env, own_group=True)
    try:
        _started_run(gradlab_home)  # the learner is up; the flow is still importing Prefect
    finally:
        out, err = _ctrl_c(proc)
    assert proc.returncode == 1, err[-3000:]
    assert last_json_line(out)["outcome"] == "cancelled", err[-3000:]
    assert "Traceback" not in err, err[-3000:]


@pytest.mark.slow
def test_one_ctrl_c_delivered_twice_still_cancels_cleanly(prefect_api: str, gradlab_home: Path) -> None:
    """``uv run`` without a TTY relays SIGINT to the command that the terminal already sent it
    (through the process group): the same Ctrl-C arrives twice, microseconds apart. It must count as
    one: a clean ``cancelled`` receipt, not an abort. (Two SIGINTs closer together than the handler
    runs are one pending signal to the kernel; uv's relay comes about 200 ms after.)"""
    env = gradlab_env(prefect_api)
    proc = start_gradlab(LONG_BANDIT, env, own_group=True)
    try:
        run_dir = _started_run(gradlab_home)
        wait_for(lambda: len(_publications(run_dir.name)) >= 1, 120, "a published checkpoint")
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.25)  # uv relays it about 200 ms later (a delivery, not a wait on a condition)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, err[-3000:]
    receipt = last_json_line(out)
    assert (receipt["outcome"], receipt["reason"]) == ("cancelled", "interrupted by the user (Ctrl-C)")
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]


@pytest.mark.slow
def test_ctrl_c_cancels_cleanly(prefect_api: str, gradlab_home: Path) -> None:
    env = gradlab_env(prefect_api)
    proc = start_gradlab(LONG_BANDIT, env)
    try:
        run_dir = _started_run(gradlab_home)
        run_id = run_dir.name
        wait_for(lambda: len(_publications(run_id)) >= 1, 120, "a published checkpoint")
        learner = _learner_pid(run_dir)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1, err[-3000:]
    receipt = last_json_line(out)
    assert receipt["outcome"] == "cancelled", receipt["reason"]
    # The supervisor stops the learner's group before it seals: once the command has exited, the
    # learner is gone or going (a zombie being reaped); no budget derived from elapsed time.
    wait_for(lambda: not pid_alive(learner) and not group_alive(learner), 30,
             "learner and its process group gone after the cancelled receipt")
    # No checkpoint was published after the cancel: the store holds exactly the receipt's inventory
    # (the flow ran inside the exited command, so nothing is left that could publish later).
    assert [(c["step"], c["sha256"]) for c in receipt["checkpoints"]] == _publications(run_id)


@pytest.mark.slow
def test_prefect_flow_run_cancel_stops_a_direct_run(prefect_api: str, gradlab_home: Path) -> None:
    env = gradlab_env(prefect_api)
    # A budget no run reaches while `prefect flow-run cancel` starts (seconds of imports): the cancel
    # always meets a training run, however the machine's load divides it between them.
    proc = start_gradlab([*LONG_BANDIT, "--set", "train.timesteps=50000000"], env)
    try:
        run_dir = _started_run(gradlab_home)
        run_id = run_dir.name
        wait_for(lambda: len(_publications(run_id)) >= 1, 120, "a published checkpoint")

        def flow_run_id() -> str | None:
            runs = _flow_runs_of(prefect_api, run_id)
            return str(runs[0].id) if runs else None

        fr_id = wait_for(flow_run_id, 60, "the flow run in the Prefect API")
        cancel = subprocess.run(["prefect", "flow-run", "cancel", fr_id], capture_output=True, text=True, env=env,
                                timeout=60)
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        out, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 1, err[-3000:]
    receipt = last_json_line(out)
    assert (receipt["outcome"], receipt["reason"]) == ("cancelled", "the flow run was cancelled (Prefect)")
    assert not pid_alive(_learner_pid(run_dir))


@pytest.mark.slow
def test_s3_down_during_publication_is_retried(prefect_api: str, gradlab_home: Path, s3_server,  # noqa: F811
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    urls = {"GRADLAB_CONTROL_STORE_URL": s3_server.url("control"), "GRADLAB_EVAL_STORE_URL": s3_server.url("eval"),
            "GRADLAB_MODEL_STORE_URL": s3_server.url("model")}
    for name, value in urls.items():
        monkeypatch.setenv(name, value)  # the test reads the same stores as the run
    env = gradlab_env(prefect_api, **urls)
    proc = start_gradlab(LONG_BANDIT, env)
    try:
        run_dir = _started_run(gradlab_home)
        run_id = run_dir.name
        # Publication has begun and checkpoints keep arriving: take the store down for 4 s.
        wait_for(lambda: len(_publications(run_id)) >= 1, 120, "a published checkpoint in the S3 model store")
        s3_server.stop()
        time.sleep(4)  # the outage's length (a fault injected for 4 s), not a wait for something to happen
        s3_server.restart()
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    receipt = last_json_line(out)
    assert receipt["outcome"] == "succeeded", receipt["reason"]
    assert receipt["final_step"] == 65536
    # The outage really hit the run: some task needed more than one try.
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    flow_runs = _flow_runs_of(prefect_api, run_id)
    assert flow_runs
    with temporary_settings(updates={PREFECT_API_URL: prefect_api}), get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[fr.id for fr in flow_runs])))
    assert any(tr.run_count > 1 for tr in runs), [(tr.name, tr.run_count) for tr in runs]
    # Every published checkpoint verifies in the store.
    stores = open_stores()
    for c in receipt["checkpoints"]:
        pub = next(p for p in rules.list_publications(stores, run_id) if p.step == c["step"])
        assert pub.sha256 == c["sha256"]
        manifest = json.loads(stores.model.get(f"runs/{run_id}/checkpoints/{c['uri'].rstrip('/').rsplit('/', 1)[-1]}/manifest.json"))
        assert manifest["sha256"] == c["sha256"]


@pytest.mark.slow
def test_an_s3_outage_longer_than_the_retries_fails_the_task_with_its_cause_and_writes_nothing(
        prefect_api: str, s3_server, capfd: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    """A task facing an outage that outlasts its retries: every try is made (the retry policy's
    count), the final state is Failed with the transient cause naming the endpoint, nothing is
    written; once the store is back the same call succeeds. The delays are shortened here (the
    policy's are 1, 2, 4, 8 s). Prefect's notice of each failed try is one line, no traceback."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW, temporary_settings

    import flows.training_run  # noqa: F401 - installs the training flow's log filters
    from gradlab.errors import StoreUnavailable
    from gradlab.stores import Stores, open_store
    from tasks import run_tasks
    from tasks._policy import RETRIES

    stores = Stores(*(open_store(s3_server.url(name)) for name in ("control", "eval", "model")))
    run_id = "gradlab-20260102T030405-0123abcd"
    task = run_tasks.request_stop.with_options(retry_delay_seconds=[0.1] * RETRIES)
    s3_server.stop()
    # A task called outside a flow run (its logs have no flow run to go to: kept local).
    with temporary_settings(updates={PREFECT_API_URL: prefect_api, PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW: "ignore"}):
        state = task(stores, run_id, "attempt-001", "accepted:2048", return_state=True)
        assert state.is_failed(), state
        with pytest.raises(StoreUnavailable, match=f"cannot reach {s3_server.endpoint_url}"):
            state.result()
        with get_client(sync_client=True) as client:
            task_run = client.read_task_run(state.state_details.task_run_id)
        assert task_run.run_count == RETRIES + 1  # the first try and every retry
        s3_server.restart()
        assert rules.read_stop_request(stores, run_id) is None  # nothing was written during the outage
        again = task(stores, run_id, "attempt-001", "accepted:2048", return_state=True)
    assert again.is_completed(), again
    err = capfd.readouterr().err
    assert err.count("StoreUnavailable") >= RETRIES and "Traceback" not in err, err[-3000:]
    assert rules.read_stop_request(stores, run_id).reason == "accepted:2048"


@pytest.mark.slow
def test_a_retry_passes_over_a_corrupt_published_checkpoint_and_succeeds(prefect_api: str, gradlab_home: Path) -> None:
    """The newest published checkpoint corrupted in the run directory and the model store: the
    retry resumes from the one before, never evaluates nor promotes the corrupt one, names it, and
    succeeds (docs/ARCHITECTURE.md section 6)."""
    from gradlab.checkpoints import list_checkpoints
    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.learn.learner import run_learner
    from gradlab.receipts.lease import release_lease
    from gradlab.runs import operations
    from gradlab.runs.paths import RunPaths
    from gradlab.settings import load_settings
    from gradlab.stores import keys

    run_id = "gradlab-20260102T030405-0badc0de"
    resolved = Experiments().resolve("gradlab__bandit/ppo", [
        "train.timesteps=512", "train.checkpoint_freq=64", "train.backend.config.n_steps=8",
        # One small update per checkpoint at a low learning rate: the first checkpoints are rejected
        # (so the corrupt one is next in line for evaluation), a later one is accepted.
        "train.backend.config.batch_size=64", "train.backend.config.learning_rate=4.0e-5"])
    spec = RunSpec.from_resolved(resolved, seed=0, run_id=run_id)
    run_dir = load_settings().run_dir(run_id)
    assert run_learner(spec, run_dir, stop_at_step=128, watch_parent=False).final_step == 128
    stores = open_stores()
    operations.write_local_spec(RunPaths(run_dir), spec)
    rules.open_run(stores, spec)
    _, held = rules.begin_attempt(stores, run_id, mode="fresh")
    pubs = [rules.publish_checkpoint(stores, run_id=run_id, attempt_id="attempt-001", checkpoint_dir=c)
            for c in list_checkpoints(run_dir)]
    release_lease(stores.control, held)  # attempt-001 died unsealed (its learner SIGKILLed)
    assert [p.step for p in pubs] == [64, 128]
    bad = pubs[-1]
    name = "resume/state.json"
    local = run_dir / "checkpoints" / keys.checkpoint_name(bad.step, bad.sha256) / name
    local.write_bytes(local.read_bytes() + b" ")
    key = keys.checkpoint_file(run_id, bad.step, bad.sha256, name)
    _, etag = stores.model.get_with_etag(key)
    stores.model.put_if_match(key, stores.model.get(key) + b" ", etag)

    retry = run_gradlab(["runs", "retry", run_id, "--json"], gradlab_env(prefect_api), timeout_s=300)
    assert retry.returncode == 0, retry.stderr[-3000:]
    receipt = last_json_line(retry.stdout)
    assert receipt["outcome"] == "succeeded", receipt["reason"]
    attempt = next(a for a in rules.list_attempts(stores, run_id) if a.attempt_id == receipt["attempt_id"])
    assert attempt.mode == "resume" and attempt.resume_from.step == 64
    [note] = attempt.skipped_checkpoints
    assert note.startswith(f"step 128: {stores.model.url(key)}: sha256 expected")
    evaluated = {e["checkpoint_step"]: e["status"] for e in receipt["evaluations"]}
    assert evaluated[64] == "rejected", evaluated
    # Named in the receipt as a failed evaluation (never run), never promoted, kept as evidence.
    [failed] = [e for e in receipt["evaluations"] if e["checkpoint_step"] == 128 and e["status"] == "failed"]
    record = next(rec for _, rec in rules.list_evaluations(stores, run_id) if rec and rec.checkpoint_sha256 == bad.sha256)
    assert record.status == "failed" and "not evaluated" in record.error and stores.model.url(key) in record.error
    assert receipt["promotion"]["sha256"] != bad.sha256
    assert stores.model.exists(key) and list((run_dir / "checkpoints").glob(f"{local.parents[1].name}.corrupt-*"))


# The Prefect API lost after the run's receipt was sealed, as ``gradlab server stop --force`` during
# a run does: the flow call then raises the client's connection error. The wrapper calls the real
# flow (the real engine, against the test server) and raises the error httpx gives for a refused
# connection once the flow has returned.
_API_LOST_AFTER_SEAL = """
import sys, httpx
import gradlab.cli.train_cmds as train_cmds
real = train_cmds.run_flow
def run_flow(**params):
    real(**params)
    raise httpx.ConnectError("All connection attempts failed")
train_cmds.run_flow = run_flow
from gradlab.cli.app import main
sys.argv = ["gradlab", *sys.argv[1:]]
main()
"""


@pytest.mark.slow
def test_a_prefect_api_lost_after_the_receipt_was_sealed_reports_the_receipt(prefect_api: str,
                                                                           gradlab_home: Path) -> None:
    import sys

    from tests.runs.conftest import REPO

    out = subprocess.run([sys.executable, "-c", _API_LOST_AFTER_SEAL, "train", "gradlab__bandit/ppo", "--json"],
                         capture_output=True, text=True, cwd=REPO, env=gradlab_env(prefect_api), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]  # the receipt says succeeded: so does the exit code
    receipt = last_json_line(out.stdout)
    assert receipt["outcome"] == "succeeded" and receipt["promotion"] is not None
    assert "Prefect: the supervising flow ended with ConnectError (All connection attempts failed)" in out.stderr
    assert "the supervising flow failed" not in out.stderr


@pytest.mark.slow
def test_ctrl_c_in_a_sweep_seals_a_cohort_receipt_naming_the_seeds_that_never_started(
        prefect_api: str, gradlab_home: Path) -> None:
    """One seed at a time; Ctrl-C while the first trains: it seals ``cancelled``, the other two never
    start, and the cohort receipt lists all three (issue: cohorts without survivorship bias)."""
    from gradlab.results.cohort_receipts import list_cohorts

    env = gradlab_env(prefect_api)
    proc = start_gradlab(["sweep", "gradlab__bandit/ppo", "--seeds", "3", "--max-parallel", "1", "--json",
                          "--set", "train.timesteps=1000000", "--set", "train.backend.config.learning_rate=1e-9"],
                         env, own_group=True)
    try:
        _started_run(gradlab_home)  # seed 0's learner is up
    finally:
        out, err = _ctrl_c(proc)
    assert proc.returncode == 1, err[-3000:]
    assert out.strip(), err[-3000:]
    cohort = last_json_line(out)["cohort"]
    assert cohort["seeds"] == [0, 1, 2] and [r["seed"] for r in cohort["runs"]] == [0, 1, 2]
    first, *rest = cohort["runs"]
    assert first["outcome"] == "cancelled" and first["flow_run_id"]
    assert [(r["outcome"], r["flow_run_id"], r["scored_by"]) for r in rest] == [(None, None, "not scored")] * 2
    assert cohort["interrupted"] == "interrupted by the user (Ctrl-C) before every seed started"
    [stored] = list_cohorts(open_stores())
    assert stored.model_dump(mode="json") == cohort
    assert sorted(d.name for d in (gradlab_home / "runs").glob("gradlab-*")) == [first["run_id"]]  # nothing started
    assert (f"2 seeds never started ({cohort['interrupted']}): seed 1 ({rest[0]['run_id']}), "
            f"seed 2 ({rest[1]['run_id']})") in " ".join(err.split()), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
