"""The run lifecycle under faults, end to end against a real Prefect server (issue 16): a retry
after an early cancel, failures sealed with their first cause, hooks and reconciliation."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradlab.outbox import Outbox
from gradlab.receipts import rules
from gradlab.receipts.lease import read_lease
from gradlab.stores import open_stores
from tests.runs.conftest import (
    gradlab_env,
    last_json_line,
    only_run_dir,
    run_gradlab,
    start_gradlab,
    wait_for,
)

#: No periodic checkpoint: the only one a cancelled learner leaves is its final one, never published.
NO_PERIODIC = ["--set", "train.timesteps=16384", "--set", "train.checkpoint_freq=1000000"]


def _outbox(run_dir: Path) -> Outbox | None:
    path = run_dir / "outbox.sqlite"
    try:
        return Outbox(path, readonly=True) if path.exists() else None
    except Exception:  # noqa: BLE001 - created, its tables not yet
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
    assert 0 < late_step < 16384
    assert rules.list_publications(open_stores(), run_id) == []

    retry = run_gradlab(["runs", "retry", run_id, "--json"], env, timeout_s=300)
    assert retry.returncode == 0, retry.stderr[-3000:]
    second = last_json_line(retry.stdout)
    assert (second["attempt_id"], second["outcome"]) == ("attempt-002", "succeeded"), second["reason"]
    # No inherited stop request: the resumed learner ran to its budget.
    assert second["learner"]["stop_reason"] == "budget" and second["final_step"] == 16384
    attempt = rules.list_attempts(open_stores(), run_id)[-1]
    assert attempt.mode == "resume" and (attempt.resume_from.step, attempt.resume_from.sha256) == (late_step, late_sha)
    published = {(c["step"], c["sha256"]) for c in second["checkpoints"]}
    assert (late_step, late_sha) in published  # the checkpoint it resumed from is published, as it was written
    assert attempt.resume_from.uri in {c["uri"] for c in second["checkpoints"]}
    assert max(step for step, _ in published) == 16384


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
