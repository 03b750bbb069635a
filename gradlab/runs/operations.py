"""The run's domain steps, one function each; ``tasks/`` wraps every one in a Prefect task.

Each step is idempotent against the receipt store: a retry finds what an earlier try wrote and
agrees with it, so a transient failure (``StoreUnavailable``) is always safe to retry.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradlab.contracts.hashing import sha256_json
from gradlab.contracts.run_spec import InitFrom, RunSpec
from gradlab.errors import ContractViolation, NotFound
from gradlab.outbox import Outbox
from gradlab.receipts import rules
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
from gradlab.stores import Stores

log = logging.getLogger(__name__)

#: Longest one evaluation may run before it is cancelled and retried (a transient failure), seconds.
EVAL_TIMEOUT_S = 3600.0


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
    tmp = paths.spec.with_suffix(".json.partial")
    tmp.write_text(body)
    tmp.replace(paths.spec)


def outbox_high_water(paths: RunPaths, sink: str) -> int:
    """The outbox's acknowledged event_seq for ``sink`` (0 before any delivery)."""
    from gradlab.outbox import Outbox

    return Outbox(paths.outbox).high_water(sink)


def _run_exists(stores: Stores, run_id: str) -> bool:
    try:
        rules.read_run(stores, run_id)
    except NotFound:
        return False
    return True


@dataclass(frozen=True)
class AttemptPlan:
    """What this attempt does: start fresh, resume from a published checkpoint, or only drain."""

    attempt: Attempt
    lease: HeldLease
    resume_dir: Path | None
    publications: tuple[CheckpointPublication, ...] = ()
    records: tuple[EvaluationRecord, ...] = ()
    #: Outbox events before this seq belong to an abandoned learner lineage (a resumed attempt
    #: continues from the last *published* checkpoint): their checkpoints are never published.
    first_seq: int = 0


def open_attempt(stores: Stores, spec: RunSpec, paths: RunPaths) -> AttemptPlan:
    """Open the run (create-or-agree) and begin its next attempt under the writer lease.

    Mode: ``fresh`` for a run's first attempt; ``drain`` when an earlier attempt's learner had
    already finished (its outbox holds ``learner_finished``); otherwise ``resume`` from the last
    published checkpoint, downloaded (verified) into the run directory when missing locally.

    Raises:
        LeaseHeld: another attempt's lease is live (a retry is refused while it is).
    """
    rules.open_run(stores, spec)
    previous = rules.list_attempts(stores, spec.run_id)
    mode: AttemptMode = "fresh"
    resume: CheckpointRef | None = None
    resume_dir: Path | None = None
    publications: tuple[CheckpointPublication, ...] = ()
    records: tuple[EvaluationRecord, ...] = ()
    outbox = Outbox(paths.outbox)
    if previous:
        publications = tuple(rules.list_publications(stores, spec.run_id))
        records = tuple(rec for _, rec in rules.list_evaluations(stores, spec.run_id) if rec)
        accepted = any(r.status == "accepted" for r in records) and spec.goal.stops_on_acceptance
        if accepted or _learner_done(outbox):
            mode = "drain"
        elif publications:
            mode = "resume"
            resume = publications[-1].ref
    attempt, held = rules.begin_attempt(stores, spec.run_id, mode=mode, resume_from=resume)
    # Only the lease holder may touch the run's control state: clear a stale stop request now.
    if mode == "resume":
        outbox.clear_stop()
        resume_dir = local_checkpoint_dir(stores, paths, publications[-1])
    return AttemptPlan(attempt=attempt, lease=held, resume_dir=resume_dir, publications=publications, records=records,
                       first_seq=outbox.max_seq() + 1 if mode == "resume" else 0)



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
    """The published checkpoint's folder in the run directory, verified; downloaded (verified) when
    absent, and again when the local copy fails verification (the bad copy is kept aside)."""
    from gradlab.checkpoints import verify_checkpoint
    from gradlab.errors import IntegrityError
    from gradlab.stores import keys

    dest = paths.checkpoints / keys.checkpoint_name(publication.step, publication.sha256)
    if dest.is_dir():
        try:
            manifest = verify_checkpoint(dest)
            if manifest.sha256 == publication.sha256:
                return dest
            raise IntegrityError(f"{dest}: sha256 {manifest.sha256}, the publication says {publication.sha256}")
        except (IntegrityError, ContractViolation, NotFound) as e:
            aside = dest.with_name(f"{dest.name}.corrupt-{int(time.time())}")
            log.warning("%s fails verification (%s): kept as %s; using the published copy", dest, e, aside.name)
            dest.rename(aside)
    rules.download_checkpoint(stores, publication, dest)
    return dest


def prewarm_evaluation(backend: str, count: int = 1) -> None:
    """Start ``count`` warm evaluation processes now, while the learner trains (local backend only)."""
    if backend == "local":
        from gradlab.evaluation.backends import prewarm

        prewarm(count)


def publish(stores: Stores, run_id: str, attempt_id: str, checkpoint_dir: Path) -> CheckpointPublication:
    """Publish one checkpoint (copy, verify, receipt, index). See ``rules.publish_checkpoint``."""
    return rules.publish_checkpoint(stores, run_id=run_id, attempt_id=attempt_id, checkpoint_dir=checkpoint_dir)


def evaluate(
    stores: Stores, spec: RunSpec, publication: CheckpointPublication, checkpoint_dir: Path, *, backend: str = "local"
) -> EvaluationRecord:
    """Evaluate a published checkpoint once, keyed by content; record and return the result.

    A result already recorded for the same (run, checkpoint, goal, manifest) is returned as it is:
    a retried task never evaluates twice. A permanent evaluation failure is recorded as
    ``failed``; a transient one (backend unreachable) is raised for the task to retry.

    Raises:
        TransientError: the backend or a store is unavailable.
    """
    from gradlab.errors import IntegrityError
    from gradlab.evaluation import EvalRequest, build_manifest, validate_result
    from gradlab.evaluation.backends import EvaluationFailed, evaluate_with, get_backend

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
        result = evaluate_with(runner, request, timeout_s=EVAL_TIMEOUT_S)
        expected = {"checkpoint_sha256": publication.sha256, "episode_manifest_sha256": manifest.sha256, **spec.hashes}
        validated = validate_result(result, expected=expected, goal=spec.goal)
    except (IntegrityError, ContractViolation, EvaluationFailed) as e:
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
            publication: CheckpointPublication) -> Promotion:
    """Promote the checkpoint of an accepted evaluation (create-only; exactly one per run).

    Raises:
        ContractViolation: the evaluation is not accepted or is of another checkpoint.
        Conflict: the run already promoted a different checkpoint.
    """
    from gradlab.stores import keys

    if record.status != "accepted" or record.checkpoint_sha256 != publication.sha256:
        raise ContractViolation(f"run {run_id}: only an accepted evaluation of the same checkpoint can be promoted")
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
        target = paths.attempt_receipt(attempt_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(stored.model_dump_json(indent=1))
    return stored


def wait_for(predicate, timeout_s: float, interval_s: float = 0.1) -> bool:
    """Poll ``predicate`` until true or ``timeout_s`` seconds pass."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())
