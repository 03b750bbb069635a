"""The run lifecycle under faults, end to end against a real Prefect server (issue 16): a retry
after an early cancel, failures sealed with their first cause, hooks and reconciliation."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from gradlab.outbox import Outbox
from gradlab.receipts import rules
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
