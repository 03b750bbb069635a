"""The ``sweep`` flow: one cohort of seeds of one recipe, as N ordinary ``training-run`` flow runs
(docs/ARCHITECTURE.md section 12).

Locally the runs are child flow runs of the sweep in this process, as many at a time as the cores
allow (``max_parallel``); with ``deployment`` each is queued on that deployment's work pool through
``run_deployment`` (a child flow run the pool's workers execute). Every run has its own receipts;
when all have ended the sweep seals a create-only cohort receipt listing its runs and their
outcomes, and writes a cohort table artifact (key ``cohort-<cohort id>``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from flows._futures import task_finished
from flows._process import record_this_flow_run

log = logging.getLogger(__name__)

#: Most seeds one sweep trains at once in this process (the pool's threads; ``max_parallel`` limits further).
MAX_THREADS = 64


@task(name="train-seed", task_run_name="train-{recipe}-s{seed}", cache_policy=NO_CACHE, persist_result=False)
def train_seed(recipe: str, seed: int, overrides: list[str], run_id: str, cohort_id: str, wandb_mode: str | None,
               eval_backend: str, deployment: str | None) -> dict:
    """Train one seed: a child ``training-run`` flow run here, or queued on ``deployment``; waits for its end."""
    parameters = {"recipe": recipe, "seed": seed, "overrides": list(overrides), "run_id": run_id,
                  "cohort_id": cohort_id, "wandb_mode": wandb_mode, "eval_backend": eval_backend}
    if deployment:
        from prefect.deployments import run_deployment

        flow_run = run_deployment(name=deployment, parameters=parameters, timeout=None, as_subflow=True)
        return {"run_id": run_id, "seed": seed, "flow_run_id": str(flow_run.id),
                "state": flow_run.state.type.value if flow_run.state else None}
    from flows.training_run import training_run

    state = training_run(**parameters, return_state=True)
    return {"run_id": run_id, "seed": seed, "flow_run_id": str(state.state_details.flow_run_id),
            "state": state.type.value}


@task(name="seal-cohort", task_run_name="seal-cohort-{cohort_id}", cache_policy=NO_CACHE, persist_result=False)
def seal_cohort(cohort_id: str, recipe: str, overrides: list[str], seeds: list[int], launched: list[dict],
                deployment: str | None, created_at: Any, interrupted: str | None = None) -> dict:
    """Seal the cohort receipt (create-only) from the runs' terminal receipts in the store."""
    from gradlab.results.cohort_receipts import build_cohort_receipt
    from gradlab.stores import open_stores

    return build_cohort_receipt(open_stores(), cohort_id=cohort_id, recipe=recipe, overrides=overrides, seeds=seeds,
                          launched=launched, deployment=deployment, flow_run_id=_flow_run_id(),
                          created_at=created_at, interrupted=interrupted).model_dump(mode="json")


def _flow_run_id() -> str | None:
    from prefect.context import FlowRunContext, TaskRunContext

    task_ctx = TaskRunContext.get()
    if task_ctx is not None and task_ctx.task_run.flow_run_id:
        return str(task_ctx.task_run.flow_run_id)
    ctx = FlowRunContext.get()
    return str(ctx.flow_run.id) if ctx and ctx.flow_run else None


def _wait_for_room(futures: list, limit: int, cancelled) -> None:
    """Block until fewer than ``limit`` seeds run, or ``cancelled`` (an Event) is set."""
    while sum(not task_finished(f) for f in futures) >= limit and not cancelled.wait(0.5):
        pass


#: The cohort receipt's ``interrupted`` when Ctrl-C stopped a local sweep before every seed started.
INTERRUPTED_BY_USER = "interrupted by the user (Ctrl-C) before every seed started"


