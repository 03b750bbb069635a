"""Opening an attempt: one decision (docs/ARCHITECTURE.md section 9): either the new attempt takes
the writer lease (epoch + 1), writes ``attempt.json`` and the outbox fence and seals every earlier
unsealed attempt ``superseded``, or it is refused (``LeaseHeld``) having written nothing. Then the
attempt is planned: fresh, resume from the newest checkpoint that verifies, or drain
(docs/ARCHITECTURE.md section 8)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradlab.contracts.run_spec import RunSpec
from gradlab.errors import ContractViolation, NotFound
from gradlab.outbox import Outbox
from gradlab.receipts.evaluations import list_evaluations
from gradlab.receipts.lease import HeldLease, lease_ttl_s, require_no_live_lease, wait_out_lease
from gradlab.receipts.models import (
    Attempt,
    AttemptMode,
    CheckpointPublication,
    CheckpointRef,
    EvaluationRecord,
)
from gradlab.receipts.publication import list_publications
from gradlab.receipts.runs import begin_attempt, list_attempts, open_run
from gradlab.receipts.terminal import supersede_attempts
from gradlab.runs.operations.evaluating import record_unusable
from gradlab.runs.operations.publishing import local_checkpoint_dir
from gradlab.runs.paths import RunPaths
from gradlab.stores import Stores, keys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalCheckpoint:
    """A checkpoint an earlier attempt's learner wrote that was never published, verified against
    its own manifest (every file's sha256 and size): the new attempt publishes it."""

    step: int
    sha256: str
    path: Path
    purpose: str


@dataclass(frozen=True)
class AttemptPlan:
    """What this attempt does: start fresh, resume from a checkpoint, or only drain."""

    attempt: Attempt
    lease: HeldLease
    resume_dir: Path | None
    publications: tuple[CheckpointPublication, ...] = ()
    records: tuple[EvaluationRecord, ...] = ()
    #: Outbox events before this seq belong to an abandoned learner lineage (a retried attempt
    #: starts a new learner): their checkpoint events are never published from the outbox.
    first_seq: int = 0
    #: The outbox's next event_seq when this attempt set its fence: an event from here on stamped
    #: with another attempt or epoch is a superseded learner's, refused (docs/ARCHITECTURE.md section 5).
    opened_seq: int = 0

    #: Verified checkpoints of the abandoned lineage above the last published one, up to the one
    #: this attempt resumes from: published by this attempt (step order).
    unpublished: tuple[LocalCheckpoint, ...] = ()
    #: Attempts sealed ``superseded`` when this one took the lease (unsealed: crashed, paused, cut off).
    reconciled: tuple[str, ...] = ()
    #: sha256 → why, for published checkpoints that failed verification when this attempt opened
    #: (``skipped_checkpoints``): never evaluated nor promoted by it, kept as evidence
    #: (docs/ARCHITECTURE.md section 6).
    unusable: dict[str, str] = field(default_factory=dict)

    @property
    def fence(self) -> tuple[str, int]:
        """(attempt id, lease epoch) this attempt's learner stamps its events with."""
        return self.attempt.attempt_id, self.lease.lease.generation


def open_attempt(stores: Stores, spec: RunSpec, paths: RunPaths, *, flow_run_id: str | None = None) -> AttemptPlan:
    """Open the run (create-or-agree) and begin its next attempt under the writer lease.

    Mode: ``fresh`` for a run's first attempt (or a retry with no checkpoint to continue from);
    ``drain`` when an earlier attempt's learner had already finished (its outbox holds
    ``learner_finished``); otherwise ``resume`` from the newest checkpoint that verifies, wherever
    it is: still local above the newest published one and verified against its own manifest and
    the outbox's announcement (then this attempt publishes it, and any other verified unpublished
    checkpoint below it), else the newest published checkpoint that verifies against its
    publication receipt (downloaded, verified, into the run directory when the local copy is
    missing or differs). Newer published checkpoints that fail verification are passed over and
    named in the attempt receipt (``skipped_checkpoints``). A retried attempt never inherits an
    earlier attempt's stop request. Once this attempt holds the lease, every earlier attempt left
    unsealed is sealed ``superseded`` by it (:func:`gradlab.receipts.terminal.supersede_attempts`).

    Args:
        flow_run_id: the Prefect flow run executing the attempt (recorded: its hooks close only it).

    A lease in force whose owner cannot be seen from here (another host or PID namespace) is
    waited out first, for at most its remaining time (:func:`gradlab.receipts.lease.wait_out_lease`).

    Raises:
        LeaseHeld: another attempt's lease is in force with its owner seen alive here, or renewed
            while waited out, or its owner is seen running here although it expired; nothing is
            written (no receipt sealed, no lease or attempt touched).
        IntegrityError: no published checkpoint verifies (each failure named); no attempt is
            opened, so none is left unsealed.
    """
    # Refused before anything is written; a lease held from another host or namespace is waited out.
    wait_out_lease(stores.control, spec.run_id)
    open_run(stores, spec)
    previous = list_attempts(stores, spec.run_id)
    mode: AttemptMode = "fresh"
    resume: CheckpointRef | None = None
    resume_dir: Path | None = None
    skipped: list[str] = []
    publications: tuple[CheckpointPublication, ...] = ()
    records: tuple[EvaluationRecord, ...] = ()
    unpublished: tuple[LocalCheckpoint, ...] = ()
    reconciled: tuple[str, ...] = ()
    unusable: list[tuple[CheckpointPublication, str]] = []
    outbox = Outbox(paths.outbox)
    if previous:
        publications = tuple(list_publications(stores, spec.run_id))
        records = tuple(rec for _, rec in list_evaluations(stores, spec.run_id) if rec)
        accepted = any(r.status == "accepted" for r in records) and spec.goal.stops_on_acceptance
        if accepted or _learner_done(outbox):
            mode = "drain"
        else:
            newest = publications[-1].step if publications else -1
            unpublished = tuple(verified_local_checkpoints(paths, outbox, spec.run_id, above_step=newest))
            if unpublished:
                mode, local = "resume", unpublished[-1]
                resume_dir = local.path
                resume = CheckpointRef(step=local.step, sha256=local.sha256,
                                       uri=stores.model.url(keys.checkpoint_prefix(spec.run_id, local.step,
                                                                                   local.sha256).rstrip("/")) + "/")
            elif publications:
                mode = "resume"
                require_no_live_lease(stores.control, spec.run_id)  # refuse before touching the run directory
                resume_dir, chosen, unusable = choose_resume_checkpoint(stores, paths, publications)
                resume = chosen.ref
                skipped = [note for _, note in unusable]
    identity = outbox.identity()
    recorded = next((a for a in reversed(previous) if a.outbox is not None), None)
    replaced = None
    if recorded is not None and recorded.outbox != identity:
        replaced = (f"{paths.outbox}: outbox {identity} is not outbox {recorded.outbox} that {recorded.attempt_id} "
                    "recorded (lost, truncated or replaced); its events not yet delivered are lost")
        log.warning("run %s: %s", spec.run_id, replaced)
    attempt, held = begin_attempt(stores, spec.run_id, mode=mode, resume_from=resume,
                                  skipped_checkpoints=skipped, outbox=identity, outbox_replaced=replaced,
                                  flow_run_id=flow_run_id, ttl_s=lease_ttl_s())
    reconciled = tuple(r.attempt_id for r in supersede_attempts(stores, spec.run_id, held))
    # Only the lease holder may touch the run's control state: a new learner never inherits the
    # stop request an earlier attempt wrote (a cancel, or a stop it never got to observe), and any
    # earlier learner still writing to this outbox (paused past its lease) is fenced out.
    if mode != "drain":
        outbox.clear_stop()
    outbox.set_fence(attempt.attempt_id, held.lease.generation)
    opened = outbox.max_seq() + 1
    outbox.close()
    # A skipped checkpoint is not usable: its evaluation is recorded ``failed`` (once, naming the
    # verification failure) so this and every later attempt pass it over and the receipt names it.
    known = {rec.checkpoint_sha256 for rec in records}
    records += tuple(record_unusable(stores, spec, p, note, fence=(attempt.attempt_id, held.lease.generation))
                     for p, note in unusable if p.sha256 not in known)
    return AttemptPlan(attempt=attempt, lease=held, resume_dir=resume_dir, publications=publications, records=records,
                       first_seq=opened if previous and mode != "drain" else 0, opened_seq=opened,
                       unpublished=unpublished, reconciled=reconciled,
                       unusable={p.sha256: note for p, note in unusable})


def choose_resume_checkpoint(stores: Stores, paths: RunPaths, publications: tuple[CheckpointPublication, ...]
                             ) -> tuple[Path, CheckpointPublication, list[tuple[CheckpointPublication, str]]]:
    """The newest published checkpoint whose files verify against its publication receipt.

    Returns:
        (local folder, its publication, (publication, one line) per newer checkpoint passed over).

    Raises:
        IntegrityError: none verifies; the message names every failing file.
    """
    from gradlab.errors import IntegrityError

    skipped: list[tuple[CheckpointPublication, str]] = []
    for publication in sorted(publications, key=lambda p: p.step, reverse=True):
        try:
            return local_checkpoint_dir(stores, paths, publication), publication, skipped
        except (IntegrityError, NotFound) as e:
            log.warning("run %s: checkpoint at step %d cannot be resumed from: %s", publication.run_id,
                        publication.step, e)
            skipped.append((publication, f"step {publication.step}: {e}"))
    raise IntegrityError(f"run {publications[0].run_id}: no published checkpoint verifies against its publication "
                         f"receipt, refusing to resume: {'; '.join(note for _, note in skipped)}")


def verified_local_checkpoints(paths: RunPaths, outbox: Any, run_id: str, *, above_step: int) -> list[LocalCheckpoint]:
    """The checkpoints the run's learners announced (``checkpoint_ready``) above ``above_step``
    whose folder verifies against its own manifest, holds only the bundle's files, and names this
    run, by step.

    A checkpoint that fails verification (a crash while writing, a corrupted file) is skipped with
    a warning naming it; one announced twice with different content keeps the latest announcement.
    """
    from gradlab.checkpoints import verify_checkpoint
    from gradlab.checkpoints.bundle import check_bundle_files
    from gradlab.errors import IntegrityError

    announced: dict[int, Any] = {}
    for event in outbox.read(0, 1_000_000, kind="checkpoint_ready"):
        if int(event.payload["step"]) > above_step:
            announced[int(event.payload["step"])] = event.payload
    found = []
    for step, payload in sorted(announced.items()):
        path = Path(payload["path"])
        if not path.is_absolute():
            path = paths.root / path
        try:
            manifest = verify_checkpoint(path)
            check_bundle_files(path)  # a file planted there (even listed in a rewritten manifest) is refused
        except (IntegrityError, ContractViolation, NotFound, OSError) as e:
            log.warning("run %s: unpublished checkpoint at step %d does not verify (%s): not resumed from",
                        run_id, step, e)
            continue
        if manifest.sha256 != str(payload["sha256"]) or manifest.run_id != run_id or manifest.step != step:
            log.warning("run %s: %s: its manifest names step %d / %s of run %s, the outbox step %d / %s: skipped",
                        run_id, path, manifest.step, manifest.sha256[:16], manifest.run_id, step,
                        str(payload["sha256"])[:16])
            continue
        found.append(LocalCheckpoint(step=step, sha256=manifest.sha256, path=path,
                                     purpose=str(payload.get("purpose", manifest.purpose))))
    return found


def _learner_done(outbox: Any) -> bool:
    """True when the learner finished its job: budget, an early stop, or a stop after acceptance.

    A learner stopped by a cancel, a signal or a lost supervisor has not: its run resumes.
    """
    finished = outbox.last("learner_finished")
    if finished is None:
        return False
    reason = str(finished.payload.get("stop_reason", ""))
    if reason == "budget" or reason.startswith("early_stop"):
        return True
    observed = outbox.last("stop_observed")
    # accepted:<step>, or deferred:<step> (stopped where a lower step was accepted: gradlab.learn.stop_rule)
    return reason == "stop_requested" and observed is not None and str(observed.payload.get("reason", "")).startswith(
        ("accepted:", "deferred:"))
