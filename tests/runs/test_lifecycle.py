"""The run lifecycle under faults, end to end against a real Prefect server (issue 16): a retry
after an early cancel, failures sealed with their first cause, hooks and reconciliation."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradlab import receipts as rules
from gradlab.outbox import Outbox
from gradlab.outbox.store import OutboxError
from gradlab.receipts.lease import read_lease
from gradlab.stores import open_stores
from tests.runs.conftest import (
    gradlab_env,
    last_json_line,
    only_run_dir,
    pid_alive,
    run_gradlab,
    start_gradlab,
    stop_outside_a_write,
    wait_for,
)

#: A budget the cancel lands well inside (gradlab.ppo trains the bandit's 16,384 steps in well under a
#: second, sometimes before a Ctrl-C reached it), and no periodic checkpoint: the only one a cancelled
#: learner leaves is its final one, never published.
BUDGET = 262144
NO_PERIODIC = ["--set", f"train.timesteps={BUDGET}", "--set", "train.checkpoint_freq=1000000"]


def _outbox(run_dir: Path) -> Outbox | None:
    path = run_dir / "outbox.sqlite"
    try:
        return Outbox(path, readonly=True) if path.exists() else None
    except Exception:  # noqa: BLE001 - created, its tables not yet
        return None


def _last(run_dir: Path, kind: str):
    """The outbox's last ``kind`` event, or None while there is none (or the outbox has no tables yet)."""
    try:
        outbox = _outbox(run_dir)
        return outbox.last(kind) if outbox is not None else None
    except OutboxError:
        return None


def _trained_a_little(home: Path) -> Path | None:
    """The run directory once its attempt is open and its learner has reported a metric."""
    run_dir = only_run_dir(home)
    if run_dir is None or not rules.list_attempts(open_stores(), run_dir.name):
        return None
    outbox = _outbox(run_dir)
    try:
        return run_dir if outbox is not None and outbox.last("metrics") is not None else None
    except Exception:  # noqa: BLE001 - tables not yet created
        return None


@pytest.mark.slow
def test_retry_after_a_cancel_before_any_publication_resumes_from_the_local_checkpoint(
        prefect_api: str, gradlab_home: Path) -> None:
    env = gradlab_env(prefect_api)
    proc = start_gradlab(["train", "gradlab__bandit/ppo", "--no-eval", *NO_PERIODIC, "--json"], env)
    try:
        run_dir = wait_for(lambda: _trained_a_little(gradlab_home), 120, "an open attempt whose learner trains")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    run_id = run_dir.name
    first = last_json_line(out)
    assert first["outcome"] == "cancelled", first["reason"]
    assert first["checkpoints"] == [], "the cancel came before any publication"
    # The cancelled learner wrote its final checkpoint; the cancelled attempt did not publish it.
    late = Outbox(run_dir / "outbox.sqlite", readonly=True).last("checkpoint_ready")
    assert late is not None, err[-3000:]
    late_step, late_sha = int(late.payload["step"]), str(late.payload["sha256"])
    assert 0 < late_step < BUDGET
    assert rules.list_publications(open_stores(), run_id) == []

    retry = run_gradlab(["runs", "retry", run_id, "--json"], env, timeout_s=300)
    assert retry.returncode == 0, retry.stderr[-3000:]
    second = last_json_line(retry.stdout)
    assert (second["attempt_id"], second["outcome"]) == ("attempt-002", "succeeded"), second["reason"]
    # No inherited stop request: the resumed learner ran to its budget.
    assert second["learner"]["stop_reason"] == "budget" and second["final_step"] == BUDGET
    attempt = rules.list_attempts(open_stores(), run_id)[-1]
    assert attempt.mode == "resume" and (attempt.resume_from.step, attempt.resume_from.sha256) == (late_step, late_sha)
    published = {(c["step"], c["sha256"]) for c in second["checkpoints"]}
    assert (late_step, late_sha) in published  # the checkpoint it resumed from is published, as it was written
    assert attempt.resume_from.uri in {c["uri"] for c in second["checkpoints"]}
    assert max(step for step, _ in published) == BUDGET


def _first_checkpoint(home: Path) -> Path | None:
    run_dir = only_run_dir(home)
    return run_dir if run_dir is not None and _last(run_dir, "checkpoint_ready") is not None else None


