"""The rules of receipts: what may be written when, and what a second writer finds.

Each function here is one domain step a Prefect task wraps (``tasks/``): idempotent, so a retried
task finds its own earlier write and agrees with it instead of writing twice.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from datetime import datetime
from pathlib import Path
from typing import Any

from gradlab.contracts.hashing import canonical_json, sha256_json
from gradlab.errors import Conflict, ContractViolation, IntegrityError, NotFound
from gradlab.receipts.index import update_index, with_checkpoint, with_promotion
from gradlab.receipts.io import create_or_agree, dump_model, read_model, read_optional
from gradlab.receipts.lease import DEFAULT_LEASE_TTL_S, HeldLease, acquire_lease, read_lease
from gradlab.receipts.models import (
    Attempt,
    AttemptMode,
    CheckpointPublication,
    CheckpointRef,
    EvaluationIntent,
    EvaluationRecord,
    FileEntry,
    IndexEntry,
    LearnerExit,
    Promotion,
    RunRecord,
    StopRequest,
    TerminalCheckpoint,
    TerminalEvaluation,
    TerminalMetrics,
    TerminalPromotion,
    TerminalReceipt,
    utcnow,
)
from gradlab.stores import Stores, keys, sha256_hex

logger = logging.getLogger(__name__)


# -- run ---------------------------------------------------------------------------------------
def open_run(stores: Stores, spec: Any, *, now: datetime | None = None) -> RunRecord:
    """Write ``spec.json`` and ``run.json`` for a run spec (create-only; re-opening agrees).

    Args:
        spec: a :class:`gradlab.contracts.run_spec.RunSpec`.

    Returns:
        The stored run record (the earlier one when the run was opened before).

    Raises:
        Conflict: a run with this id exists with a different spec.
    """
    spec_json = spec.model_dump(mode="json")
    record = RunRecord.from_spec(spec, now=now)
    stores.control.put_create_only(keys.run_spec(spec.run_id), canonical_json(spec_json))
    return create_or_agree(
        stores.control,
        keys.run_record(spec.run_id),
        record,
        agree=lambda old, new: old.spec_sha256 == new.spec_sha256,
        what="run record",
    )


def read_run(stores: Stores, run_id: str) -> RunRecord:
    """The run record. Raises NotFound naming the key when the run does not exist."""
    return read_model(stores.control, keys.run_record(run_id), RunRecord)


def read_run_spec(stores: Stores, run_id: str) -> dict[str, Any]:
    """The resolved run spec JSON as written by :func:`open_run`, checked against the run record's
    ``spec_sha256`` when the record exists.

    Raises:
        NotFound: no spec. ContractViolation: the object is not a JSON object.
        IntegrityError: its hash is not the run record's.
    """
    url = stores.control.url(keys.run_spec(run_id))
    try:
        spec = json.loads(stores.control.get(keys.run_spec(run_id)))
    except (ValueError, UnicodeDecodeError) as e:
        raise ContractViolation(f"{url}: not JSON ({e})") from None
    if not isinstance(spec, dict):
        raise ContractViolation(f"{url}: expected a JSON object, found {type(spec).__name__}")
    try:
        record = read_run(stores, run_id)
    except NotFound:  # opened up to the spec only: nothing to check it against
        return spec
    found = sha256_json(spec)
    if found != record.spec_sha256:
        raise IntegrityError(f"{url}: sha256 expected {record.spec_sha256} (run record), found {found}")
    return spec


def list_runs(stores: Stores) -> list[str]:
    """Run ids with a run record in the control store, sorted (ids sort by start time)."""
    return sorted(
        k.split("/")[1] for k in stores.control.list("runs/") if k.count("/") == 2 and k.endswith("/run.json")
    )


# -- attempts ----------------------------------------------------------------------------------
def list_attempts(stores: Stores, run_id: str) -> list[Attempt]:
    """Every attempt of the run, by number."""
    found = [
        read_model(stores.control, k, Attempt)
        for k in stores.control.list(keys.attempts_prefix(run_id))
        if k.endswith("/attempt.json")
    ]
    return sorted(found, key=lambda a: a.number)


def begin_attempt(
    stores: Stores,
    run_id: str,
    *,
    mode: AttemptMode,
    resume_from: CheckpointRef | None = None,
    skipped_checkpoints: list[str] | None = None,
    outbox: str | None = None,
    outbox_replaced: str | None = None,
    ttl_s: float = DEFAULT_LEASE_TTL_S,
    now: datetime | None = None,
) -> tuple[Attempt, HeldLease]:
    """Start the next attempt of a run: take the writer lease, then write ``attempt.json``.

    Returns:
        (attempt, held lease); renew the lease at least every ``ttl_s / 3`` seconds.

    Raises:
        LeaseHeld: another attempt's lease is live (a retry is refused while it is).
        Conflict: another process created the same attempt number first.
    """
    previous = list_attempts(stores, run_id)
    number = previous[-1].number + 1 if previous else 1
    attempt_id = f"attempt-{number:03d}"
    held = acquire_lease(stores.control, run_id, attempt_id, ttl_s=ttl_s, now=now)
    attempt = Attempt(
        run_id=run_id,
        attempt_id=attempt_id,
        number=number,
        mode=mode,
        resume_from=resume_from,
        skipped_checkpoints=list(skipped_checkpoints or []),
        outbox=outbox,
        outbox_replaced=outbox_replaced,
        previous_attempt_id=previous[-1].attempt_id if previous else None,
        host=socket.gethostname(),
        pid=os.getpid(),
        started_at=now or utcnow(),
    )
    stores.control.put_create_only(keys.attempt(run_id, attempt_id), dump_model(attempt))
    return attempt, held


# -- checkpoints -------------------------------------------------------------------------------
def _checkpoint_files(checkpoint_dir: Path) -> dict[str, Path]:
    files = {}
    for path in sorted(checkpoint_dir.rglob("*")):
        if path.is_file():
            files[path.relative_to(checkpoint_dir).as_posix()] = path
    return files


def require_epoch(stores: Stores, run_id: str, attempt_id: str, epoch: int) -> None:
    """Refuse a write made for an attempt whose lease epoch is no longer current (fencing).

    Raises:
        LeaseLost: the lease is held by another attempt or epoch (or released), naming both.
    """
    from gradlab.receipts.lease import LeaseLost

    held = read_lease(stores.control, run_id)
    if held is None or (held.lease.holder, held.lease.generation) != (attempt_id, epoch) or held.lease.released:
        found = "no lease" if held is None else (f"{held.lease.holder} epoch {held.lease.generation}"
                                                 f"{' (released)' if held.lease.released else ''}")
        raise LeaseLost(f"{stores.control.url(keys.lease(run_id))}: write for {attempt_id} epoch {epoch} refused: "
                        f"the lease is {found}")


def publish_checkpoint(
    stores: Stores, *, run_id: str, attempt_id: str, checkpoint_dir: Path, now: datetime | None = None,
    epoch: int | None = None,
) -> CheckpointPublication:
    """Copy a checkpoint folder to the model store, verify it, write its receipt, add it to the index.

    Every file listed in ``manifest.json`` (``files: {relative path: {sha256, size_bytes}}``) is checked
    against its bytes before upload; every file is uploaded create-only and re-read
    (:meth:`ObjectStore.put_verified`). A retry after a partial publication re-uploads identical
    bytes (success) and finds the receipt it wrote (agrees).

    Returns:
        The publication receipt as stored.

    Args:
        epoch: the publishing attempt's lease epoch: checked before anything is uploaded and again
            before the receipt is written (a superseded attempt publishes nothing), and recorded.

    Raises:
        LeaseLost: ``epoch`` is no longer the lease's.
        ContractViolation: no ``manifest.json``, or it names another run.
        IntegrityError: a file's bytes do not match the manifest (names the file), a listed file is
            missing, or a file is not listed.
        Conflict: the model store holds different bytes under this checkpoint's keys.
        StoreUnavailable: a store cannot be reached (transient: retry).
    """
    checkpoint_dir = Path(checkpoint_dir)
    manifest_path = checkpoint_dir / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_bytes())
    except FileNotFoundError:
        raise ContractViolation(f"{manifest_path}: checkpoint has no manifest.json") from None
    if manifest.get("run_id") != run_id:
        raise ContractViolation(f"{manifest_path}: run_id: expected {run_id}, found {manifest.get('run_id')}")
    if epoch is not None:
        require_epoch(stores, run_id, attempt_id, epoch)
    step, sha256, purpose = int(manifest["step"]), str(manifest["sha256"]), manifest.get("purpose", "periodic")
    listed: dict[str, dict] = manifest.get("files", {})
    present = _checkpoint_files(checkpoint_dir)
    missing = sorted(set(listed) - set(present))
    if missing:
        raise IntegrityError(f"{checkpoint_dir}: files listed in manifest.json are missing: {', '.join(missing)}")
    unlisted = sorted(set(present) - set(listed) - {"manifest.json"})
    if unlisted:
        raise IntegrityError(f"{checkpoint_dir}: files not listed in manifest.json: {', '.join(unlisted)}")
    entries: dict[str, FileEntry] = {}
    for name, path in present.items():
        data = path.read_bytes()
        digest = sha256_hex(data)
        if name in listed and listed[name].get("sha256") != digest:
            raise IntegrityError(
                f"{path}: sha256 expected {listed[name].get('sha256')} (manifest.json), found {digest}"
            )
        stores.model.put_verified(keys.checkpoint_file(run_id, step, sha256, name), data)
        entries[name] = FileEntry(sha256=digest, size_bytes=len(data))
    uri = stores.model.url(keys.checkpoint_prefix(run_id, step, sha256).rstrip("/")) + "/"
    publication = CheckpointPublication(
        run_id=run_id,
        attempt_id=attempt_id,
        step=step,
        sha256=sha256,
        purpose=purpose,
        uri=uri,
        files=entries,
        epoch=epoch,
        published_at=now or utcnow(),
    )
    if epoch is not None:
        require_epoch(stores, run_id, attempt_id, epoch)
    stored = create_or_agree(
        stores.control,
        keys.publication(run_id, step, sha256),
        publication,
        agree=lambda old, new: (old.step, old.sha256, old.files, old.uri) == (new.step, new.sha256, new.files, new.uri),
        what="checkpoint publication",
    )
    entry = IndexEntry(step=step, sha256=sha256, uri=uri, purpose=stored.purpose)
    update_index(stores.model, run_id, lambda index: with_checkpoint(index, entry))
    logger.info("run %s: published checkpoint step %d (%s)", run_id, step, sha256[:16])
    return stored


def download_checkpoint(stores: Stores, publication: CheckpointPublication, dest: Path) -> Path:
    """Fetch a published checkpoint into ``dest`` (a new folder), verifying every file's sha256.

    The files land in a sibling ``.partial`` folder first, which is renamed to ``dest`` once all are
    verified, so ``dest`` is either complete or absent.

    Returns:
        ``dest``.

    Raises:
        Conflict: ``dest`` exists already.
        IntegrityError: a downloaded file's sha256 differs from the publication receipt (names it).
        NotFound: a file of the publication is missing from the model store.
    """
    import shutil
    import uuid

    dest = Path(dest)
    if dest.exists():
        raise Conflict(f"{dest}: exists already; expected a new folder for the checkpoint")
    partial = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}.partial"
    partial.mkdir(parents=True)
    try:
        for name, entry in sorted(publication.files.items()):
            key = keys.checkpoint_file(publication.run_id, publication.step, publication.sha256, name)
            data = stores.model.get(key)
            if sha256_hex(data) != entry.sha256:
                raise IntegrityError(
                    f"{stores.model.url(key)}: sha256 expected {entry.sha256} (publication), found {sha256_hex(data)}"
                )
            target = partial / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        os.rename(partial, dest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return dest


def verify_published(stores: Stores, publication: CheckpointPublication) -> None:
    """Re-read every published object of a checkpoint from the model store and check its sha256
    against the publication receipt (control store): what is evaluated and promoted must be
    byte-identical to what was published (docs/ARCHITECTURE.md section 8).

    Raises:
        IntegrityError: an object's bytes differ, naming its URL and both hashes.
        NotFound: an object of the publication is missing from the model store (named).
        StoreUnavailable: the model store cannot be reached (transient).
    """
    for name, entry in sorted(publication.files.items()):
        key = keys.checkpoint_file(publication.run_id, publication.step, publication.sha256, name)
        digest = sha256_hex(stores.model.get(key))
        if digest != entry.sha256:
            raise IntegrityError(f"{stores.model.url(key)}: sha256 expected {entry.sha256} (publication), found {digest}")


def list_publications(stores: Stores, run_id: str) -> list[CheckpointPublication]:
    """Every published checkpoint of the run, by step."""
    found = [
        read_model(stores.control, k, CheckpointPublication)
        for k in stores.control.list(keys.publications_prefix(run_id))
        if k.endswith(".json")
    ]
    return sorted(found, key=lambda p: (p.step, p.sha256))


# -- evaluations -------------------------------------------------------------------------------
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
) -> EvaluationRecord:
    """An :class:`EvaluationRecord` for ``intent`` with ``result_sha256`` computed from ``result``."""
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


# -- stop --------------------------------------------------------------------------------------
def request_stop(stores: Stores, stop: StopRequest) -> StopRequest:
    """Record a stop request; the first request wins and is returned to every later caller."""
    return create_or_agree(
        stores.control, keys.stop_request(stop.run_id), stop, agree=lambda old, new: True, what="stop request"
    )


def read_stop_request(stores: Stores, run_id: str) -> StopRequest | None:
    return read_optional(stores.control, keys.stop_request(run_id), StopRequest)


# -- promotion ---------------------------------------------------------------------------------
def write_promotion(stores: Stores, promotion: Promotion) -> Promotion:
    """Promote a checkpoint: create-only ``promotion.json``, exactly one per run, then the index.

    A second promoter finds the existing promotion: it agrees (gets the existing receipt back) when
    it names the same checkpoint (step and sha256), else it is refused.

    Raises:
        Conflict: the run already promoted a different checkpoint (names both).
    """
    stored = create_or_agree(
        stores.control,
        keys.promotion(promotion.run_id),
        promotion,
        agree=lambda old, new: (old.checkpoint_step, old.checkpoint_sha256) == (new.checkpoint_step, new.checkpoint_sha256),
        what="promotion",
    )
    update_index(stores.model, promotion.run_id, lambda index: with_promotion(index, stored.ref))
    return stored


def read_promotion(stores: Stores, run_id: str) -> Promotion | None:
    return read_optional(stores.control, keys.promotion(run_id), Promotion)


# -- terminal receipt --------------------------------------------------------------------------
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
    return read_optional(stores.control, keys.terminal(run_id, attempt_id), TerminalReceipt)


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
        evaluations.append(
            TerminalEvaluation(
                checkpoint_step=intent.checkpoint_step,
                status=record.status if record else "deferred",
                result_uri=stores.eval.url(keys.evaluation_result(run_id, intent.key)) if record else None,
                return_mean=record.return_mean if record else None,
            )
        )
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
        evaluations.append(
            TerminalEvaluation(
                checkpoint_step=intent.checkpoint_step,
                status=record.status if record else "deferred",
                result_uri=stores.eval.url(keys.evaluation_result(run_id, intent.key)) if record else None,
                return_mean=record.return_mean if record else None,
            )
        )
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
