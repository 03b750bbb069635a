"""Closing an attempt its own process could not seal (issue 16 item 2): from what it did itself."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from gradlab.receipts import (
    LearnerExit,
    TerminalMetrics,
    begin_attempt,
    close_attempt,
    make_evaluation_record,
    open_run,
    publish_checkpoint,
    read_terminal,
    reconcile_run,
    record_evaluation,
    register_evaluation,
    seal_terminal,
)
from gradlab.receipts.models import EvaluationIntent, TerminalReceipt
from gradlab.stores import Stores
from tests.receipts.test_receipts import RUN, T0, _checkpoint_dir, _spec


def _evaluate(stores: Stores, publication, status: str, at) -> None:
    intent = EvaluationIntent.create(run_id=RUN, checkpoint=publication.ref, goal_contract_sha256="g" * 64,
                                     episode_manifest_sha256="m" * 64, backend="local", now=at)
    intent, _ = register_evaluation(stores, intent)
    record_evaluation(stores, make_evaluation_record(intent, status=status, return_mean=1.0, now=at))


def test_reconciling_a_crashed_attempt_after_its_retry_lists_only_its_own_work(stores: Stores, tmp_path: Path) -> None:
    open_run(stores, _spec(), now=T0)
    begin_attempt(stores, RUN, mode="fresh", ttl_s=30, now=T0)  # attempt-001 crashes: never sealed
    first = publish_checkpoint(stores, run_id=RUN, attempt_id="attempt-001",
                               checkpoint_dir=_checkpoint_dir(tmp_path / "a", 100, b"p100"), now=T0)
    retry_at = T0 + timedelta(seconds=60)
    begin_attempt(stores, RUN, mode="resume", resume_from=first.ref, now=retry_at)  # its lease expired
    _evaluate(stores, first, "rejected", retry_at + timedelta(seconds=1))  # evaluated by the retry
    second = publish_checkpoint(stores, run_id=RUN, attempt_id="attempt-002",
                                checkpoint_dir=_checkpoint_dir(tmp_path / "b", 200, b"p200"), now=retry_at)
    _evaluate(stores, second, "accepted", retry_at + timedelta(seconds=2))
    seal_terminal(stores, TerminalReceipt(
        run_id=RUN, attempt_id="attempt-002", goal_id="gradlab__bandit", recipe_id="ppo", seed=0,
        outcome="succeeded", reason="ok", final_step=200, checkpoints=[], evaluations=[], promotion=None,
        metrics=TerminalMetrics(local_high_water=0, sinks={}), drained=True,
        learner=LearnerExit(exit_code=0, stop_reason="budget"), sealed_at=retry_at))

    [closed] = reconcile_run(stores, RUN, now=retry_at + timedelta(seconds=90))
    assert closed.attempt_id == "attempt-001" and closed.outcome == "failed"
    assert [(c.step, c.sha256) for c in closed.checkpoints] == [(100, first.sha256)]  # not the retry's 200
    assert closed.final_step == 100
    # Its checkpoint was evaluated only after the retry began: that result is the retry's.
    assert [(e.checkpoint_step, e.status) for e in closed.evaluations] == [(100, "deferred")]
    assert closed.promotion is None


def test_close_attempt_is_sealed_once(stores: Stores, tmp_path: Path) -> None:
    open_run(stores, _spec(), now=T0)
    begin_attempt(stores, RUN, mode="fresh", now=T0)
    publish_checkpoint(stores, run_id=RUN, attempt_id="attempt-001",
                       checkpoint_dir=_checkpoint_dir(tmp_path, 100, b"p100"), now=T0)
    receipt = close_attempt(stores, RUN, "attempt-001", outcome="failed", reason="crashed: the flow process died",
                            now=T0)
    assert receipt is not None and [c.step for c in receipt.checkpoints] == [100]
    assert close_attempt(stores, RUN, "attempt-001", outcome="failed", reason="again", now=T0) is None
    assert read_terminal(stores, RUN, "attempt-001").reason == "crashed: the flow process died"


def test_opening_a_new_attempt_seals_the_unsealed_one_superseded(stores: Stores, tmp_path: Path) -> None:
    from gradlab.runs import operations
    from gradlab.runs.paths import RunPaths

    spec = _spec()
    paths = RunPaths(tmp_path / "run").ensure()
    open_run(stores, spec, now=T0)
    begin_attempt(stores, RUN, mode="fresh", ttl_s=1, now=T0)  # long expired: its process died unsealed
    plan = operations.open_attempt(stores, spec, paths)
    assert plan.attempt.attempt_id == "attempt-002" and plan.reconciled == ("attempt-001",)
    closed = read_terminal(stores, RUN, "attempt-001")
    assert closed.outcome == "superseded"
    assert closed.reason == (f"superseded by attempt-002 (epoch 2): its lease (epoch 1) expired at "
                             f"{(T0 + timedelta(seconds=1)).isoformat()}; it had published nothing")
    assert closed.superseded_by.model_dump() == {"attempt_id": "attempt-002", "epoch": 2,
                                                 "lease_expired_at": T0 + timedelta(seconds=1)}
    assert closed.epoch == 2 and plan.attempt.epoch == 2


def _local_checkpoint(run_dir: Path, step: int, policy: bytes) -> tuple[Path, str]:
    from gradlab.checkpoints import write_checkpoint

    def files(folder: Path) -> None:
        (folder / "policy.zip").write_bytes(policy)
        (folder / "resume").mkdir()
        (folder / "resume" / "state.json").write_text(f'{{"num_timesteps": {step}}}')

    folder, manifest = write_checkpoint(
        run_dir / "checkpoints", step=step, write_files=files,
        manifest_fields={"run_id": RUN, "purpose": "final", "goal_contract_sha256": "g" * 64,
                         "recipe_sha256": "r" * 64, "environment_sha256": "e" * 64, "backend_id": "sb3.ppo",
                         "backend_config_sha256": "b" * 64, "versions": {}})
    return folder, manifest.sha256


def test_a_retry_resumes_from_the_newest_verified_local_checkpoint_and_drops_the_stale_stop(
        stores: Stores, tmp_path: Path) -> None:
    from gradlab.outbox import Outbox
    from gradlab.runs import operations
    from gradlab.runs.paths import RunPaths

    spec = _spec()
    paths = RunPaths(tmp_path / "run").ensure()
    open_run(stores, spec, now=T0)
    begin_attempt(stores, RUN, mode="fresh", ttl_s=1, now=T0)
    # attempt-001 was cancelled before publishing anything; its learner wrote two final checkpoints
    # (the newer one corrupted afterwards) and the stop request is still in the outbox.
    good, good_sha = _local_checkpoint(paths.root, 256, b"policy-256")
    bad, bad_sha = _local_checkpoint(paths.root, 512, b"policy-512")
    (bad / "policy.zip").write_bytes(b"flipped")
    outbox = Outbox(paths.outbox)
    for step, folder, sha in ((256, good, good_sha), (512, bad, bad_sha)):
        outbox.append("checkpoint_ready", step, {"step": step, "sha256": sha, "path": str(folder), "purpose": "final"})
    outbox.request_stop("cancelled")
    seal_terminal(stores, TerminalReceipt(
        run_id=RUN, attempt_id="attempt-001", goal_id="gradlab__bandit", recipe_id="ppo", seed=0,
        outcome="cancelled", reason="cancelled", final_step=512, checkpoints=[], evaluations=[], promotion=None,
        metrics=TerminalMetrics(local_high_water=0, sinks={}), drained=False,
        learner=LearnerExit(exit_code=0, stop_reason="stop_requested"), sealed_at=T0))

    plan = operations.open_attempt(stores, spec, paths)
    assert plan.attempt.mode == "resume" and plan.resume_dir == good
    assert (plan.attempt.resume_from.step, plan.attempt.resume_from.sha256) == (256, good_sha)
    assert [(c.step, c.sha256) for c in plan.unpublished] == [(256, good_sha)]  # to be published by the retry
    assert outbox.stop_requested() is None  # the new learner does not stop at once
    assert plan.first_seq == outbox.max_seq() + 1  # the old lineage's events are not published from the outbox
