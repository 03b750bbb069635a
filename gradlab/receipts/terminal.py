"""Terminal receipts: sealing an attempt, the inventories a receipt lists, and reconciliation
(closing attempts whose process ended without sealing, from what each did itself).

Sealing is create-only per attempt; a retry with the same content agrees. Reconciliation is the
guarantee behind best-effort hooks: ``gradlab runs reconcile`` and every new attempt's opening run it
(docs/ARCHITECTURE.md section 8).
"""

from __future__ import annotations

import logging
from datetime import datetime

from gradlab.errors import Conflict
from gradlab.receipts.evaluations import list_evaluations
from gradlab.receipts.io import create_or_agree, read_optional
from gradlab.receipts.lease import read_lease
from gradlab.receipts.models import (
    LearnerExit,
    TerminalCheckpoint,
    TerminalEvaluation,
    TerminalMetrics,
    TerminalPromotion,
    TerminalReceipt,
    utcnow,
)
from gradlab.receipts.promotion import read_promotion
from gradlab.receipts.publication import list_publications
from gradlab.receipts.runs import list_attempts, read_run
from gradlab.stores import Stores, keys

logger = logging.getLogger(__name__)


def seal_terminal(stores: Stores, receipt: TerminalReceipt) -> TerminalReceipt:
    """Write the attempt's terminal receipt (create-only; a retry with the same content agrees).

    Raises:
        Conflict: the attempt was already sealed with different content.
    """

    def same(old: TerminalReceipt, new: TerminalReceipt) -> bool:
        return old.model_dump(exclude={"sealed_at"}) == new.model_dump(exclude={"sealed_at"})

    return create_or_agree(
        stores.control, keys.terminal(receipt.run_id, receipt.attempt_id), receipt, agree=same, what="terminal receipt"
    )


def read_terminal(stores: Stores, run_id: str, attempt_id: str) -> TerminalReceipt | None:
    """The attempt's terminal receipt, or None while the attempt is not sealed."""
    return read_optional(stores.control, keys.terminal(run_id, attempt_id), TerminalReceipt)


def _terminal_evaluation(stores: Stores, run_id: str, intent, record) -> TerminalEvaluation:
    """One evaluation as a terminal receipt lists it: its record's status, or ``deferred`` without one."""
    return TerminalEvaluation(
        checkpoint_step=intent.checkpoint_step,
        status=record.status if record else "deferred",
        result_uri=stores.eval.url(keys.evaluation_result(run_id, intent.key)) if record else None,
        return_mean=record.return_mean if record else None,
    )


def run_inventory(
    stores: Stores, run_id: str
) -> tuple[list[TerminalCheckpoint], list[TerminalEvaluation], TerminalPromotion | None]:
    """The checkpoint, evaluation and promotion inventories of a run, as the terminal receipt lists them.

    Checkpoints come from the publication receipts (by step), evaluations from the eval store
    (intent without result → status ``deferred``), the promotion from ``promotion.json``.
    """
    checkpoints = [TerminalCheckpoint(step=p.step, sha256=p.sha256, uri=p.uri) for p in list_publications(stores, run_id)]
    evaluations = []
    for intent, record in list_evaluations(stores, run_id):
        evaluations.append(_terminal_evaluation(stores, run_id, intent, record))
    promotion = read_promotion(stores, run_id)
    terminal_promotion = (
        TerminalPromotion(checkpoint_step=promotion.checkpoint_step, sha256=promotion.checkpoint_sha256, uri=promotion.uri)
        if promotion
        else None
    )
    return checkpoints, evaluations, terminal_promotion


