"""Receipts: immutable JSON records that prove what happened to a run, and the rules for writing them.

Models (frozen pydantic, ``extra="forbid"``; :mod:`gradlab.receipts.models`):
    RunRecord, Attempt, Lease, CheckpointPublication, RunIndex (+ IndexEntry, PromotionRef),
    EvaluationIntent (content key :func:`evaluation_intent_key`), EvaluationRecord, StopRequest,
    Promotion, TerminalReceipt (docs/ARCHITECTURE.md section 8; + TerminalCheckpoint, TerminalEvaluation,
    TerminalPromotion, TerminalMetrics, LearnerExit), CheckpointRef.

Rules, each idempotent so a retried Prefect task agrees with its own earlier write:
    open_run, read_run, read_run_spec, list_runs (:mod:`.runs`)
    begin_attempt (lease, then attempt.json), list_attempts (:mod:`.runs`)
    acquire_lease, renew_lease, release_lease, read_lease (HeldLease; LeaseHeld, LeaseLost),
        require_epoch (fencing: refuse a superseded attempt's write) (:mod:`.lease`)
    publish_checkpoint (upload + verify + receipt + index), list_publications, download_checkpoint,
        verify_published (:mod:`.publication`)
    read_index, update_index, with_checkpoint, with_promotion (index.json by compare-and-swap; :mod:`.index`)
    register_evaluation, make_evaluation_record, record_evaluation, list_evaluations (:mod:`.evaluations`)
    request_stop, read_stop_request (first request wins; :mod:`.runs`)
    write_promotion, read_promotion (create-only, exactly one per run; a second promoter agrees
        when it names the same checkpoint, else Conflict; :mod:`.promotion`)
    seal_terminal, read_terminal, run_inventory, reconcile_run (closes attempts whose hooks never ran),
        attempt_inventory, close_attempt (seal an attempt from what it did itself: hooks, reconcile)
        (:mod:`.terminal`)

Key layout: :mod:`gradlab.stores` (module docstring).
"""

from gradlab.receipts.evaluations import (
    list_evaluations,
    make_evaluation_record,
    record_evaluation,
    register_evaluation,
)
from gradlab.receipts.index import read_index, update_index, with_checkpoint, with_promotion
from gradlab.receipts.io import dump_model, read_model
from gradlab.receipts.lease import (
    DEFAULT_LEASE_TTL_S,
    HeldLease,
    LeaseHeld,
    LeaseLost,
    acquire_lease,
    read_lease,
    release_lease,
    renew_lease,
    require_epoch,
)
from gradlab.receipts.models import (
    Attempt,
    CheckpointPublication,
    CheckpointRef,
    EvaluationIntent,
    EvaluationRecord,
    FileEntry,
    IndexEntry,
    LearnerExit,
    Lease,
    Promotion,
    PromotionRef,
    RunIndex,
    RunRecord,
    StopRequest,
    TerminalCheckpoint,
    TerminalEvaluation,
    TerminalMetrics,
    TerminalPromotion,
    TerminalReceipt,
    evaluation_intent_key,
    utcnow,
)
from gradlab.receipts.promotion import read_promotion, write_promotion
from gradlab.receipts.publication import (
    download_checkpoint,
    list_publications,
    publish_checkpoint,
    verify_published,
)
from gradlab.receipts.runs import (
    begin_attempt,
    list_attempts,
    list_runs,
    open_run,
    read_run,
    read_run_spec,
    read_stop_request,
    request_stop,
)
from gradlab.receipts.terminal import (
    attempt_inventory,
    close_attempt,
    read_terminal,
    reconcile_run,
    run_inventory,
    seal_terminal,
)

__all__ = [
    "DEFAULT_LEASE_TTL_S", "Attempt", "CheckpointPublication", "CheckpointRef", "EvaluationIntent",
    "EvaluationRecord", "FileEntry", "HeldLease", "IndexEntry", "LearnerExit", "Lease", "LeaseHeld", "LeaseLost",
    "Promotion", "PromotionRef", "RunIndex", "RunRecord", "StopRequest", "TerminalCheckpoint",
    "TerminalEvaluation", "TerminalMetrics", "TerminalPromotion", "TerminalReceipt", "acquire_lease",
    "attempt_inventory", "close_attempt",
    "begin_attempt", "download_checkpoint", "dump_model", "evaluation_intent_key", "list_attempts", "list_evaluations",
    "list_publications", "list_runs", "make_evaluation_record", "open_run", "publish_checkpoint", "read_index",
    "read_lease", "read_model", "read_promotion", "read_run", "read_run_spec", "read_stop_request",
    "read_terminal", "reconcile_run", "record_evaluation", "register_evaluation", "release_lease",
    "renew_lease", "request_stop", "require_epoch", "run_inventory", "seal_terminal", "update_index", "utcnow",
    "verify_published", "with_checkpoint", "with_promotion", "write_promotion",
]
