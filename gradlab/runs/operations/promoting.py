"""Promoting a run's checkpoint: the one create-only promotion of an accepted evaluation, after its
published objects are re-read and verified."""

from __future__ import annotations

from gradlab.errors import ContractViolation
from gradlab.receipts.lease import require_epoch
from gradlab.receipts.models import CheckpointPublication, EvaluationRecord, Promotion, utcnow
from gradlab.receipts.promotion import write_promotion
from gradlab.receipts.publication import verify_published
from gradlab.stores import Stores


def promote(stores: Stores, run_id: str, attempt_id: str, record: EvaluationRecord,
            publication: CheckpointPublication, *, epoch: int | None = None) -> Promotion:
    """Promote the checkpoint of an accepted evaluation (create-only; exactly one per run).

    Raises:
        ContractViolation: the evaluation is not accepted or is of another checkpoint.
        IntegrityError: a model-store object of the checkpoint differs from its publication
            receipt (named, with both hashes); nothing is promoted.
        LeaseLost: ``epoch`` is no longer the lease's (a newer attempt holds the run).
        Conflict: the run already promoted a different checkpoint.
    """
    from gradlab.stores import keys

    if record.status != "accepted" or record.checkpoint_sha256 != publication.sha256:
        raise ContractViolation(f"run {run_id}: only an accepted evaluation of the same checkpoint can be promoted")
    if epoch is not None:
        require_epoch(stores, run_id, attempt_id, epoch)
    verify_published(stores, publication)  # the promoted objects are the published bytes
    promotion = Promotion(
        run_id=run_id, attempt_id=attempt_id, checkpoint_step=publication.step, checkpoint_sha256=publication.sha256,
        uri=publication.uri, evaluation_key=record.intent_key,
        result_uri=stores.eval.url(keys.evaluation_result(run_id, record.intent_key)),
        return_mean=record.return_mean, epoch=epoch, promoted_at=utcnow(),
    )
    if epoch is not None:
        require_epoch(stores, run_id, attempt_id, epoch)  # again: verifying took time
    return write_promotion(stores, promotion)
