"""Prefect-API helpers of ``gradlab experiment``: flow runs of the ``training-run`` deployments.

A gradlab run and its Prefect flow runs are linked by a tag: the run id itself
(``gradlab-<yyyymmddThhmmss>-<8 hex>``). ``gradlab experiment launch`` reserves the run id, passes
it as the ``run_id`` parameter, names the flow run after it and tags it; the flow tags its own flow
run when it was queued without one (``prefect deployment run``). Every attempt of a run (launch,
``experiment retry``, ``runs retry``, a retry from the UI) is one flow run carrying the tag.

Public names:
    FlowRunView: what ``status``/``list``/``follow`` show of one flow run.
    is_flow_run_id(ref) -> bool; flow_runs_of(client, run_id) -> list[FlowRun] (newest first);
    resolve_run(client, ref) -> (run_id, flow_runs); gradlab_run_id(flow_run) -> str | None;
    create_run(client, deployment, parameters, run_id) -> FlowRun; cancel_flow_run(client, flow_run) -> str;
    training_flow_runs(client, limit) -> list[FlowRun]; flow_run_logs(client, flow_run_id, tail) -> list[dict];
    ui_url(api_url, flow_run_id) -> str; parse_duration(text) -> float.

Every function takes a synchronous Prefect client (``get_client(sync_client=True)``); prefect is
imported lazily so importing this module stays cheap.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gradlab.errors import ConfigError, NotFound

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.objects import FlowRun

log = logging.getLogger(__name__)

#: The flow every deployment of ``prefect.yaml`` runs.
FLOW_NAME = "training-run"
#: A gradlab run id (``gradlab.contracts.run_spec.new_run_id``); as a flow-run tag it names the run.
RUN_ID_PATTERN = re.compile(r"^gradlab-\d{8}T\d{6}-[0-9a-f]{8}$")
#: Flow runs ``list`` and the fallback of :func:`flow_runs_of` read at most.
LIST_LIMIT = 200

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``5m``, ``1.5h``, ``2d``, ``500ms`` → seconds (float).

    Raises:
        ConfigError: the text is not a non-negative number with an optional unit ms|s|m|h|d.
    """
    match = _DURATION.match(text)
    if match is None:
        raise ConfigError(f"--timeout {text!r}: expected a duration like 90, 90s, 5m, 1h")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def is_flow_run_id(ref: str) -> bool:
    """True when ``ref`` is a UUID (a Prefect flow run id) rather than a gradlab run id."""
    try:
        uuid.UUID(ref)
    except ValueError:
        return False
    return True


def gradlab_run_id(flow_run: FlowRun) -> str | None:
    """The gradlab run a flow run belongs to: its ``run_id`` parameter, else its run-id tag.

    None for a flow run queued without a run id that has not started yet (the flow tags itself once
    it has resolved the run).
    """
    param = (flow_run.parameters or {}).get("run_id")
    if isinstance(param, str) and param:
        return param
    return next((t for t in flow_run.tags or () if RUN_ID_PATTERN.match(t)), None)


def _newest_first(runs: list[FlowRun]) -> list[FlowRun]:
    return sorted(runs, key=lambda fr: (fr.created or datetime.min.replace(tzinfo=UTC), str(fr.id)), reverse=True)


def training_flow_runs(client: SyncPrefectClient, limit: int = LIST_LIMIT) -> list[FlowRun]:
    """The newest ``limit`` flow runs of the ``training-run`` flow, newest first."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[FLOW_NAME])),
                                 sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=limit)
    return _newest_first(list(runs))


def flow_runs_of(client: SyncPrefectClient, run_id: str) -> list[FlowRun]:
    """Every flow run of gradlab run ``run_id`` (tagged with it, or with it as ``run_id``), newest first."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    tagged = {fr.id: fr for fr in client.read_flow_runs(
        flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[run_id])), limit=LIST_LIMIT)}
    # A run queued by hand with -p run_id=... is tagged only once its flow has started.
    for fr in training_flow_runs(client):
        if fr.id not in tagged and gradlab_run_id(fr) == run_id:
            tagged[fr.id] = fr
    return _newest_first(list(tagged.values()))


