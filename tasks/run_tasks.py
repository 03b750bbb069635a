"""The training run's tasks: each wraps one domain call from a phase of ``gradlab.runs.operations``
(opening, publishing, evaluating, promoting, sealing).

Timeouts: the flow sets every task's ``timeout_seconds`` from the goal with ``with_options``
(:func:`gradlab.runs.timeouts.task_timeouts`); a timed-out task raises ``TimeoutError``, which the
retry policy treats as transient.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from gradlab.contracts.run_spec import RunSpec
from gradlab.receipts.models import CheckpointPublication, EvaluationRecord, Promotion, TerminalReceipt
from gradlab.runs.operations import evaluating, opening, promoting, publishing, sealing
from gradlab.runs.operations.opening import AttemptPlan
from gradlab.runs.paths import RunPaths
from gradlab.runs.process import LearnerProcess
from gradlab.stores import Stores
from tasks._policy import RETRIES, RETRY_DELAYS_S, retry_transient

_COMMON = dict(cache_policy=NO_CACHE, retries=RETRIES, retry_delay_seconds=RETRY_DELAYS_S,
               retry_condition_fn=retry_transient, persist_result=False)


@task(name="open-run", task_run_name="open-run-{spec.run_id}", **_COMMON)
def open_run(stores: Stores, spec: RunSpec, paths: RunPaths, flow_run_id: str | None = None) -> AttemptPlan:
    """Open the run and its next attempt under the writer lease (refused: nothing written)."""
    return opening.open_attempt(stores, spec, paths, flow_run_id=flow_run_id)


@task(name="start-learner", task_run_name="start-learner-{run_id}", cache_policy=NO_CACHE, persist_result=False)
def start_learner(run_id: str, paths: RunPaths, resume_from: Path | None, zygote: Path | None = None) -> LearnerProcess:
    """Start the learner in its own process group (forked by a warm zygote when one is ready); its
    first step waits for the driver's loop (``--await-supervisor``)."""
    return LearnerProcess.start(paths, resume_from=resume_from, zygote=zygote, await_supervisor=True)


@task(name="publish-checkpoint", task_run_name="publish-{run_id}-step{step}", **_COMMON)
def publish_checkpoint(stores: Stores, run_id: str, attempt_id: str, step: int, checkpoint_dir: Path,
                       epoch: int | None = None) -> CheckpointPublication:
    """Copy a checkpoint to the model store, verify it, write its receipt, update the index."""
    return publishing.publish(stores, run_id, attempt_id, checkpoint_dir, epoch=epoch)


@task(name="evaluate-checkpoint", task_run_name="evaluate-{run_id}-step{step}", **_COMMON)
def evaluate_checkpoint(stores: Stores, spec: RunSpec, run_id: str, step: int, publication: CheckpointPublication,
                        checkpoint_dir: Path, backend: str, timeout_s: float | None = None,
                        fence: tuple[str, int] | None = None) -> EvaluationRecord:
    """Evaluate a published checkpoint once (keyed by content) and record the result for ``fence``
    (attempt, epoch); the backend gets ``timeout_s`` (the task's own ``timeout_seconds`` is set a
    little above it, as a backstop)."""
    return evaluating.evaluate(stores, spec, publication, checkpoint_dir, backend=backend, timeout_s=timeout_s,
                               fence=fence)


@task(name="request-stop", task_run_name="request-stop-{run_id}", **_COMMON)
def request_stop(stores: Stores, run_id: str, attempt_id: str, reason: str, epoch: int | None = None) -> None:
    """Record the run's stop request in the receipt store (the outbox has it already)."""
    evaluating.record_stop(stores, run_id, attempt_id, reason, epoch=epoch)


@task(name="promote", task_run_name="promote-{run_id}-step{step}", **_COMMON)
def promote(stores: Stores, run_id: str, attempt_id: str, step: int, record: EvaluationRecord,
            publication: CheckpointPublication, epoch: int | None = None) -> Promotion:
    """Promote the lowest-step accepted checkpoint (create-only; exactly once per run)."""
    return promoting.promote(stores, run_id, attempt_id, record, publication, epoch=epoch)


@task(name="seal-receipt", task_run_name="seal-receipt-{run_id}", **_COMMON)
def seal_receipt(stores: Stores, spec: RunSpec, run_id: str, attempt_id: str, fields: dict, paths: RunPaths,
                 epoch: int | None = None) -> TerminalReceipt:
    """Seal the attempt's terminal receipt from the store's inventories (refused once superseded)."""
    return sealing.seal(stores, spec, attempt_id, paths=paths, epoch=epoch, **fields)
