"""The run's domain steps, one function each; ``tasks/`` wraps every one in a Prefect task.

Each step is idempotent against the receipt store: a retry finds what an earlier try wrote and
agrees with it, so a transient failure (``StoreUnavailable``) is always safe to retry.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradlab import receipts as rules
from gradlab.contracts.hashing import sha256_json
from gradlab.contracts.run_spec import InitFrom, RunSpec
from gradlab.errors import ContractViolation, NotFound
from gradlab.outbox import Outbox
from gradlab.receipts.lease import HeldLease
from gradlab.receipts.models import (
    Attempt,
    AttemptMode,
    CheckpointPublication,
    CheckpointRef,
    EvaluationIntent,
    EvaluationRecord,
    LearnerExit,
    Promotion,
    TerminalMetrics,
    TerminalReceipt,
    utcnow,
)
from gradlab.runs.paths import RunPaths
from gradlab.settings import Settings
from gradlab.stores import Stores, keys

log = logging.getLogger(__name__)



def prepare_spec(
    settings: Settings,
    *,
    recipe: str | None,
    seed: int = 0,
    overrides: list[str] | None = None,
    run_id: str | None = None,
    stores: Stores | None = None,
    evaluate: bool = True,
    init_from: InitFrom | None = None,
) -> tuple[RunSpec, RunPaths]:
    """Resolve a new run's spec from ``GOAL/RECIPE``, or read an existing run's spec by ``run_id``.

    ``seed``, ``overrides``, ``evaluate`` and ``init_from`` (a warm start's parent) apply to a new run
    only; an existing run keeps its own.

    The spec is written to the run directory (``spec.json``) so the learner can read it.

    Raises:
        ConfigError / NotFound: the recipe does not resolve, or no run ``run_id`` exists.
    """
    local = RunPaths(settings.run_dir(run_id)).spec if run_id else None
    if local is not None and local.is_file():
        spec = RunSpec.model_validate_json(local.read_text())
    elif run_id is not None and stores is not None and _run_exists(stores, run_id):
        spec = RunSpec.model_validate(rules.read_run_spec(stores, run_id))
    else:
        if recipe is None:
            raise NotFound(f"run {run_id}: no such run in {settings.control_store_url}" if run_id else
                           "a recipe (GOAL/RECIPE) or an existing run id is required")
        from gradlab.contracts import Experiments

        resolved = Experiments().resolve(recipe, list(overrides or []))
        spec = RunSpec.from_resolved(resolved, seed=seed, run_id=run_id, evaluate=evaluate, init_from=init_from)
    paths = RunPaths(settings.run_dir(spec.run_id)).ensure()
    write_local_spec(paths, spec)
    return spec, paths


def write_local_spec(paths: RunPaths, spec: RunSpec) -> None:
    """Write ``spec.json`` once (atomic); an existing one must be the same spec."""
    body = json.dumps(spec.to_json(), indent=1, sort_keys=True)
    if paths.spec.exists():
        existing = json.loads(paths.spec.read_text())
        if sha256_json(existing) != sha256_json(spec.to_json()):
            raise ContractViolation(f"{paths.spec}: holds another spec for run {spec.run_id}")
        return
    from gradlab.fsync import write_atomic

    write_atomic(paths.spec, body.encode())


def outbox_high_water(paths: RunPaths, sink: str) -> int:
    """The outbox's acknowledged event_seq for ``sink`` (0 before any delivery)."""
    from gradlab.outbox import Outbox

    return Outbox(paths.outbox).high_water(sink)


def wandb_sink(settings: Settings, spec: RunSpec, paths: RunPaths, mode: str, *, group: str | None = None) -> Any:
    """The run's :class:`~gradlab.metrics.wandb_sink.WandbSink`, started in the background.

    In ``online`` mode the API key comes from ``[wandb] api_key_ref`` when ``WANDB_API_KEY`` is not
    set (:func:`~gradlab.metrics.wandb_sink.resolve_api_key`); a reference that does not resolve is
    logged and W&B looks for its key itself (no key: the sink ends ``pending``, the run goes on).
    W&B's own ``WANDB_INIT_TIMEOUT`` (seconds) bounds its start-up, default 30 s. ``group`` is the
    W&B group (a sweep's cohort id); the project is :func:`~gradlab.metrics.wandb_sink.wandb_project`.
    """
    import os

    from gradlab.errors import ConfigError
    from gradlab.metrics.wandb_sink import WandbSink, resolve_api_key, wandb_project

    try:
        init_timeout_s = float(os.environ.get("WANDB_INIT_TIMEOUT") or 30.0)
    except ValueError:
        log.warning("WANDB_INIT_TIMEOUT=%r is not a number of seconds; using 30", os.environ["WANDB_INIT_TIMEOUT"])
        init_timeout_s = 30.0

    api_key = None
    if mode == "online":
        try:
            api_key = resolve_api_key(settings)
        except ConfigError as e:
            log.warning("run %s: W&B key: %s", spec.run_id, e)
    return WandbSink(spec.run_id, mode, paths.wandb_dir, wandb_project(settings.wandb_project, spec), group=group,
                     config={"spec": spec.to_json()}, entity=settings.wandb_entity, name=spec.display_name,
                     high_water=outbox_high_water(paths, "wandb"), background=True, api_key=api_key,
                     init_timeout_s=init_timeout_s)


def _run_exists(stores: Stores, run_id: str) -> bool:
    try:
        rules.read_run(stores, run_id)
    except NotFound:
        return False
    return True


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
    #: Attempts closed when this one opened (their process ended without sealing a receipt).
    reconciled: tuple[str, ...] = ()
    #: sha256 → why, for published checkpoints that failed verification when this attempt opened
    #: (``skipped_checkpoints``): never evaluated nor promoted by it, kept as evidence
    #: (docs/ARCHITECTURE.md section 6).
    unusable: dict[str, str] = field(default_factory=dict)

    @property
    def fence(self) -> tuple[str, int]:
        """(attempt id, lease epoch) this attempt's learner stamps its events with."""
        return self.attempt.attempt_id, self.lease.lease.generation


def open_attempt(stores: Stores, spec: RunSpec, paths: RunPaths) -> AttemptPlan:
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
    earlier attempt's stop request, and attempts that ended without sealing a receipt are
    reconciled first (:func:`gradlab.receipts.terminal.reconcile_run`; docs/ARCHITECTURE.md section 8).

    Raises:
        LeaseHeld: another attempt's lease is live (a retry is refused while it is).
        IntegrityError: no published checkpoint verifies (each failure named); no attempt is
            opened, so none is left unsealed.
    """
    rules.open_run(stores, spec)
    previous = rules.list_attempts(stores, spec.run_id)
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
        reconciled = tuple(r.attempt_id for r in rules.reconcile_run(stores, spec.run_id))
        publications = tuple(rules.list_publications(stores, spec.run_id))
        records = tuple(rec for _, rec in rules.list_evaluations(stores, spec.run_id) if rec)
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
                from gradlab.receipts.lease import require_no_live_lease

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
    attempt, held = rules.begin_attempt(stores, spec.run_id, mode=mode, resume_from=resume,
                                        skipped_checkpoints=skipped, outbox=identity, outbox_replaced=replaced)
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
    records += tuple(record_unusable(stores, spec, p, note) for p, note in unusable if p.sha256 not in known)
    return AttemptPlan(attempt=attempt, lease=held, resume_dir=resume_dir, publications=publications, records=records,
                       first_seq=opened if previous and mode != "drain" else 0, opened_seq=opened,
                       unpublished=unpublished, reconciled=reconciled,
                       unusable={p.sha256: note for p, note in unusable})


def record_unusable(stores: Stores, spec: RunSpec, publication: CheckpointPublication, why: str) -> EvaluationRecord:
    """Record the evaluation of a published checkpoint that fails verification as ``failed`` without
    running it (create-or-agree: a result already recorded for it is returned as it is).

    ``why`` names the failing object and both hashes (from :func:`choose_resume_checkpoint`).
    """
    from gradlab.evaluation import build_manifest

    intent = EvaluationIntent.create(
        run_id=spec.run_id, checkpoint=publication.ref, goal_contract_sha256=spec.goal_contract_sha256,
        episode_manifest_sha256=build_manifest(spec.goal).sha256, backend="none",
    )
    intent, existing = rules.register_evaluation(stores, intent)
    if existing is not None:
        return existing
    log.warning("run %s: checkpoint at step %d fails verification: recorded as a failed evaluation, not evaluated "
                "nor promoted (%s)", spec.run_id, publication.step, why)
    error = f"IntegrityError: not evaluated: the checkpoint fails verification against its publication receipt: {why}"
    return rules.record_evaluation(stores, rules.make_evaluation_record(intent, status="failed", error=error))


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
    whose folder verifies against its own manifest and names this run, by step.

    A checkpoint that fails verification (a crash while writing, a corrupted file) is skipped with
    a warning naming it; one announced twice with different content keeps the latest announcement.
    """
    from gradlab.checkpoints import verify_checkpoint
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
    return reason == "stop_requested" and observed is not None and str(observed.payload.get("reason", "")).startswith("accepted:")


def local_checkpoint_dir(stores: Stores, paths: RunPaths, publication: CheckpointPublication) -> Path:
    """The published checkpoint's folder in the run directory, verified file by file against its
    publication receipt (the control store, not the folder's own manifest); downloaded (verified)
    when absent, and again when the local copy differs (the bad copy is kept aside).

    Raises:
        IntegrityError: the model store's copy differs from the publication (names the object and
            both hashes). NotFound: an object of the publication is missing from the model store.
    """
    from gradlab.checkpoints import verify_against_publication
    from gradlab.errors import IntegrityError
    from gradlab.stores import keys

    dest = paths.checkpoints / keys.checkpoint_name(publication.step, publication.sha256)
    if dest.is_dir():
        try:
            verify_against_publication(dest, publication.files)
            return dest
        except (IntegrityError, ContractViolation, NotFound) as e:
            aside = dest.with_name(f"{dest.name}.corrupt-{time.time_ns()}")
            log.warning("%s fails verification (%s): kept as %s; using the published copy", dest, e, aside.name)
            dest.rename(aside)
    rules.download_checkpoint(stores, publication, dest)
    verify_against_publication(dest, publication.files)
    return dest


def prewarm_evaluation(backend: str, count: int = 1) -> None:
    """Start ``count`` warm evaluation processes now, while the learner trains (local backend only)."""
    if backend == "local":
        from gradlab.evaluation.backends import prewarm

        prewarm(count)


def publish(stores: Stores, run_id: str, attempt_id: str, checkpoint_dir: Path, *,
            epoch: int | None = None) -> CheckpointPublication:
    """Publish one checkpoint (copy, verify, receipt, index). See :func:`gradlab.receipts.publication.publish_checkpoint`.

    Raises:
        LeaseLost: ``epoch`` is no longer the lease's (a newer attempt holds the run).
    """
    return rules.publish_checkpoint(stores, run_id=run_id, attempt_id=attempt_id, checkpoint_dir=checkpoint_dir,
                                    epoch=epoch)


def evaluate(
    stores: Stores, spec: RunSpec, publication: CheckpointPublication, checkpoint_dir: Path, *, backend: str = "local",
    timeout_s: float | None = None,
) -> EvaluationRecord:
    """Evaluate a published checkpoint once, keyed by content; record and return the result.

    A result already recorded for the same (run, checkpoint, goal, manifest) is returned as it is:
    a retried task never evaluates twice. A permanent evaluation failure is recorded as
    ``failed``; a transient one (backend unreachable, no result within ``timeout_s``, by default
    the goal's :func:`gradlab.runs.timeouts.task_timeouts` ``evaluate_s``) is raised for the task
    to retry. The local copy is checked against the publication receipt before and after the
    evaluation, and every model-store object of the checkpoint is re-read and checked before the
    result is recorded: a difference records ``failed``, naming the object and both hashes.

    Raises:
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
    intent = EvaluationIntent.create(
        run_id=spec.run_id, checkpoint=publication.ref, goal_contract_sha256=spec.goal_contract_sha256,
        episode_manifest_sha256=manifest.sha256, backend=backend,
    )
    intent, existing = rules.register_evaluation(stores, intent)
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
        rules.verify_published(stores, publication)
    except (IntegrityError, ContractViolation, EvaluationFailed, NotFound) as e:
        # The checkpoint itself cannot be evaluated: a permanent result. A backend that cannot run
        # (no credentials, unreachable) is not recorded: the error goes up and a retry evaluates.
        log.error("run %s: evaluation of step %d failed: %s", spec.run_id, publication.step, e)
        record = rules.make_evaluation_record(intent, status="failed", error=f"{type(e).__name__}: {e}")
        return rules.record_evaluation(stores, record)
    finally:
        runner.close()
    status = "accepted" if validated.verdict == "accepted" else "rejected"
    record = rules.make_evaluation_record(
        intent, status=status, result=validated.as_json(),
        return_mean=validated.aggregates.get("eval/episode/return/mean"),
    )
    return rules.record_evaluation(stores, record)


def record_stop(stores: Stores, run_id: str, attempt_id: str, reason: str) -> None:
    """Record the run's stop request (the first request wins)."""
    from gradlab.receipts.models import StopRequest

    step = int(reason.split(":", 1)[1]) if reason.startswith("accepted:") else None
    rules.request_stop(stores, StopRequest(run_id=run_id, attempt_id=attempt_id, reason=reason,
                                           checkpoint_step=step, requested_at=utcnow()))


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
        rules.require_epoch(stores, run_id, attempt_id, epoch)
    rules.verify_published(stores, publication)  # the promoted objects are the published bytes
    promotion = Promotion(
        run_id=run_id, attempt_id=attempt_id, checkpoint_step=publication.step, checkpoint_sha256=publication.sha256,
        uri=publication.uri, evaluation_key=record.intent_key,
        result_uri=stores.eval.url(keys.evaluation_result(run_id, record.intent_key)),
        return_mean=record.return_mean, promoted_at=utcnow(),
    )
    return rules.write_promotion(stores, promotion)


def inventory(stores: Stores, run_id: str) -> tuple[list, list, Any]:
    """The run's checkpoint, evaluation and promotion inventories as the terminal receipt lists them.

    A published checkpoint that was never submitted for evaluation (evaluation off, above an
    accepted step, or abandoned by a cancel) is listed as ``deferred``, so every checkpoint has
    an evaluation entry.
    """
    from gradlab.receipts.models import TerminalEvaluation

    checkpoints, evaluations, promotion = rules.run_inventory(stores, run_id)
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
) -> TerminalReceipt:
    """Seal the attempt's terminal receipt from the store's inventories (create-only).

    The inventories (checkpoints, evaluations, promotion) are read back from the receipt store,
    so the receipt proves what the store holds, not what the flow believes. A local copy is kept
    in the run directory.
    """
    checkpoints, evaluations, promotion = inventory(stores, spec.run_id)
    receipt = TerminalReceipt(
        run_id=spec.run_id, attempt_id=attempt_id, goal_id=spec.goal_id, recipe_id=spec.recipe_id, seed=spec.seed,
        outcome=outcome, reason=reason, final_step=final_step, checkpoints=checkpoints, evaluations=evaluations,
        promotion=promotion, metrics=metrics, drained=drained, learner=learner, sealed_at=utcnow(),
    )
    stored = rules.seal_terminal(stores, receipt)
    if paths is not None:
        write_local_receipt(paths, stored)
    return stored


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
                            reason: str) -> TerminalReceipt | None:
    """Seal the run's open attempt after its flow ended without sealing it (Prefect's state hooks:
    a crash, a cancellation or a failure; docs/ARCHITECTURE.md section 8).

    The attempt is the lease holder's, closed only once its flow process is known to be gone
    (owner identity: boot id + pid + start time, :mod:`gradlab.receipts.owner`) or is this process,
    whose flow body has ended: its learner is stopped first, the receipt lists what that
    attempt did itself (:func:`gradlab.receipts.terminal.close_attempt`), and the lease is released
    so a retry may start at once. An attempt held from another host is left to the reconciler.

    Returns:
        The receipt sealed now, or None (nothing open, sealed already, or not ours to close).
    """
    from gradlab.receipts.lease import LeaseLost, read_lease, release_lease

    held = read_lease(stores.control, run_id)
    if held is None or held.lease.released:
        return None
    from gradlab.receipts.owner import current_owner

    me = current_owner()
    if (held.lease.owner_pid, held.lease.owner_start) != (me.pid, me.start) and held.lease.owner_state() != "dead":
        return None  # the flow process still runs (it seals by itself), or runs on another host
    attempt_id = held.lease.holder
    learner = LearnerExit(exit_code=None, stop_reason=None)
    final_step = None
    if paths is not None and paths.outbox.is_file():
        learner, final_step = _stop_orphaned_learner(paths, reason)
    receipt = rules.close_attempt(stores, run_id, attempt_id, outcome=outcome, reason=reason, final_step=final_step,
                                  learner=learner)
    if receipt is not None and paths is not None:
        write_local_receipt(paths, receipt)
    if rules.read_terminal(stores, run_id, attempt_id) is not None:
        try:
            release_lease(stores.control, held)
        except LeaseLost as e:
            log.info("run %s: lease of %s not released: %s", run_id, attempt_id, e)
    return receipt


def _stop_orphaned_learner(paths: RunPaths, reason: str) -> tuple[LearnerExit, int | None]:
    """Stop the learner a dead flow process left behind; (its exit, the last step it reported)."""
    from gradlab.learn.watch import pid_alive
    from gradlab.runs.process import LearnerProcess

    outbox = Outbox(paths.outbox)
    try:
        started = outbox.last("learner_started")
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