def resolve_run(client: SyncPrefectClient, ref: str) -> tuple[str | None, list[FlowRun]]:
    """``ref`` (gradlab run id or Prefect flow run id) → (gradlab run id, its flow runs newest first).

    For a flow run id whose flow has not yet resolved its gradlab run, returns ``(None, [that run])``.
    A gradlab run id with no flow run (a run ``gradlab train`` ran before any tagging) returns
    ``(ref, [])``.

    Raises:
        NotFound: ``ref`` is a UUID no flow run has.
    """
    from prefect.exceptions import ObjectNotFound

    if is_flow_run_id(ref):
        try:
            flow_run = client.read_flow_run(uuid.UUID(ref))
        except ObjectNotFound:
            raise NotFound(f"no flow run {ref} on the Prefect server") from None
        run_id = gradlab_run_id(flow_run)
        return (run_id, flow_runs_of(client, run_id)) if run_id else (None, [flow_run])
    return ref, flow_runs_of(client, ref)


def create_run(client: SyncPrefectClient, deployment: str, parameters: dict[str, Any], run_id: str) -> FlowRun:
    """Queue a flow run of ``deployment`` (``training-run/local``) for gradlab run ``run_id``.

    The flow run is named after the run and tagged with it (merged with the deployment's tags).

    Raises:
        NotFound: no such deployment on the server (the message names the server asked, its
            deployments, and ``prefect deploy --all``).
    """
    from prefect.exceptions import ObjectNotFound

    try:
        dep = client.read_deployment_by_name(deployment)
    except ObjectNotFound:
        try:
            names = sorted({d.name for d in client.read_deployments()})
        except Exception:  # noqa: BLE001 - the message still names the server
            names = None
        has = ("it has no deployments" if names == [] else f"its deployment names: {', '.join(names)}" if names
               else "its deployments could not be listed")
        raise NotFound(f"no deployment {deployment!r} on the Prefect server at {client.api_url} ({has}): with "
                       f"PREFECT_API_URL={client.api_url} set, run `prefect deploy --all` in the gradlab checkout "
                       "(or point PREFECT_API_URL at the server you deployed to)") from None
    return client.create_flow_run_from_deployment(dep.id, parameters=parameters, name=run_id, tags=[run_id])


def cancel_flow_run(client: SyncPrefectClient, flow_run: FlowRun) -> str:
    """Ask Prefect to cancel ``flow_run``; return the state type it was moved to.

    A run that has not started (SCHEDULED, PAUSED, or PENDING with no process yet) is moved straight
    to CANCELLED; a running one to CANCELLING: its worker then SIGTERMs the flow-run process, and the
    flow stops its learner and seals a ``cancelled`` receipt (docs/ARCHITECTURE.md section 8).

    Raises:
        ConfigError: the flow run is already final, or Prefect refused the transition (reason given).
    """
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled, Cancelling

    state = flow_run.state
    if state is not None and state.is_final():
        raise ConfigError(f"flow run {flow_run.id} is already {state.name}: nothing to cancel")
    not_started = state is None or state.type in (StateType.SCHEDULED, StateType.PAUSED) or (
        state.type == StateType.PENDING and not flow_run.infrastructure_pid)
    target = Cancelled(message="cancelled before it started (gradlab experiment cancel)") if not_started else \
        Cancelling(message="gradlab experiment cancel")
    result = client.set_flow_run_state(flow_run.id, target)
    if str(getattr(result.status, "value", result.status)) == "ABORT":
        reason = getattr(result.details, "reason", None)
        raise ConfigError(f"flow run {flow_run.id}: Prefect refused the cancellation: {reason}")
    return target.type.value