def attempt_inventory(
    stores: Stores, run_id: str, attempt_id: str
) -> tuple[list[TerminalCheckpoint], list[TerminalEvaluation], TerminalPromotion | None]:
    """What one attempt itself did, for a receipt sealed on its behalf (a crash, a reconcile).

    Checkpoints: those this attempt published. Evaluations: results of those checkpoints recorded
    before the next attempt began (a later attempt's results are its own). Promotion: only when this
    attempt promoted. So closing an attempt after a retry has run never claims the retry's work.
    """
    attempts = list_attempts(stores, run_id)
    later = [a for a in attempts if a.number > next((b.number for b in attempts if b.attempt_id == attempt_id), 0)]
    until = min((a.started_at for a in later), default=None)
    own = [p for p in list_publications(stores, run_id) if p.attempt_id == attempt_id]
    checkpoints = [TerminalCheckpoint(step=p.step, sha256=p.sha256, uri=p.uri) for p in own]
    shas = {p.sha256 for p in own}
    evaluations = []
    for intent, record in list_evaluations(stores, run_id):
        if intent.checkpoint_sha256 not in shas:
            continue
        if record is not None and until is not None and record.recorded_at >= until:
            record = None  # recorded by a later attempt
        evaluations.append(_terminal_evaluation(stores, run_id, intent, record))
    asked = {e.checkpoint_step for e in evaluations}
    evaluations += [TerminalEvaluation(checkpoint_step=c.step, status="deferred", result_uri=None, return_mean=None)
                    for c in checkpoints if c.step not in asked]
    promotion = read_promotion(stores, run_id)
    own_promotion = (
        TerminalPromotion(checkpoint_step=promotion.checkpoint_step, sha256=promotion.checkpoint_sha256, uri=promotion.uri)
        if promotion is not None and promotion.attempt_id == attempt_id
        else None
    )
    return checkpoints, sorted(evaluations, key=lambda e: e.checkpoint_step), own_promotion


def close_attempt(
    stores: Stores,
    run_id: str,
    attempt_id: str,
    *,
    outcome: str,
    reason: str,
    final_step: int | None = None,
    learner: LearnerExit | None = None,
    now: datetime | None = None,
) -> TerminalReceipt | None:
    """Seal an attempt whose own process could not (a crash, a hook, a reconcile) from
    :func:`attempt_inventory`; None when it was sealed already (by itself or a concurrent closer).

    ``final_step`` defaults to the highest step the attempt published.
    """
    if read_terminal(stores, run_id, attempt_id) is not None:
        return None
    run = read_run(stores, run_id)
    checkpoints, evaluations, promotion = attempt_inventory(stores, run_id, attempt_id)
    receipt = TerminalReceipt(
        run_id=run_id,
        attempt_id=attempt_id,
        goal_id=run.goal_id,
        recipe_id=run.recipe_id,
        seed=run.seed,
        outcome=outcome,
        reason=reason,
        final_step=final_step if final_step is not None else max((c.step for c in checkpoints), default=None),
        checkpoints=checkpoints,
        evaluations=evaluations,
        promotion=promotion,
        metrics=TerminalMetrics(local_high_water=0, sinks={}),
        drained=False,
        learner=learner or LearnerExit(exit_code=None, stop_reason=None),
        sealed_at=now or utcnow(),
    )
    try:
        return seal_terminal(stores, receipt)
    except Conflict:
        logger.info("run %s: attempt %s was sealed concurrently", run_id, attempt_id)
        return None


def reconcile_run(stores: Stores, run_id: str, *, now: datetime | None = None) -> list[TerminalReceipt]:
    """Close attempts whose process ended without sealing a terminal receipt (crash, SIGKILL).

    An attempt without ``terminal.json`` is closed as ``failed`` unless it still holds a live lease,
    listing only what it did itself (:func:`attempt_inventory`). Hooks are best effort (Prefect
    does not run them on SIGKILL of a flow it did not start); this is the guarantee, run by
    ``gradlab runs reconcile`` and whenever a new attempt opens.

    Returns:
        The receipts sealed now (empty when nothing needed closing).
    """
    at = now or utcnow()
    held = read_lease(stores.control, run_id)
    sealed = []
    for attempt in list_attempts(stores, run_id):
        if read_terminal(stores, run_id, attempt.attempt_id) is not None:
            continue
        if held is not None and held.lease.holder == attempt.attempt_id and held.lease.in_force(at):
            continue
        lease_note = (
            f"lease expired at {held.lease.expires_at.isoformat()}"
            if held is not None and held.lease.holder == attempt.attempt_id
            else "lease not held"
        )
        receipt = close_attempt(stores, run_id, attempt.attempt_id, outcome="failed",
                                reason=f"reconciled: attempt ended without sealing its receipt ({lease_note})", now=at)
        if receipt is not None:
            sealed.append(receipt)
            logger.warning("run %s: closed attempt %s as failed (%s)", run_id, attempt.attempt_id, lease_note)
    return sealed