@pytest.mark.slow
def test_a_learner_killed_after_an_accepted_checkpoint_is_drained_and_promoted_by_the_retry(
        prefect_api: str, gradlab_home: Path) -> None:
    """A learner SIGKILLed once a checkpoint was accepted never writes learner_finished: the retry
    drains (no learner) and promotes the accepted checkpoint (it sealed failed, every retry alike)."""
    env = gradlab_env(prefect_api)
    proc = start_gradlab(["train", "gradlab__bandit/ppo", "--seed", "0", "--json"], env)
    try:
        run_dir = wait_for(lambda: _first_checkpoint(gradlab_home), 120, "the learner's first checkpoint")
        pid = int(_last(run_dir, "learner_started").payload["pid"])
        stop_outside_a_write([pid], run_dir / "outbox.sqlite")  # it waits, paused, for the verdict

        def accepted() -> int | None:
            records = [rec for _, rec in rules.list_evaluations(open_stores(), run_dir.name) if rec]
            return next((r.checkpoint_step for r in records if r.status == "accepted"), None)

        accepted_step = wait_for(accepted, 120, "an accepted evaluation (seed 0 accepts its first checkpoint)")
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    first = last_json_line(out)
    assert first["outcome"] == "failed" and "SIGKILL" in first["reason"], first["reason"]
    assert first["promotion"] is None
    retry = run_gradlab(["runs", "retry", run_dir.name, "--json"], env, timeout_s=300)
    assert retry.returncode == 0, retry.stderr[-3000:]
    second = last_json_line(retry.stdout)
    assert (second["attempt_id"], second["outcome"]) == ("attempt-002", "succeeded"), second["reason"]
    assert second["promotion"]["checkpoint_step"] == accepted_step
    assert "ended without finishing" in second["reason"] and second["learner"]["stop_reason"] == "ended_unfinished"
    assert rules.list_attempts(open_stores(), run_dir.name)[-1].mode == "drain"