def flow_run_logs(client: SyncPrefectClient, flow_run_id: Any, tail: int | None = None) -> list[dict[str, Any]]:
    """The flow run's Prefect logs (its own and its task runs'), oldest first; the last ``tail`` only.

    Returns:
        ``[{"timestamp": ISO 8601, "level": int, "name": logger, "task": the task run's name, or
        "flow" for the flow's own lines, "message": str}]``.
    """
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    rows: list[Any] = []
    if tail is not None:
        rows = list(reversed(client.read_logs(log_filter, limit=tail, sort=LogSort.TIMESTAMP_DESC)))
    else:
        while True:  # the API pages at 200
            page = client.read_logs(log_filter, limit=200, offset=len(rows), sort=LogSort.TIMESTAMP_ASC)
            rows.extend(page)
            if len(page) < 200:
                break
    names: dict[Any, str] = {}
    if any(r.task_run_id is not None for r in rows):
        task_filter = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        offset = 0
        while True:  # the API pages at 200
            page = client.read_task_runs(flow_run_filter=task_filter, limit=200, offset=offset)
            names.update({tr.id: tr.name for tr in page})
            offset += len(page)
            if len(page) < 200:
                break
    return [{"timestamp": r.timestamp.isoformat(), "level": r.level, "name": r.name,
             "task": "flow" if r.task_run_id is None else names.get(r.task_run_id, f"task run {r.task_run_id}"),
             "message": r.message}
            for r in rows]


def ui_url(api_url: str, flow_run_id: Any) -> str:
    """The Prefect UI page of a flow run: ``PREFECT_UI_URL`` when set, else the API URL less ``/api``."""
    base = os.environ.get("PREFECT_UI_URL") or re.sub(r"/api/?$", "", api_url.rstrip("/"))
    return f"{base.rstrip('/')}/runs/flow-run/{flow_run_id}"


@dataclass(frozen=True)
class FlowRunView:
    """One flow run as ``gradlab experiment`` shows it (JSON-ready: ids and times are strings)."""

    flow_run_id: str
    name: str
    run_id: str | None
    deployment: str | None
    state: str | None
    state_type: str | None
    state_message: str | None
    recipe: str | None
    seed: int | None
    created: str | None
    start_time: str | None
    end_time: str | None
    final: bool

    @classmethod
    def of(cls, flow_run: FlowRun, deployments: dict[Any, str] | None = None) -> FlowRunView:
        """``deployments`` maps deployment ids to ``flow/deployment`` names (ids shown otherwise)."""
        state = flow_run.state
        params = flow_run.parameters or {}
        dep = flow_run.deployment_id
        seed = params.get("seed")
        return cls(
            flow_run_id=str(flow_run.id), name=flow_run.name, run_id=gradlab_run_id(flow_run),
            deployment=(deployments or {}).get(dep, str(dep)) if dep else None,
            state=state.name if state else None, state_type=state.type.value if state else None,
            state_message=(state.message or None) if state else None,
            recipe=params.get("recipe"), seed=seed if isinstance(seed, int) else None,
            created=flow_run.created.isoformat() if flow_run.created else None,
            start_time=flow_run.start_time.isoformat() if flow_run.start_time else None,
            end_time=flow_run.end_time.isoformat() if flow_run.end_time else None,
            final=bool(state is not None and state.is_final()),
        )

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def deployment_names(client: SyncPrefectClient, flow_runs: list[FlowRun]) -> dict[Any, str]:
    """``{deployment id: "flow/deployment"}`` for the deployments of ``flow_runs``."""
    from prefect.exceptions import ObjectNotFound

    names: dict[Any, str] = {}
    for dep_id in {fr.deployment_id for fr in flow_runs if fr.deployment_id}:
        try:
            dep = client.read_deployment(dep_id)
        except ObjectNotFound:
            continue
        names[dep_id] = f"{FLOW_NAME}/{dep.name}"
    return names
