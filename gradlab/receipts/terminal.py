"""Terminal receipts: sealing an attempt, the inventories a receipt lists, and reconciliation
(closing attempts whose process ended without sealing, from what each did itself).

Sealing is create-only per attempt; a retry with the same content agrees. Who may seal what
(docs/ARCHITECTURE.md section 9): an attempt seals itself while it holds the lease at its epoch; a
new attempt, having taken the lease, seals every earlier unsealed attempt ``superseded``
(:func:`supersede_attempts`); a hook seals only its own attempt at its own epoch; the reconciler
(``gradlab runs reconcile``) first fences an expired lease out (releases it by compare-and-swap),
then seals its attempt ``failed``.
"""

from __future__ import annotations

import logging
from datetime import datetime

from gradlab.errors import Conflict
from gradlab.receipts.evaluations import list_evaluations
from gradlab.receipts.io import create_or_agree, dump_model, read_optional
from gradlab.receipts.lease import HeldLease, owner_elsewhere_alive, read_lease, require_epoch
from gradlab.receipts.models import (
    LearnerExit,
    Supersession,
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
    epoch: int | None = None,
    superseded_by: Supersession | None = None,
    fence: tuple[str, int] | None = None,
    metrics: TerminalMetrics | None = None,
) -> TerminalReceipt | None:
    """Seal an attempt whose own process could not (a crash, a hook, a reconcile, a supersession)
    from :func:`attempt_inventory`; None when it was sealed already (by itself or a concurrent closer).

    ``final_step`` defaults to the highest step the attempt published.

    Args:
        metrics: what the sinks hold when the closer can read the run's outbox (a hook on the
            attempt's machine); by default none is claimed (``local_high_water`` 0, no sinks).
        fence: (attempt id, epoch) that must hold the run's lease for this write (a hook: its own
            attempt; a superseding attempt: itself); None for a reconciler that fenced the lease
            out first. ``epoch`` is recorded in the receipt (the writer's epoch).

    Raises:
        LeaseLost: ``fence`` no longer holds the lease; nothing is written.
    """
    if read_terminal(stores, run_id, attempt_id) is not None:
        return None
    if fence is not None:
        require_epoch(stores, run_id, *fence)
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
        metrics=metrics or TerminalMetrics(local_high_water=0, sinks={}),
        drained=False,
        learner=learner or LearnerExit(exit_code=None, stop_reason=None),
        epoch=epoch,
        superseded_by=superseded_by,
        sealed_at=now or utcnow(),
    )
    try:
        return seal_terminal(stores, receipt)
    except Conflict:
        logger.info("run %s: attempt %s was sealed concurrently", run_id, attempt_id)
        return None


def supersede_attempts(stores: Stores, run_id: str, held: HeldLease, *, now: datetime | None = None
                       ) -> list[TerminalReceipt]:
    """Seal every earlier unsealed attempt ``superseded``, on behalf of the attempt that just took
    the run's lease (``held``): the second half of opening an attempt, one decision with the lease
    acquisition (docs/ARCHITECTURE.md section 9).

    Each receipt names the new attempt and its epoch and when the old lease expired
    (:class:`Supersession`), and lists what the old attempt itself published
    (:func:`attempt_inventory`). Each write is fenced by the new attempt's own epoch.

    Raises:
        LeaseLost: the new attempt lost the lease meanwhile (nothing more is sealed).
    """
    at = now or utcnow()
    new_attempt, epoch = held.lease.holder, held.lease.generation
    replaced = held.replaced
    sealed = []
    for attempt in list_attempts(stores, run_id):
        if attempt.attempt_id == new_attempt or read_terminal(stores, run_id, attempt.attempt_id) is not None:
            continue
        was_holder = replaced is not None and replaced.holder == attempt.attempt_id
        expired = replaced.expires_at if was_holder and not replaced.released else None
        published = [p.step for p in list_publications(stores, run_id) if p.attempt_id == attempt.attempt_id]
        reason = (f"superseded by {new_attempt} (epoch {epoch}): "
                  + (f"its lease (epoch {replaced.generation}) expired at {expired.isoformat()}" if expired is not None
                     and expired <= at else f"its lease (epoch {replaced.generation}) was released or its owner had died"
                     if was_holder else "it no longer held the lease")
                  + f"; it had published {('steps ' + ', '.join(map(str, published))) if published else 'nothing'}")
        receipt = close_attempt(stores, run_id, attempt.attempt_id, outcome="superseded", reason=reason, now=at,
                                epoch=epoch, fence=(new_attempt, epoch),
                                superseded_by=Supersession(attempt_id=new_attempt, epoch=epoch,
                                                           lease_expired_at=expired))
        if receipt is not None:
            sealed.append(receipt)
            logger.warning("run %s: attempt %s sealed superseded by %s", run_id, attempt.attempt_id, new_attempt)
    return sealed


def reconcile_run(stores: Stores, run_id: str, *, now: datetime | None = None) -> list[TerminalReceipt]:
    """Close attempts whose process ended without sealing a terminal receipt (crash, SIGKILL).

    An attempt without ``terminal.json`` is closed as ``failed`` unless its lease is still in force
    (live, owner not provably dead) or its owner is seen running in this PID namespace (paused past
    its lease), listing only what it did itself (:func:`attempt_inventory`). An expired lease is
    fenced out first (released by compare-and-swap), so a holder that wakes up later finds it lost
    and writes nothing. Hooks are best effort (Prefect does not run them on SIGKILL of a flow it
    did not start); this is the guarantee behind them, run by ``gradlab runs reconcile`` (a new
    attempt seals its predecessors ``superseded`` instead: :func:`supersede_attempts`).

    Returns:
        The receipts sealed now (empty when nothing needed closing).
    """
    at = now or utcnow()
    held = read_lease(stores.control, run_id)
    sealed = []
    for attempt in list_attempts(stores, run_id):
        if read_terminal(stores, run_id, attempt.attempt_id) is not None:
            continue
        holds = held is not None and held.lease.holder == attempt.attempt_id and not held.lease.released
        if holds and (held.lease.in_force(at) or owner_elsewhere_alive(held.lease)):
            continue
        lease_note = "lease not held"
        if holds:
            lease_note = (f"lease expired at {held.lease.expires_at.isoformat()}" if not held.lease.is_live(at)
                          else f"its owner {held.lease.owner} is gone")
            if not _fence_out(stores, held, at):
                logger.info("run %s: %s renewed or lost its lease meanwhile: not reconciled", run_id,
                            attempt.attempt_id)
                continue
        receipt = close_attempt(stores, run_id, attempt.attempt_id, outcome="failed",
                                reason=f"reconciled: attempt ended without sealing its receipt ({lease_note})", now=at)
        if receipt is not None:
            sealed.append(receipt)
            logger.warning("run %s: closed attempt %s as failed (%s)", run_id, attempt.attempt_id, lease_note)
    return sealed


def _fence_out(stores: Stores, held: HeldLease, at: datetime) -> bool:
    """Release ``held`` exactly as read (one compare-and-swap on its etag), so its holder's next
    renewal or fenced write is refused; False when it changed meanwhile (renewed, taken over)."""
    new = held.lease.model_copy(update={"released": True, "expires_at": min(held.lease.expires_at, at)})
    try:
        stores.control.put_if_match(keys.lease(held.lease.run_id), dump_model(new), held.etag)
    except Conflict:
        return False
    return True