@pytest.fixture
def small_runs_filesystem(gradlab_home: Path) -> Iterator[Path]:
    """``$GRADLAB_HOME/runs`` on a 16 MiB tmpfs of its own (the stores stay on the real disk), so the
    test can fill the run directory's filesystem for real: writes there fail with ENOSPC."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    runs = gradlab_home / "runs"
    runs.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(runs)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield runs
    finally:
        subprocess.run(["umount", "-l", str(runs)], check=False)


def _fill(folder: Path) -> int:
    """Write a file in ``folder`` until its filesystem is full; the bytes written."""
    written = 0
    with open(folder / "filler", "ab", buffering=0) as f:
        chunk = b"\0" * 65536
        while True:
            try:
                written += f.write(chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                break
    return written


@pytest.mark.slow
def test_a_full_disk_under_the_run_directory_seals_failed_naming_the_path(
        prefect_api: str, gradlab_home: Path, small_runs_filesystem: Path) -> None:
    env = gradlab_env(prefect_api)
    proc = start_gradlab(["train", "gradlab__bandit/ppo", "--no-eval", "--wandb", "disabled",
                          "--set", "train.timesteps=262144", "--json"], env)
    try:
        run_dir = wait_for(lambda: _trained_a_little(gradlab_home), 120, "an open attempt whose learner trains")
        run_id = run_dir.name
        wait_for(lambda: rules.list_publications(open_stores(), run_id), 120, "a published checkpoint")
        assert _fill(small_runs_filesystem) > 0
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1, err[-3000:]
    receipt = last_json_line(out)
    assert receipt["outcome"] == "failed", receipt["reason"]
    # The first cause, with its errno and the path, not a secondary error or `cancelled`.
    assert f"no space left on device: {run_dir}" in receipt["reason"], receipt["reason"]
    stores = open_stores()
    assert rules.read_terminal(stores, run_id, "attempt-001").reason == receipt["reason"]
    assert read_lease(stores.control, run_id).lease.released  # a retry may start at once
    # Every published checkpoint is listed; the local receipt copy is whole or absent, never partial.
    assert [(c["step"], c["sha256"]) for c in receipt["checkpoints"]] == [
        (p.step, p.sha256) for p in rules.list_publications(stores, run_id)]
    local = run_dir / "attempts" / "attempt-001.json"
    if local.exists():
        assert json.loads(local.read_text())["reason"] == receipt["reason"]
    assert not list(run_dir.rglob("*.partial")), "a temporary file was left behind"
    assert "Traceback" not in err, err[-3000:]


def _eval_workers(parent: int) -> list[int]:
    """Evaluation processes (spawned, warm or busy) of process ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == parent and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_a_hung_evaluation_times_out_is_retried_and_the_run_still_drains(
        prefect_api: str, gradlab_home: Path, experiments_copy: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.runs.timeouts import task_timeouts

    # The bandit's episodes last one step: say so, and every timeout derived from the goal is small.
    goal = experiments_copy / "goals" / "gradlab__bandit" / "_goal.yaml"
    goal.write_text(goal.read_text().replace("        failure: [miss]\n", "        failure: [miss]\n"
                                             "        max_episode_steps: 1\n"))
    env = {**gradlab_env(prefect_api), "GRADLAB_EXPERIMENTS": str(experiments_copy),
           "GRADLAB_TASK_TIMEOUT_SCALE": "0.2"}
    proc = start_gradlab(["train", "gradlab__bandit/ppo", "--set", "train.checkpoint_freq=8192", "--json"], env)
    try:
        # The warm evaluation process is spawned before training starts: freeze it, so the first
        # evaluation it is handed hangs for real.
        [spare] = wait_for(lambda: _eval_workers(proc.pid), 60, "the warm evaluation process")
        os.kill(spare, signal.SIGSTOP)
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(spare, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    receipt = last_json_line(out)
    assert receipt["outcome"] == "succeeded" and receipt["drained"], receipt["reason"]
    first = receipt["evaluations"][0]
    assert first["status"] == "accepted"
    # It timed out after the goal's evaluation timeout and was evaluated again by a retry.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADLAB_TASK_TIMEOUT_SCALE", "0.2")
        spec = RunSpec.from_resolved(Experiments().resolve("gradlab__bandit/ppo"), seed=0)
        limit = task_timeouts(spec).evaluate_s
    name = f"evaluate-{receipt['run_id']}-step{first['checkpoint_step']}"
    with temporary_settings(updates={PREFECT_API_URL: prefect_api}), get_client(sync_client=True) as client:
        [task_run] = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(any_=[name])))
        states = [st.name for st in client.read_task_run_states(task_run.id)]
    assert task_run.run_count >= 2 and task_run.state.is_completed() and "AwaitingRetry" in states, states
    assert f"evaluation of step {first['checkpoint_step']}: local evaluation" in err
    assert f"did not finish within {limit:g} s" in err, err[-3000:]
    assert "is running in a worker thread" not in err  # Prefect's per-task notice is not repeated
    assert not pid_alive(spare)  # the hung worker was killed, not left behind


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["ppo", "ppo-sb3"])  # gradlab.ppo and stable-baselines3: one loop, one rule
def test_the_same_seed_stops_at_the_same_step_however_slow_evaluation_is(prefect_api: str, gradlab_home: Path,
                                                                        recipe: str) -> None:
    """Issue 26 item 1: a run whose evaluation is held up (its warm evaluation process frozen until
    the learner has trained as far as the quick run stopped) still stops at the quick run's step,
    promoting the same checkpoint, byte for byte: the learner waits at checkpoint k+1 for the
    verdict on k instead of training on unsupervised."""
    env = gradlab_env(prefect_api)
    args = ["train", f"gradlab__bandit/{recipe}", "--seed", "5", "--json"]
    quick = run_gradlab(args, env, timeout_s=300)
    assert quick.returncode == 0, quick.stderr[-3000:]
    quick_receipt = last_json_line(quick.stdout)
    stop_step = quick_receipt["final_step"]
    assert stop_step < 16384  # stopped early on acceptance (the recipe's timesteps: 16384)
    proc = start_gradlab(args, env)
    spare = None
    try:
        [spare] = wait_for(lambda: _eval_workers(proc.pid), 120, "the warm evaluation process")
        os.kill(spare, signal.SIGSTOP)  # every evaluation of this run waits until SIGCONT
        run_dir = wait_for(lambda: (d := only_run_dir(gradlab_home)) and d.name > quick_receipt["run_id"]
                           and (d / "outbox.sqlite").exists() and d, 120, "the second run's directory")

        def trained_to_the_stop_step() -> bool:
            try:
                last = Outbox(run_dir / "outbox.sqlite", readonly=True).last("metrics")
            except OutboxError:  # the file exists before the learner has created its tables
                return False
            return last is not None and last.step >= stop_step

        wait_for(trained_to_the_stop_step, 180, f"the learner at step {stop_step}")
        os.kill(spare, signal.SIGCONT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        if spare is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(spare, signal.SIGCONT)
    assert proc.returncode == 0, err[-3000:]
    slow = last_json_line(out)
    assert slow["outcome"] == "succeeded", slow["reason"]
    assert slow["final_step"] == stop_step
    assert slow["promotion"]["checkpoint_step"] == quick_receipt["promotion"]["checkpoint_step"]
    assert slow["promotion"]["sha256"] == quick_receipt["promotion"]["sha256"]
    waits = [e.payload["eval_wait"] for e in Outbox(run_dir / "outbox.sqlite", readonly=True).read(kind="metrics")
             if "eval_wait" in e.payload]
    assert waits and max(w["wait_s"] for w in waits) > 0  # it did wait, and said how long


@pytest.mark.slow
@pytest.mark.parametrize("frozen", ["between_writes", "inside_a_write"])
def test_a_learner_that_ignores_its_stop_request_and_sigterm_is_killed_and_the_receipt_says_so(
        prefect_api: str, gradlab_home: Path, frozen: str) -> None:
    """A learner frozen (SIGSTOP: it reads no stop request and acts on no SIGTERM) at its first
    checkpoint: once that checkpoint is accepted the learner gets GRADLAB_STOP_WAIT_S to stop, then
    SIGTERM, then SIGKILL at the end of the grace period; the run is promoted on what it
    published, and the receipt says how the learner ended.

    ``inside_a_write``: frozen holding the outbox's write lock (held here for it, until the learner
    is gone, as a learner's own lock goes with its process): the supervisor keeps its writes (the
    stop request, its metrics, delivery marks) for later instead of failing the attempt."""
    env = {**gradlab_env(prefect_api), "GRADLAB_STOP_WAIT_S": "3"}
    proc = start_gradlab(["train", "gradlab__bandit/ppo", "--set", "train.timesteps=2000000", "--json"], env)
    learner = None
    lock = None
    try:
        run_dir = wait_for(lambda: only_run_dir(gradlab_home), 120, "the run's folder")
        started = wait_for(lambda: _last(run_dir, "learner_started"), 120, "the learner started")
        learner = int(started.payload["pid"])
        wait_for(lambda: _last(run_dir, "checkpoint_ready"), 120, "the learner's first checkpoint")
        # Frozen between writes: one frozen inside its outbox transaction keeps SQLite's lock.
        stop_outside_a_write([learner], run_dir / "outbox.sqlite")
        if frozen == "inside_a_write":
            lock = sqlite3.connect(str(run_dir / "outbox.sqlite"), isolation_level=None)
            lock.execute("BEGIN IMMEDIATE")
            wait_for(lambda: not pid_alive(learner), 300, "the frozen learner killed")
            lock.execute("ROLLBACK")
        out, err = proc.communicate(timeout=300)
    finally:
        if lock is not None:
            lock.close()
        proc.kill()
        if learner is not None and pid_alive(learner):
            os.kill(learner, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    receipt = last_json_line(out)
    assert receipt["outcome"] == "succeeded", receipt["reason"]
    assert receipt["learner"] == {"exit_code": -9, "stop_reason": "killed_after_stop_request"}
    assert "the learner ignored its stop request (accepted:" in receipt["reason"]
    assert "was stopped by SIGKILL of its process group within the 10 s grace period" in receipt["reason"]
    promotion = rules.read_promotion(open_stores(), receipt["run_id"])
    assert promotion is not None and promotion.checkpoint_step == receipt["promotion"]["checkpoint_step"]
    assert not pid_alive(learner)
    if frozen == "inside_a_write":  # what waited for the lock was written once it went
        box = Outbox(run_dir / "outbox.sqlite", readonly=True)
        assert box.stop_requested() is not None and box.stop_requested().startswith("accepted:")
        assert "the outbox is locked by another process" in err
