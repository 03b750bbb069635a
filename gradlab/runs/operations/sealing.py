"""Sealing an attempt: its terminal receipt from the store's inventories (and the run directory's
copy), and the closing of an attempt whose flow ended without sealing (Prefect's state hooks)."""

from __future__ import annotations

import logging
from typing import Any

from gradlab.contracts.run_spec import RunSpec
from gradlab.outbox import Outbox
from gradlab.receipts.models import LearnerExit, TerminalMetrics, TerminalReceipt, utcnow
from gradlab.receipts.terminal import close_attempt, read_terminal, run_inventory, seal_terminal
from gradlab.runs.paths import RunPaths
from gradlab.stores import Stores

log = logging.getLogger(__name__)


def inventory(stores: Stores, run_id: str) -> tuple[list, list, Any]:
    """The run's checkpoint, evaluation and promotion inventories as the terminal receipt lists them.

    A published checkpoint that was never submitted for evaluation (evaluation off, above an
    accepted step, or abandoned by a cancel) is listed as ``deferred``, so every checkpoint has
    an evaluation entry.
    """
    from gradlab.receipts.models import TerminalEvaluation

    checkpoints, evaluations, promotion = run_inventory(stores, run_id)
    asked = {e.checkpoint_step for e in evaluations}
    evaluations = sorted(
        [*evaluations, *(TerminalEvaluation(checkpoint_step=c.step, status="deferred", result_uri=None, return_mean=None)
                         for c in checkpoints if c.step not in asked)],
        key=lambda e: e.checkpoint_step,
    )
    return checkpoints, evaluations, promotion


def seal(
    stores: Stores,
    spec: RunSpec,
    attempt_id: str,
    *,
    outcome: str,
    reason: str,
    final_step: int | None,
    metrics: TerminalMetrics,
    drained: bool,
    learner: LearnerExit,
    paths: RunPaths | None = None,
    epoch: int | None = None,
) -> TerminalReceipt:
    """Seal the attempt's terminal receipt from the store's inventories (create-only).

    The inventories (checkpoints, evaluations, promotion) are read back from the receipt store,
    so the receipt proves what the store holds, not what the flow believes. A local copy is kept
    in the run directory. With ``epoch`` the attempt must still hold the run's lease at that epoch
    (a retried seal finds its own receipt and agrees).

    Raises:
        LeaseLost: ``epoch`` was superseded (the new attempt seals this one ``superseded``).
    """
    if epoch is not None:
        _require_own_lease(stores, spec.run_id, attempt_id, epoch)
    checkpoints, evaluations, promotion = inventory(stores, spec.run_id)
    receipt = TerminalReceipt(
        run_id=spec.run_id, attempt_id=attempt_id, goal_id=spec.goal_id, recipe_id=spec.recipe_id, seed=spec.seed,
        outcome=outcome, reason=reason, final_step=final_step, checkpoints=checkpoints, evaluations=evaluations,
        promotion=promotion, metrics=metrics, drained=drained, learner=learner, epoch=epoch, sealed_at=utcnow(),
    )
    if epoch is not None:
        _require_own_lease(stores, spec.run_id, attempt_id, epoch)  # again: the inventories took time
    stored = seal_terminal(stores, receipt)
    if paths is not None:
        write_local_receipt(paths, stored)
    return stored


def _require_own_lease(stores: Stores, run_id: str, attempt_id: str, epoch: int) -> None:
    """:func:`require_epoch`, passing a retry whose earlier try sealed (and released) already."""
    from gradlab.receipts.lease import LeaseLost, require_epoch

    try:
        require_epoch(stores, run_id, attempt_id, epoch)
    except LeaseLost:
        stored = read_terminal(stores, run_id, attempt_id)
        if stored is None or stored.epoch != epoch:
            raise


def write_local_receipt(paths: RunPaths, receipt: TerminalReceipt) -> bool:
    """Keep a copy of a stored receipt in the run directory (atomic); False when it cannot be
    written (a full disk): the store's copy is the authority, so sealing goes on without it."""
    from gradlab.errors import describe_failure
    from gradlab.fsync import write_atomic

    target = paths.attempt_receipt(receipt.attempt_id)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, receipt.model_dump_json(indent=1).encode())
    except OSError as e:
        log.warning("run %s: local copy of the receipt not written (%s); the receipt store has it",
                    receipt.run_id, describe_failure(e))
        return False
    return True


