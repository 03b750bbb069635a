"""Preparing a run: resolve its spec (or read an existing run's), keep it in the run directory,
and build the metrics sinks that read the learner's outbox (W&B)."""

from __future__ import annotations

import json
import logging
from typing import Any

from gradlab.contracts.hashing import sha256_json
from gradlab.contracts.run_spec import InitFrom, RunSpec
from gradlab.errors import ContractViolation, NotFound
from gradlab.receipts.runs import read_run, read_run_spec
from gradlab.runs.paths import RunPaths
from gradlab.settings import Settings
from gradlab.stores import Stores

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
        spec = RunSpec.model_validate(read_run_spec(stores, run_id))
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


def wandb_mode(settings: Settings, spec: RunSpec, requested: str | None = None) -> str:
    """The run's W&B mode: ``requested`` (``--wandb``, the flow's ``wandb_mode``), else the machine's
    (``GRADLAB_WANDB_MODE`` / config), else the recipe's ``logging.wandb_mode``."""
    return requested or settings.wandb_mode or spec.recipe.logging.wandb_mode


def start_wandb_service(mode: str) -> None:
    """Start W&B's service now, in the background, for a run whose sink comes later
    (:func:`gradlab.metrics.wandb_sink.start_service`; nothing for ``disabled``)."""
    if mode != "disabled":
        from gradlab.metrics.wandb_sink import start_service

        start_service(mode)


def wandb_sink(settings: Settings, spec: RunSpec, paths: RunPaths, mode: str, *, group: str | None = None,
               tags: list[str] | None = None) -> Any:
    """The run's :class:`~gradlab.metrics.wandb_sink.WandbSink`, started in the background.

    In ``online`` mode the API key comes from ``[wandb] api_key_ref`` when ``WANDB_API_KEY`` is not
    set (:func:`~gradlab.metrics.wandb_sink.resolve_api_key`); a reference that does not resolve is
    logged and W&B looks for its key itself (no key: the sink ends ``pending``, the run goes on).
    ``WANDB_INIT_TIMEOUT`` (seconds > 0, default 30: :func:`gradlab.runs.timeouts.wandb_budget_s`) is the sink's budget: W&B's start-up timeout and
    the most the flow waits on W&B in all, exit included (docs/ARCHITECTURE.md section 10). ``group`` is the
    W&B group (the run's leaders' cohort key), ``tags`` its W&B tags (a sweep's cohort id); the
    project is :func:`~gradlab.metrics.wandb_sink.wandb_project`.
    """
    from gradlab.errors import ConfigError
    from gradlab.metrics.wandb_sink import WandbSink, resolve_api_key, wandb_project
    from gradlab.runs.timeouts import wandb_budget_s

    init_timeout_s = wandb_budget_s()  # checked before the attempt opened (check_run_environment)

    api_key = None
    if mode == "online":
        try:
            api_key = resolve_api_key(settings)
        except ConfigError as e:
            log.warning("run %s: W&B key: %s", spec.run_id, e)
    return WandbSink(spec.run_id, mode, paths.wandb_dir, wandb_project(settings.wandb_project, spec), group=group, tags=tags,
                     config={"spec": spec.to_json()}, entity=settings.wandb_entity, name=spec.display_name,
                     high_water=outbox_high_water(paths, "wandb"), background=True, api_key=api_key,
                     init_timeout_s=init_timeout_s)


def _run_exists(stores: Stores, run_id: str) -> bool:
    try:
        read_run(stores, run_id)
    except NotFound:
        return False
    return True
