"""The ``training-run`` flow: one attempt of one training run, supervised end to end.

The flow body only composes: resolve the spec, open the attempt (task), start or attach the
learner (task), then hand the domain driver (:class:`gradlab.runs.driver.AttemptDriver`) the
tasks it submits. docs/ARCHITECTURE.md section 8 has the phases; ``gradlab/runs/driver.py`` orders them.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from typing import Any

from prefect import flow, tags
from prefect.states import Cancelled, Failed
from prefect.task_runners import ThreadPoolTaskRunner

from flows._futures import task_finished
from flows._process import record_this_flow_run
from flows.run_artifacts import RunArtifacts
from gradlab.runs.supervisor import CheckpointTrack
from gradlab.runs.timeouts import check_run_environment, folder_bytes, task_timeouts
from tasks import run_tasks

log = logging.getLogger(__name__)


class _Done:
    """A Prefect future seen through the ``done()/result()`` protocol the supervisor uses; ``done()`` is
    :func:`flows._futures.task_finished` (the task runner's own future, not the API's state)."""

    def __init__(self, future: Any):
        self.future = future

    def done(self) -> bool:
        return task_finished(self.future)

    def result(self) -> Any:
        return self.future.result(raise_on_failure=True)

    def add_done_callback(self, fn: Any) -> None:
        """Call ``fn(self)`` in the task runner's thread once the task has ended (at once if it has):
        the driver's loop wakes for it instead of seeing it at its next tick. Futures without a
        task runner's future behind them are seen at the next tick."""
        wrapped = getattr(self.future, "wrapped_future", None)
        if wrapped is not None and callable(getattr(wrapped, "add_done_callback", None)):
            wrapped.add_done_callback(lambda _: fn(self))


#: Seconds the evaluation task's own timeout is above the backend's deadline (which cancels the
#: backend's job cleanly first; the task timeout only catches a backend that ignores it).
_BACKSTOP_S = 30.0


def _largest_publication_bytes(stores: Any, run_id: str) -> int:
    """Bytes of the run's largest published checkpoint (what opening a resumed attempt may download)."""
    from gradlab.receipts import list_publications

    try:
        return max((sum(f.size_bytes for f in p.files.values()) for p in list_publications(stores, run_id)),
                   default=0)
    except Exception:  # noqa: BLE001 - a new run, or a store to be retried by open-run itself
        return 0


class _ThreadTimeoutNotice(logging.Filter):
    """Drops Prefect's per-task notice that a timeout in a worker thread cannot interrupt blocking
    calls: our submitted tasks poll (evaluation, every 0.2 s, under the backend's own deadline) or do
    short store calls, so the timeout takes effect within one call; the notice would repeat for
    every checkpoint."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is running in a worker thread" not in str(record.msg)


logging.getLogger("prefect.task_runs").addFilter(_ThreadTimeoutNotice())


class _DomainErrorTraceback(logging.Filter):
    """Keeps Prefect's one-line notice of a task that raised one of our own errors (a store that
    is down, a checkpoint that fails verification: ``gradlab.errors.GradlabError``) and drops its
    traceback: the error names the file, key or store, the supervisor records it and the receipt
    names it, while a traceback for every retry of every checkpoint buried the progress display."""

    def filter(self, record: logging.LogRecord) -> bool:
        from gradlab.errors import GradlabError

        if record.exc_info and isinstance(record.exc_info[1], GradlabError):
            record.exc_info, record.exc_text = None, None
        return True


logging.getLogger("prefect.task_runs").addFilter(_DomainErrorTraceback())


class _ReportedOutcome(logging.Filter):
    """Drops the engine's "exited with unexpected exception" traceback when the exception is our
    :class:`RunNotSucceeded`: under a worker the engine re-raises a Failed state's data at the end
    of every failed flow run, but a rejected or cancelled run is a reported outcome (the state
    message and the receipt say why), not an engine error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], RunNotSucceeded))


logging.getLogger("prefect.flow_runs").addFilter(_ReportedOutcome())

#: A gradlab run id (``gradlab.contracts.run_spec.new_run_id``) used as a flow-run tag.
_RUN_ID_TAG = re.compile(r"^gradlab-\d{8}T\d{6}-[0-9a-f]{8}$")


