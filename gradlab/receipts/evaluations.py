"""Evaluation receipts: the create-only intent written before the work and the one result per intent.

An intent is keyed by content (run, checkpoint sha256, goal hash, manifest hash), so a retried task
finds the intent, and any result, it wrote before and never evaluates twice.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gradlab.contracts.hashing import sha256_json
from gradlab.errors import NotFound
from gradlab.receipts.io import create_or_agree, read_model, read_optional
from gradlab.receipts.models import EvaluationIntent, EvaluationRecord, utcnow
from gradlab.stores import Stores, keys


def register_evaluation(stores: Stores, intent: EvaluationIntent) -> tuple[EvaluationIntent, EvaluationRecord | None]:
    """Record an evaluation intent (create-or-agree) and return any result already recorded for it.

    A caller evaluates only when the returned record is None, so a retried task never evaluates a
    checkpoint twice once its result is stored.
    """
    stored = create_or_agree(
        stores.eval,
        keys.evaluation_intent(intent.run_id, intent.key),
        intent,
        agree=lambda old, new: old.key == new.key,
        what="evaluation intent",
    )
    return stored, read_optional(stores.eval, keys.evaluation_result(intent.run_id, intent.key), EvaluationRecord)


def record_evaluation(stores: Stores, record: EvaluationRecord) -> EvaluationRecord:
    """Write an evaluation's result (create-only; exactly one result per intent).

    Raises:
        NotFound: no intent with ``record.intent_key`` exists.
        Conflict: a different result (status or result hash) is already recorded for the intent.
    """
    if not stores.eval.exists(keys.evaluation_intent(record.run_id, record.intent_key)):
        raise NotFound(
            f"{stores.eval.url(keys.evaluation_intent(record.run_id, record.intent_key))}: "
            "no evaluation intent for this result"
        )
    return create_or_agree(
        stores.eval,
        keys.evaluation_result(record.run_id, record.intent_key),
        record,
        agree=lambda old, new: (old.status, old.result_sha256) == (new.status, new.result_sha256),
        what="evaluation result",
    )


def make_evaluation_record(
    intent: EvaluationIntent,
    *,
    status: str,
    result: dict[str, Any] | None = None,
    return_mean: float | None = None,
    error: str | None = None,
    now: datetime | None = None,
    fence: tuple[str, int] | None = None,
) -> EvaluationRecord:
    """An :class:`EvaluationRecord` for ``intent`` with ``result_sha256`` computed from ``result``,
    stamped with ``fence`` (the recording attempt and its lease epoch) when given."""
    return EvaluationRecord(
        intent_key=intent.key,
        run_id=intent.run_id,
        checkpoint_step=intent.checkpoint_step,
        checkpoint_sha256=intent.checkpoint_sha256,
        status=status,
        return_mean=return_mean,
        result=result,
        result_sha256=sha256_json(result) if result is not None else None,
        error=error,
        attempt_id=fence[0] if fence else None,
        epoch=fence[1] if fence else None,
        recorded_at=now or utcnow(),
    )


def list_evaluations(stores: Stores, run_id: str) -> list[tuple[EvaluationIntent, EvaluationRecord | None]]:
    """Every evaluation intent of the run with its result (None while pending), by checkpoint step."""
    out = []
    for k in stores.eval.list(keys.evaluations_prefix(run_id)):
        if k.endswith("/intent.json"):
            intent = read_model(stores.eval, k, EvaluationIntent)
            record = read_optional(stores.eval, keys.evaluation_result(run_id, intent.key), EvaluationRecord)
            out.append((intent, record))
    return sorted(out, key=lambda pair: (pair[0].checkpoint_step, pair[0].key))