def close_abandoned_attempt(stores: Stores, paths: RunPaths | None, run_id: str, *, outcome: str,
                            reason: str, flow_run_id: str) -> TerminalReceipt | None:
    """Seal the attempt flow run ``flow_run_id`` opened, after that flow ended without sealing it
    (Prefect's state hooks: a crash, a cancellation or a failure; docs/ARCHITECTURE.md section 8).

    A hook closes only its *own* attempt (the one whose ``attempt.json`` names its flow run), and
    only while that attempt still holds the run's lease at its own epoch: a superseded attempt was
    sealed by its successor, and another attempt's lease is never touched, whatever its owner's
    pid looks like from here (docs/ARCHITECTURE.md section 9). Its learner is stopped first (the
    one stamped with its fence), the receipt lists what the attempt did itself
    (:func:`gradlab.receipts.terminal.close_attempt`), and the lease is released so a retry may
    start at once. An owner seen still running in this PID namespace is left to seal by itself.

    Returns:
        The receipt sealed now, or None (no attempt of this flow run, sealed already, superseded,
        or still running).
    """
    from gradlab.receipts.lease import LeaseLost, read_lease, release_lease
    from gradlab.receipts.owner import current_owner
    from gradlab.receipts.runs import list_attempts

    own = [a for a in list_attempts(stores, run_id) if a.flow_run_id == flow_run_id and a.epoch is not None]
    if not own or read_terminal(stores, run_id, own[-1].attempt_id) is not None:
        return None
    attempt_id, epoch = own[-1].attempt_id, int(own[-1].epoch)  # type: ignore[arg-type]
    held = read_lease(stores.control, run_id)
    if held is None or held.lease.released or (held.lease.holder, held.lease.generation) != (attempt_id, epoch):
        return None  # superseded: its successor sealed it (or will); never seal or release another's
    me = current_owner()
    if (held.lease.owner_pid, held.lease.owner_start) != (me.pid, me.start) and held.lease.owner_state() == "alive":
        return None  # the flow process still runs here: it seals by itself
    learner = LearnerExit(exit_code=None, stop_reason=None)
    final_step = metrics = None
    if paths is not None and paths.outbox.is_file():
        learner, final_step = _stop_orphaned_learner(paths, reason, (attempt_id, epoch))
        metrics = _journal_metrics(paths)
    try:
        receipt = close_attempt(stores, run_id, attempt_id, outcome=outcome, reason=reason, final_step=final_step,
                                learner=learner, epoch=epoch, fence=(attempt_id, epoch), metrics=metrics)
    except LeaseLost as e:
        log.info("run %s: %s was superseded while its hook closed it: %s", run_id, attempt_id, e)
        return None
    if receipt is not None and paths is not None:
        write_local_receipt(paths, receipt)
    if read_terminal(stores, run_id, attempt_id) is not None:
        try:
            release_lease(stores.control, held)
        except LeaseLost as e:
            log.info("run %s: lease of %s not released: %s", run_id, attempt_id, e)
    return receipt


def _journal_metrics(paths: RunPaths) -> TerminalMetrics | None:
    """What the run's journal holds by the outbox's delivery mark (the flow that died wrote it), or
    None when the outbox cannot be read; other sinks are not claimed."""
    try:
        outbox = Outbox(paths.outbox, readonly=True)
    except Exception as e:  # noqa: BLE001 - an unreadable outbox: the receipt claims no metrics
        log.info("%s: not read for the receipt's metrics: %s", paths.outbox, e)
        return None
    try:
        local = outbox.high_water("journal")
    except Exception as e:  # noqa: BLE001 - as above
        log.info("%s: not read for the receipt's metrics: %s", paths.outbox, e)
        return None
    finally:
        outbox.close()
    return TerminalMetrics(local_high_water=local, sinks={"journal": local})


def _stop_orphaned_learner(paths: RunPaths, reason: str, fence: tuple[str, int]) -> tuple[LearnerExit, int | None]:
    """Stop the learner a dead flow process left behind, the one stamped with its ``fence`` (never
    a newer attempt's); (its exit, the last step it reported)."""
    from gradlab.learn.watch import pid_alive
    from gradlab.runs.process import LearnerProcess

    outbox = Outbox(paths.outbox)
    try:
        started = outbox.last("learner_started")
        if started is not None and started.fence not in (None, fence):
            return LearnerExit(exit_code=None, stop_reason=None), None  # a newer attempt's learner: not ours
        if started is not None and pid_alive(int(started.payload["pid"])):
            LearnerProcess.attach(int(started.payload["pid"]), paths).stop(reason[:200], grace_s=10.0)
        finished = outbox.last("learner_finished")
        if finished is not None and (started is None or finished.event_seq > started.event_seq):
            return (LearnerExit(exit_code=0, stop_reason=finished.payload.get("stop_reason")),
                    finished.payload.get("final_step"))
        last = outbox.read(max(0, outbox.max_seq() - 1), 1)
        return LearnerExit(exit_code=None, stop_reason=None), (last[0].step if last else None) or None
    finally:
        outbox.close()