def _tagged_run_id() -> str | None:
    """The gradlab run id an earlier try of this flow run tagged it with (a retry from the Prefect UI
    reruns the same flow run with the same parameters: it must continue the same gradlab run)."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return None
    return next((t for t in ctx.flow_run.tags if _RUN_ID_TAG.match(t)), None)


def _flow_run_id() -> str | None:
    """This flow run's id (recorded in the attempt: its state hooks close only that attempt)."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return str(ctx.flow_run.id) if ctx is not None and ctx.flow_run is not None else None


def _run_tags(run_id: str) -> list[str]:
    """This flow run's tags, plus ``run_id`` itself (added to the flow run when missing).

    The tasks run under these tags: a deployment's tags (``gpu``) reach only the flow run, and a
    tag concurrency limit counts task runs. The run-id tag lets ``gradlab experiment`` find the
    flow runs of a gradlab run queued without a ``run_id`` parameter (``prefect deployment run``).
    """
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return []
    run_tags = list(ctx.flow_run.tags)
    if run_id not in run_tags:
        run_tags.append(run_id)
        try:
            with get_client(sync_client=True) as client:
                client.update_flow_run(ctx.flow_run.id, tags=run_tags)
        except Exception as e:  # noqa: BLE001 - a label only: the run goes on without it
            log.warning("cannot tag flow run %s with %s: %s", ctx.flow_run.id, run_id, e)
    return run_tags


