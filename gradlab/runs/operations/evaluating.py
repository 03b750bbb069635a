"""Evaluating published checkpoints: warm evaluation processes, one evaluation per checkpoint
keyed by content, the ``failed`` record of a checkpoint that fails verification, and the stop
request an accepted result asks for."""

from __future__ import annotations

import logging
from pathlib import Path

from gradlab.contracts.run_spec import RunSpec
from gradlab.errors import ContractViolation, NotFound
from gradlab.receipts.evaluations import make_evaluation_record, record_evaluation, register_evaluation
from gradlab.receipts.lease import require_epoch
from gradlab.receipts.models import CheckpointPublication, EvaluationIntent, EvaluationRecord, utcnow
from gradlab.receipts.publication import verify_published
from gradlab.receipts.runs import request_stop
from gradlab.stores import Stores

log = logging.getLogger(__name__)


def prewarm_evaluation(backend: str, count: int = 1) -> None:
    """Start ``count`` warm evaluation processes now, while the learner trains (local backend only)."""
    if backend == "local":
        from gradlab.evaluation.backends import prewarm

        prewarm(count)


def evaluate(
    stores: Stores, spec: RunSpec, publication: CheckpointPublication, checkpoint_dir: Path, *, backend: str = "local",
    timeout_s: float | None = None, fence: tuple[str, int] | None = None,
) -> EvaluationRecord:
    """Evaluate a published checkpoint once, keyed by content; record and return the result.

    A result already recorded for the same (run, checkpoint, goal, manifest) is returned as it is:
    a retried task never evaluates twice. A permanent evaluation failure is recorded as
    ``failed``; a transient one (backend unreachable, no result within ``timeout_s``, by default
    the goal's :func:`gradlab.runs.timeouts.task_timeouts` ``evaluate_s``) is raised for the task
    to retry. The local copy is checked against the publication receipt before and after the
    evaluation, and every model-store object of the checkpoint is re-read and checked before the
    result is recorded: a difference records ``failed``, naming the object and both hashes.

    ``fence`` (attempt id, lease epoch) is checked before the intent and again before the result
    is written, and both carry it: a superseded attempt records nothing (docs/ARCHITECTURE.md
    section 9), and the attempt that superseded it evaluates the checkpoint itself.

    Raises:
        LeaseLost: ``fence`` no longer holds the run's lease.
        TransientError: the backend or a store is unavailable, or the evaluation timed out (the
            backend's job is cancelled first).
    """
    from gradlab.checkpoints import verify_against_publication
    if timeout_s is None:
        from gradlab.runs.timeouts import task_timeouts

        timeout_s = task_timeouts(spec).evaluate_s
    from gradlab.errors import IntegrityError
    from gradlab.evaluation import EvalRequest, build_manifest, validate_result
    from gradlab.evaluation.backends import BackendUnavailable, EvaluationFailed, evaluate_with, get_backend

    manifest = build_manifest(spec.goal)
    intent, existing = _register(stores, spec, publication, manifest.sha256, backend, fence)
    if existing is not None:
        return existing
    request = EvalRequest(checkpoint_dir=str(checkpoint_dir), checkpoint_sha256=publication.sha256,
                          checkpoint_step=publication.step, spec=spec.to_json())
    runner = get_backend(backend)
    try:
        # What is evaluated is byte-identical to what was published (docs/ARCHITECTURE.md section 8):
        # the local copy against the publication receipt before, the model store's objects after.
        verify_against_publication(Path(checkpoint_dir), publication.files)
        try:
            result = evaluate_with(runner, request, timeout_s=timeout_s)
        except BackendUnavailable as e:
            log.warning("run %s: evaluation of step %d: %s (a hang: cancelled; the task's retry evaluates again)",
                        spec.run_id, publication.step, e)
            raise
        expected = {"checkpoint_sha256": publication.sha256, "episode_manifest_sha256": manifest.sha256, **spec.hashes}
        validated = validate_result(result, expected=expected, goal=spec.goal)
        verify_against_publication(Path(checkpoint_dir), publication.files)
        verify_published(stores, publication)
    except (IntegrityError, ContractViolation, EvaluationFailed, NotFound) as e:
        # The checkpoint itself cannot be evaluated: a permanent result. A backend that cannot run
        # (no credentials, unreachable) is not recorded: the error goes up and a retry evaluates.
        log.error("run %s: evaluation of step %d failed: %s", spec.run_id, publication.step, e)
        record = make_evaluation_record(intent, status="failed", error=f"{type(e).__name__}: {e}", fence=fence)
        return _record(stores, record, fence)
    finally:
        runner.close()
    status = "accepted" if validated.verdict == "accepted" else "rejected"
    record = make_evaluation_record(
        intent, status=status, result=validated.as_json(),
        return_mean=validated.aggregates.get("eval/episode/return/mean"), fence=fence,
    )
    return _record(stores, record, fence)


def _register(stores: Stores, spec: RunSpec, publication: CheckpointPublication, manifest_sha256: str, backend: str,
              fence: tuple[str, int] | None) -> tuple[EvaluationIntent, EvaluationRecord | None]:
    """The evaluation's intent, registered for ``fence`` (checked first), and any result already recorded."""
    if fence is not None:
        require_epoch(stores, spec.run_id, *fence)
    intent = EvaluationIntent.create(
        run_id=spec.run_id, checkpoint=publication.ref, goal_contract_sha256=spec.goal_contract_sha256,
        episode_manifest_sha256=manifest_sha256, backend=backend,
        attempt_id=fence[0] if fence else None, epoch=fence[1] if fence else None,
    )
    return register_evaluation(stores, intent)


def _record(stores: Stores, record: EvaluationRecord, fence: tuple[str, int] | None) -> EvaluationRecord:
    """Record ``record`` once ``fence`` is checked to still hold the lease (a stale result is refused)."""
    if fence is not None:
        require_epoch(stores, record.run_id, *fence)
    return record_evaluation(stores, record)


def record_unusable(stores: Stores, spec: RunSpec, publication: CheckpointPublication, why: str, *,
                    fence: tuple[str, int] | None = None) -> EvaluationRecord:
    """Record the evaluation of a published checkpoint that fails verification as ``failed`` without
    running it (create-or-agree: a result already recorded for it is returned as it is).

    ``why`` names the failing object and both hashes (from :func:`gradlab.runs.operations.opening.choose_resume_checkpoint`).
    """
    from gradlab.evaluation import build_manifest

    intent, existing = _register(stores, spec, publication, build_manifest(spec.goal).sha256, "none", fence)
    if existing is not None:
        return existing
    log.warning("run %s: checkpoint at step %d fails verification: recorded as a failed evaluation, not evaluated "
                "nor promoted (%s)", spec.run_id, publication.step, why)
    error = f"IntegrityError: not evaluated: the checkpoint fails verification against its publication receipt: {why}"
    return _record(stores, make_evaluation_record(intent, status="failed", error=error, fence=fence), fence)


def record_stop(stores: Stores, run_id: str, attempt_id: str, reason: str, *, epoch: int | None = None) -> None:
    """Record the run's stop request (the first request wins), refused for a superseded ``epoch``.

    Raises:
        LeaseLost: ``epoch`` is no longer the lease's.
    """
    from gradlab.receipts.models import StopRequest

    if epoch is not None:
        require_epoch(stores, run_id, attempt_id, epoch)
    step = int(reason.split(":", 1)[1]) if reason.startswith("accepted:") else None
    request_stop(stores, StopRequest(run_id=run_id, attempt_id=attempt_id, epoch=epoch, reason=reason,
                                     checkpoint_step=step, requested_at=utcnow()))
