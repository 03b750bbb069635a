"""Runs as the receipt store records them, read for the commands: one run's view, the attempts
training now, the latest terminal receipt.

Plain reads of the control and eval stores (nothing is written); ``gradlab runs show|retry|sync|
reconcile``, ``gradlab experiment status|retry``, ``gradlab train`` and ``gradlab server stop``
render or check what these return.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gradlab.stores import Stores


def run_view(stores: Stores, run_id: str) -> dict[str, Any]:
    """Everything the stores hold about a run: record, attempts with receipts, inventories.

    Args:
        stores: :class:`gradlab.stores.Stores` (control and eval stores are read).
        run_id: the run id.

    Returns:
        JSON-ready ``{"run": run record, "init_from": the run spec's warm-start parent or None,
        "attempts": [{"attempt_id", "mode", "started_at", "outcome" (None while unsealed),
        "skipped_checkpoints", "outbox_replaced"}], "receipt": the newest attempt's terminal receipt
        that is sealed or None, "checkpoints", "evaluations" (while the newest attempt is open, one
        without a result is ``running`` or ``queued``, :func:`live_statuses`; once sealed, a
        published checkpoint never evaluated is ``deferred``), "promotion" or None}``.

    Raises:
        NotFound: no run record of ``run_id`` (the message names the control store).
        StoreUnavailable: a store cannot be reached (transient).
    """
    from gradlab import receipts as rules
    from gradlab.errors import NotFound

    try:
        record = rules.read_run(stores, run_id)
    except NotFound:
        raise NotFound(f"no run {run_id} in {stores.control.base_url}; `gradlab runs list` lists the runs there") from None
    attempts = []
    receipt = None
    for attempt in rules.list_attempts(stores, run_id):
        terminal = rules.read_terminal(stores, run_id, attempt.attempt_id)
        attempts.append({"attempt_id": attempt.attempt_id, "mode": attempt.mode, "started_at": attempt.started_at.isoformat(),
                         "outcome": terminal.outcome if terminal else None,
                         # What integrity checks found when the attempt opened (docs/SECURITY.md).
                         "skipped_checkpoints": list(attempt.skipped_checkpoints),
                         "outbox_replaced": attempt.outbox_replaced})
        if terminal is not None:
            receipt = terminal.model_dump(mode="json")
    from gradlab.runs.operations import inventory

    checkpoints, evaluations, promotion = inventory(stores, run_id)
    try:
        init_from = rules.read_run_spec(stores, run_id).get("init_from")
    except NotFound:
        init_from = None
    return {
        "run": record.model_dump(mode="json"),
        "init_from": init_from,
        "attempts": attempts,
        "receipt": receipt,
        "checkpoints": [c.model_dump(mode="json") for c in checkpoints],
        "evaluations": _worded(stores, run_id, [e.model_dump(mode="json") for e in evaluations],
                               live=bool(attempts) and attempts[-1]["outcome"] is None),
        "promotion": promotion.model_dump(mode="json") if promotion else None,
    }


#: While an attempt is open, an evaluation with no result yet is ``running`` (its intent is
#: written) or ``queued`` (published, not yet asked); ``deferred`` (not evaluated) is an end
#: state: said once the receipt is sealed, or while open for a step above an accepted one (the
#: supervisor never evaluates those; promotion takes the lowest accepted step).
LIVE_STATUSES = ("running", "queued")


def _worded(stores: Stores, run_id: str, evaluations: list[dict[str, Any]], *, live: bool) -> list[dict[str, Any]]:
    if not live:
        return evaluations
    from gradlab import receipts as rules

    asked = {intent.checkpoint_step for intent, _ in rules.list_evaluations(stores, run_id)}
    return live_statuses(evaluations, asked=asked)


def live_statuses(evaluations: list[dict[str, Any]], *, asked: set[int]) -> list[dict[str, Any]]:
    """The evaluations of a run whose newest attempt is open, in its words (:data:`LIVE_STATUSES`).

    Args:
        evaluations: terminal-receipt entries as JSON (``deferred`` where there is no result yet).
        asked: checkpoint steps with an evaluation intent (submitted).
    """
    accepted = min((e["checkpoint_step"] for e in evaluations if e["status"] == "accepted"), default=None)
    out = []
    for e in evaluations:
        if e["status"] == "deferred" and (accepted is None or e["checkpoint_step"] < accepted):
            e = {**e, "status": "running" if e["checkpoint_step"] in asked else "queued"}
        out.append(e)
    return out


def live_attempts(stores: Stores, *, now: datetime | None = None) -> list[tuple[str, str]]:
    """Every attempt that is training now: ``(run_id, attempt_id)``, sorted by run id.

    An attempt is live when it has no terminal receipt and holds the run's writer lease, not
    released and not expired at ``now`` (the rule :func:`gradlab.receipts.reconcile_run` uses to
    leave an attempt open). The lease is taken before ``attempt.json`` is written, so an attempt
    still starting counts too. An attempt ``gradlab runs list`` shows as running whose lease expired
    (its process died without a receipt) is not live.

    Args:
        stores: :class:`gradlab.stores.Stores` (only the control store is read).
        now: the time leases are judged at (default: now, UTC).

    Raises:
        StoreUnavailable: the control store cannot be reached (transient).
    """
    from gradlab import receipts as rules
    from gradlab.receipts.lease import read_lease
    from gradlab.receipts.models import utcnow

    at = now or utcnow()
    live = []
    for run_id in rules.list_runs(stores):
        held = read_lease(stores.control, run_id)
        if held is None or not held.lease.in_force(at):
            continue
        if rules.read_terminal(stores, run_id, held.lease.holder) is None:
            live.append((run_id, held.lease.holder))
    return live


def latest_terminal_receipt(stores: Stores, run_id: str) -> dict[str, Any] | None:
    """The terminal receipt of the run's latest attempt, as JSON.

    Args:
        stores: :class:`gradlab.stores.Stores` (only the control store is read).
        run_id: the run id.

    Returns:
        The receipt (``TerminalReceipt`` dumped as JSON); None when the run has no attempt or its
        latest attempt is not sealed.

    Raises:
        StoreUnavailable: the control store cannot be reached (transient).
    """
    from gradlab import receipts as rules

    attempts = rules.list_attempts(stores, run_id)
    if not attempts:
        return None
    receipt = rules.read_terminal(stores, run_id, attempts[-1].attempt_id)
    return receipt.model_dump(mode="json") if receipt is not None else None