def _cancel_probe() -> Any:
    """A callable that says whether this flow run is being cancelled (Prefect state CANCELLING)."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return lambda: False
    flow_run_id = ctx.flow_run.id

    def cancelling() -> bool:
        try:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(flow_run_id).state
        except Exception as e:  # noqa: BLE001 - the API may be briefly unreachable; try again later
            log.debug("cannot read flow run state: %s", e)
            return False
        if state is None or not (state.is_cancelling() or state.is_cancelled()):
            return False
        if os.environ.get("PREFECT__FLOW_RUN_ID") and threading.current_thread() is threading.main_thread():
            # Started by a worker, which SIGTERMs this process too once it sees CANCELLING: the driver
            # is now stopping the learner and sealing `cancelled`, and a TerminationSignal raised in
            # the middle of that would leave the attempt unsealed. The worker SIGKILLs after 30 s.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return True

    return cancelling


class RunNotSucceeded(Exception):  # noqa: N818 - named for what it says, as Prefect's FailedRun
    """The data of a Failed or Cancelled training-run state: the receipt's outcome and reason as the
    message (an exception, which Prefect resolves a failed state into), the receipt itself as
    ``receipt``. The receipt in the store stays the authority."""

    def __init__(self, receipt: dict[str, Any]):
        super().__init__(f"{receipt['outcome']}: {receipt['reason']}")
        self.receipt = receipt


def _hook_run_id(flow_run: Any) -> str | None:
    """The gradlab run id of a flow run seen by a state hook (its parameter, else its tag)."""
    run_id = (flow_run.parameters or {}).get("run_id")
    if run_id:
        return str(run_id)
    tagged = next((t for t in flow_run.tags or [] if _RUN_ID_TAG.match(t)), None)
    if tagged is None:  # tagged after the hook's copy was read
        from prefect.client.orchestration import get_client

        try:
            with get_client(sync_client=True) as client:
                tagged = next((t for t in client.read_flow_run(flow_run.id).tags if _RUN_ID_TAG.match(t)), None)
        except Exception as e:  # noqa: BLE001 - best effort: the reconciler closes the attempt later
            log.warning("state hook: cannot read flow run %s: %s", flow_run.id, e)
    return tagged


def _sealing_hook(outcome: str, what: str) -> Any:
    """A state hook that seals the attempt its flow run left open (docs/ARCHITECTURE.md section 8):
    only its own, by attempt id and epoch, while it still holds the lease (section 9).

    Under a worker Prefect runs ``on_crashed`` / ``on_cancellation`` in a separate process after
    the flow process is gone; ``on_failure`` runs in the flow process once the flow body has
    raised. Hooks are best effort: the reconciler at the next attempt's open is the guarantee.
    """

    def hook(flow: Any, flow_run: Any, state: Any) -> None:  # noqa: ARG001 - Prefect's hook signature
        from gradlab.runs import operations
        from gradlab.runs.paths import RunPaths
        from gradlab.settings import load_settings
        from gradlab.stores import open_stores

        run_id = _hook_run_id(flow_run)
        if run_id is None:
            return
        try:
            settings = load_settings()
            paths = RunPaths(settings.run_dir(run_id))
            message = state.message or state.name
            # The receipt shows "<outcome>: <reason>": no "cancelled: cancelled: ...".
            said = what == outcome or message.lower().startswith(f"{what}:")
            reason = message if said else f"{what}: {message}"
            receipt = operations.close_abandoned_attempt(open_stores(settings), paths if paths.root.is_dir() else None,
                                                         run_id, outcome=outcome, reason=reason,
                                                         flow_run_id=str(flow_run.id))
        except Exception as e:  # noqa: BLE001 - a hook must not fail the engine; the reconciler is the guarantee
            log.warning("run %s: %s hook could not seal the attempt: %s", run_id, what, e)
            return
        if receipt is not None:
            log.warning("run %s: %s sealed %s by the %s hook: %s", run_id, receipt.attempt_id, receipt.outcome, what,
                        receipt.reason)

    hook.__name__ = f"seal_{what.replace(' ', '_')}"
    return hook


@flow(name="training-run", task_runner=ThreadPoolTaskRunner(max_workers=4), persist_result=False,
      log_prints=False, on_crashed=[_sealing_hook("failed", "crashed")],
      on_cancellation=[_sealing_hook("cancelled", "cancelled")],
      on_failure=[_sealing_hook("failed", "flow failed")])
def training_run(
    recipe: str | None = None,
    seed: int = 0,
    overrides: list[str] | None = None,
    wandb_mode: str | None = None,
    eval_backend: str = "local",
    evaluate: bool = True,
    run_id: str | None = None,
    learner_pid: int | None = None,
    cohort_id: str | None = None,
) -> Any:
    """Train ``recipe`` (GOAL/RECIPE) with ``seed``, or retry the existing run ``run_id``.

    Args:
        recipe: ``GOAL/RECIPE`` under ``experiments/goals``.
        seed: the run seed (lane seeds derive from it).
        overrides: ``dotted.key=value`` recipe overrides (as ``--set``).
        wandb_mode: ``disabled`` | ``offline`` | ``online``; default: the recipe's ``logging.wandb_mode``.
        eval_backend: ``local`` (process pool) or ``modal``.
        evaluate: False skips evaluation (nothing can be promoted then); a new run only (a retry
            keeps the run's own choice).
        run_id: an existing run to retry (a new attempt), or the id a caller reserved for a new run.
        learner_pid: a learner the caller already started for this run (``gradlab train`` does,
            so training overlaps Prefect's start-up).
        cohort_id: the ``sweep`` cohort this run belongs to (a W&B tag; the W&B group of every run is
            its leaders' cohort key, :func:`gradlab.results.cohorts.cohort_group`).

    Returns:
        The terminal receipt as JSON (docs/ARCHITECTURE.md section 8) when it says ``succeeded``;
        otherwise a Cancelled or Failed state whose data is a :class:`RunNotSucceeded` carrying it.
        The run succeeded only if the receipt says so.
    """
    from gradlab.runs import operations
    from gradlab.runs.driver import AttemptDriver
    from gradlab.runs.process import LearnerProcess
    from gradlab.runs.server import warm_learner_dir
    from gradlab.settings import load_settings, secure_home
    from gradlab.stores import open_stores

    settings = load_settings()
    check_run_environment()  # a bad lease TTL or stop wait fails the flow before an attempt is opened
    from gradlab.contracts.seeds import MAX_RUN_SEED
    from gradlab.errors import ConfigError

    if not 0 <= seed <= MAX_RUN_SEED:  # the command line's wording, not a validation dump from the run spec
        raise ConfigError(f"seed: expected 0..{MAX_RUN_SEED}, found {seed}")
    secure_home(settings)  # a deployment's worker writes private files too
    record_this_flow_run(settings)  # the daemon tells a killed flow process from a live one
    stores = open_stores(settings)
    run_id = run_id or _tagged_run_id()
    spec, paths = operations.prepare_spec(settings, recipe=recipe, seed=seed, overrides=overrides,
                                          run_id=run_id, stores=stores, evaluate=evaluate)
    # Every task's timeout derives from the goal (docs/ARCHITECTURE.md section 8): none can hang the run.
    limits = task_timeouts(spec, resume_bytes=_largest_publication_bytes(stores, spec.run_id))
    with tags(*_run_tags(spec.run_id)):
        attached = LearnerProcess.attach(learner_pid, paths) if learner_pid else None
        try:
            plan = run_tasks.open_run.with_options(timeout_seconds=limits.open_run_s)(stores, spec, paths,
                                                                                     _flow_run_id())
        except BaseException:
            if attached is not None:
                attached.stop("the attempt could not be opened", grace_s=4.0)
            raise
        if plan.attempt.mode == "drain":
            learner = None
        elif attached is not None:
            learner = attached
        else:
            learner = run_tasks.start_learner.with_options(timeout_seconds=limits.start_learner_s)(
                spec.run_id, paths, plan.resume_dir, warm_learner_dir(settings))
        if spec.evaluate and spec.goal.evaluation_mode == "evaluated":
            operations.prewarm_evaluation(eval_backend)
        mode = operations.wandb_mode(settings, spec, wandb_mode)
        from gradlab.results.cohorts import cohort_group

        wandb = operations.wandb_sink(settings, spec, paths, mode, group=cohort_group(spec.goal_id, spec.recipe_id,
                                                                                      spec.overrides),
                                      tags=[cohort_id] if cohort_id else None)
        attempt_id, epoch = plan.fence
        evaluate_task = run_tasks.evaluate_checkpoint.with_options(timeout_seconds=limits.evaluate_s + _BACKSTOP_S)
        request_stop = run_tasks.request_stop.with_options(timeout_seconds=limits.request_stop_s)
        promote = run_tasks.promote.with_options(timeout_seconds=limits.promote_s)
        seal = run_tasks.seal_receipt.with_options(timeout_seconds=limits.seal_s)

        def publish(track: CheckpointTrack) -> _Done:
            publish_task = run_tasks.publish_checkpoint.with_options(
                timeout_seconds=limits.publish_s(folder_bytes(track.path)))
            return _Done(publish_task.submit(stores, spec.run_id, attempt_id, track.step, track.path, epoch))

        def evaluate_track(track: CheckpointTrack) -> _Done:
            directory = operations.local_checkpoint_dir(stores, paths, track.publication)
            return _Done(evaluate_task.submit(stores, spec, spec.run_id, track.step, track.publication, directory,
                                              eval_backend, limits.evaluate_s, plan.fence))

        driver = AttemptDriver(
            spec=spec, paths=paths, stores=stores, plan=plan, learner=learner,
            submit_publish=publish, submit_evaluate=evaluate_track,
            record_stop=lambda reason: request_stop(stores, spec.run_id, attempt_id, reason, epoch),
            promote=lambda t: promote(stores, spec.run_id, attempt_id, t.step, t.evaluation, t.publication, epoch),
            seal=lambda fields: seal(stores, spec, spec.run_id, attempt_id, fields, paths, epoch),
            evaluate=spec.evaluate, wandb=wandb, cancel_requested=_cancel_probe(),
            max_parallel_evals=max(1, (os.cpu_count() or 2) - 1),
        )
        started = time.monotonic()
        with RunArtifacts(spec, paths, stores) as artifacts:  # progress, evaluations, receipt in the Prefect UI
            receipt = driver.run()
            artifacts.finish(receipt.model_dump(mode="json"))
        log.info("run %s attempt %s: %s after %.1f s (%s)", spec.run_id, attempt_id, receipt.outcome,
                 time.monotonic() - started, receipt.reason)
        data = receipt.model_dump(mode="json")
        # The Prefect state mirrors the receipt (the receipt stays the authority): the UI shows a
        # cancelled or failed run as such instead of "Completed". Its data is an exception carrying
        # the receipt, which Prefect can raise (a plain dict it cannot, and logs a TypeError).
        if receipt.outcome == "cancelled":
            return Cancelled(message=receipt.reason, data=RunNotSucceeded(data))
        if receipt.outcome != "succeeded":
            return Failed(message=f"{receipt.outcome}: {receipt.reason}", data=RunNotSucceeded(data))
        return data