@flow(name="sweep", task_runner=ThreadPoolTaskRunner(max_workers=MAX_THREADS), persist_result=False, log_prints=False)
def sweep(
    recipe: str,
    seeds: int = 3,
    first_seed: int = 0,
    overrides: list[str] | None = None,
    deployment: str | None = None,
    wandb_mode: str | None = None,
    eval_backend: str = "local",
    max_parallel: int | None = None,
    cohort_id: str | None = None,
    run_ids: list[str] | None = None,
) -> dict:
    """Train ``seeds`` seeds of ``recipe`` (``first_seed``, ``first_seed + 1``, ...) and seal a cohort receipt.

    Args:
        recipe: ``GOAL/RECIPE``. overrides: ``dotted.key=value`` recipe overrides, the same for every seed.
        deployment: ``training-run/local`` (or another deployment of the training-run flow) to queue the
            runs on a work pool; None trains them in this process.
        max_parallel: seeds trained at once locally (default: the CPU count); queued runs are limited
            by the pool and its workers instead.
        cohort_id: the id a caller reserved (default: a new ``cohort-...`` id).
        run_ids: the run ids a caller reserved, one per seed (default: new ones).

    Returns:
        The cohort receipt as JSON.
    """
    from gradlab.contracts.run_spec import new_run_id
    from gradlab.receipts.models import utcnow
    from gradlab.results.cohort_receipts import new_cohort_id
    from gradlab.runs.driver import USER_CANCEL

    record_this_flow_run()  # the daemon tells a killed sweep process from a live one
    created_at = utcnow()
    cohort_id = cohort_id or new_cohort_id()
    seed_list = list(range(first_seed, first_seed + seeds))
    run_ids = list(run_ids or [new_run_id() for _ in seed_list])
    if len(run_ids) != len(seed_list):
        raise ValueError(f"run_ids: expected {len(seed_list)} ids (one per seed), found {len(run_ids)}")
    limit = len(seed_list) if deployment else max(1, max_parallel or os.cpu_count() or 1)
    futures = []
    for seed, run_id in zip(seed_list, run_ids, strict=True):
        _wait_for_room(futures, limit, USER_CANCEL)
        if USER_CANCEL.is_set():  # Ctrl-C: the running seeds seal `cancelled`; the rest never start
            break
        futures.append(train_seed.submit(recipe, seed, list(overrides or []), run_id, cohort_id, wandb_mode,
                                         eval_backend, deployment))
    launched = []
    for seed, run_id, future in zip(seed_list, run_ids, futures, strict=False):
        try:
            launched.append(future.result())
        except Exception as e:  # noqa: BLE001 - one seed's failure is recorded in the cohort, not raised
            log.error("seed %d (%s) of %s: %s", seed, run_id, cohort_id, e)
            launched.append({"run_id": run_id, "seed": seed, "flow_run_id": None, "state": "FAILED"})
    interrupted = None
    if len(futures) < len(seed_list):  # listed, never started: no receipt, no score, named in the cohort
        interrupted = INTERRUPTED_BY_USER
        launched += [{"run_id": run_id, "seed": seed, "flow_run_id": None, "state": None}
                     for seed, run_id in list(zip(seed_list, run_ids, strict=True))[len(futures):]]
    receipt = seal_cohort(cohort_id, recipe, list(overrides or []), seed_list, launched, deployment, created_at,
                          interrupted)
    _cohort_artifact(receipt)
    return receipt


def _cohort_artifact(receipt: dict) -> None:
    from prefect.artifacts import create_table_artifact

    from gradlab.results.cohort_receipts import CohortReceipt, cohort_table
    from gradlab.stores import open_stores

    try:
        create_table_artifact(cohort_table(open_stores(), CohortReceipt.model_validate(receipt)), key=receipt["cohort_id"].lower(),
                              description=f"{receipt['goal_id']}/{receipt['recipe_id']}: cohort {receipt['cohort_id']}")
    except Exception as e:  # noqa: BLE001 - a view only
        log.warning("cannot write the cohort artifact of %s: %s", receipt["cohort_id"], e)
