"""The cohort receipt: what a ``sweep`` flow run trained, sealed create-only under
``cohorts/<cohort_id>.json`` in the control store, with each run's outcome and how its seed was
scored (:data:`gradlab.results.cohorts.SCORING_RULE`; docs/ARCHITECTURE.md section 12)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime

from pydantic import AwareDatetime, Field

from gradlab.contracts.base import Contract
from gradlab.errors import ContractViolation, NotFound
from gradlab.results.cohorts import NOT_SCORED, SCORING_RULE, goal_objective, seed_result, split_recipe_ref

COHORTS_PREFIX = "cohorts/"


# -- the cohort receipt --------------------------------------------------------------------------
class CohortRun(Contract):
    run_id: str
    seed: int = Field(ge=0)
    outcome: str | None = Field(description="The run's terminal outcome; None when no receipt was sealed.")
    flow_run_id: str | None = None
    scored_by: str | None = Field(default=None, description="promoted | best evaluated | training | not scored (SCORING_RULE).")


class CohortReceipt(Contract):
    """What a ``sweep`` flow run trained: its runs and their outcomes (create-only)."""

    cohort_id: str = Field(description="``cohort-<utc yyyymmddThhmmss>-<8 hex>``; also a W&B tag of its runs.")
    goal_id: str
    recipe_id: str
    overrides: list[str] = Field(default_factory=list)
    seeds: list[int]
    runs: list[CohortRun]
    deployment: str | None = Field(default=None, description="Deployment the runs were queued on; None: local.")
    flow_run_id: str | None = Field(default=None, description="The sweep's Prefect flow run.")
    scoring_rule: str | None = Field(default=None, description="How each seed is scored (SCORING_RULE).")
    interrupted: str | None = Field(default=None, description="Why some seeds never started (their runs are listed "
                                    "with no outcome and no flow run); None: every seed was started.")
    created_at: AwareDatetime
    sealed_at: AwareDatetime


def new_cohort_id(now: datetime | None = None) -> str:
    """``cohort-<utc yyyymmddThhmmss>-<8 hex>``."""
    now = now or datetime.now(UTC)
    return f"cohort-{now.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"


def cohort_key(cohort_id: str) -> str:
    if not cohort_id or "/" in cohort_id or cohort_id.startswith("."):
        raise ContractViolation(f"cohort id {cohort_id!r}: expected a name without '/' or a leading '.'")
    return f"{COHORTS_PREFIX}{cohort_id}.json"


def seal_cohort(stores, receipt: CohortReceipt) -> CohortReceipt:
    """Write the cohort receipt create-only (a retry with the same content agrees).

    Raises:
        Conflict: a different receipt already exists under this cohort id.
    """
    from gradlab.receipts.io import create_or_agree

    return create_or_agree(stores.control, cohort_key(receipt.cohort_id), receipt,
                           agree=lambda old, new: old == new, what="cohort receipt")


def read_cohort(stores, cohort_id: str) -> CohortReceipt:
    """Raises NotFound: no such cohort."""
    from gradlab.receipts.io import read_model

    return read_model(stores.control, cohort_key(cohort_id), CohortReceipt)


def list_cohorts(stores) -> list[CohortReceipt]:
    """Every sealed cohort receipt, oldest first."""
    from gradlab.receipts.io import read_model

    return [read_model(stores.control, k, CohortReceipt) for k in stores.control.list(COHORTS_PREFIX)
            if k.endswith(".json") and k.count("/") == 1]


def build_cohort_receipt(stores, *, cohort_id: str, recipe: str, overrides: Sequence[str], seeds: Sequence[int],
                         launched: Sequence[dict], deployment: str | None, flow_run_id: str | None,
                         created_at: datetime, interrupted: str | None = None) -> CohortReceipt:
    """Seal the cohort receipt of a sweep from its runs' latest terminal receipts (create-only).

    Args:
        launched: one ``{"run_id", "seed", "flow_run_id"}`` per seed, as the sweep started them
            (``flow_run_id`` None for a seed that never started).
        interrupted: why some seeds never started (the receipt's ``interrupted``), or None.
    """
    from gradlab.receipts import list_attempts, read_terminal
    from gradlab.receipts.models import utcnow

    goal_id, recipe_id = split_recipe_ref(recipe)
    runs = []
    for item in launched:
        outcome = None
        try:
            attempts = list_attempts(stores, item["run_id"])
            # The run's outcome is its latest attempt's: an earlier attempt's (superseded, crashed)
            # is not the run's while a later one has not sealed.
            receipt = read_terminal(stores, item["run_id"], attempts[-1].attempt_id) if attempts else None
            outcome = receipt.outcome if receipt is not None else None
        except NotFound:
            pass
        try:
            result = seed_result(stores, item["run_id"])
        except NotFound:
            result = None
        runs.append(CohortRun(run_id=item["run_id"], seed=int(item["seed"]), outcome=outcome,
                              flow_run_id=item.get("flow_run_id"),
                              scored_by=result.scored_by if result is not None else NOT_SCORED))
    receipt = CohortReceipt(cohort_id=cohort_id, goal_id=goal_id, recipe_id=recipe_id, overrides=list(overrides),
                            seeds=list(seeds), runs=runs, deployment=deployment, flow_run_id=flow_run_id,
                            scoring_rule=SCORING_RULE, interrupted=interrupted,
                            created_at=created_at, sealed_at=utcnow())
    return seal_cohort(stores, receipt)


def cohort_table(stores, receipt: CohortReceipt) -> list[dict]:
    """One row per run of a cohort receipt: seed, run id, outcome, promoted step, objective score."""
    rows = []
    objective = goal_objective(receipt.goal_id)
    for run in receipt.runs:
        try:
            result = seed_result(stores, run.run_id, objective=objective)
        except NotFound:
            result = None
        rows.append({"seed": run.seed, "run_id": run.run_id, "outcome": run.outcome,
                     "promoted_step": result.steps_to_acceptance if result else None,
                     objective[0]: result.score if result else None,
                     "scored_by": result.scored_by if result else NOT_SCORED})
    return rows
