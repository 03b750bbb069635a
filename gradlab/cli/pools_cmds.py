"""``gradlab pools create|list``: the work pools of ``deployments/work-pools/pools.yaml`` on a Prefect server.

The server is ``PREFECT_API_URL`` / ``[prefect] api_url``, else the local one kept in the
background (started by the first command that needs it, :mod:`gradlab.runs.server`); with
neither (``GRADLAB_DAEMON=0``) the commands refuse (Prefect's ephemeral mode would put the pools
in a throw-away server). Prefect is imported only when a command runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from gradlab.cli.output import console, fail, print_json, say_text

pools_app = typer.Typer(help="Create and list the work pools queued runs use (gradlab-local, gradlab-gpu).",
                        no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]


def _project_root() -> Path:
    from gradlab.deploy.project import find_project_root

    root = find_project_root()
    if root is None:
        fail("no gradlab checkout found (prefect.yaml next to pyproject.toml): run inside the repository")
    return root


def use_prefect_server() -> str:
    """Point this process's Prefect client at the configured or local server; return its API URL.

    Starts the local background server when none is configured or running (unless
    ``GRADLAB_DAEMON=0``); exits 1 (with what to do) when there is still none. Must run before
    prefect is imported.
    """
    from gradlab.deploy.preflight import prefect_api_url
    from gradlab.errors import GradlabError
    from gradlab.runs.server import healthy
    from gradlab.settings import load_settings

    try:
        settings = load_settings()
    except GradlabError as e:
        fail(str(e))
    api_url, source = prefect_api_url(settings)
    if api_url is None:
        from gradlab.runs.server import ensure_server

        state = ensure_server(settings, say=say_text)
        if state is None:
            fail("no Prefect server: run `gradlab server start` (this machine) or set PREFECT_API_URL"
                 + (" (GRADLAB_DAEMON=0: none is started for you)" if not settings.daemon else ""))
        api_url, source = state.api_url, f"gradlab server (pid {state.pid})"
    elif source.startswith("gradlab server"):
        from gradlab.runs.server import register_client

        register_client(settings)  # in use while this command runs: not idle
    if not healthy(api_url, timeout_s=3.0):
        fail(f"Prefect API {api_url} ({source}) is not reachable")
    os.environ["PREFECT_API_URL"] = api_url
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    return api_url


def apply_pools(root: Path) -> list[dict[str, Any]]:
    """Create or update every pool and tag limit of ``pools.yaml`` through the Prefect API.

    Idempotent: a pool that exists with the same type, template, description and concurrency limit
    is left ``unchanged``; one that differs is ``updated`` in place (its workers and queues stay);
    a missing one is ``created``. Tag limits are upserted.

    Returns:
        One row per pool and tag limit: ``{"kind": "pool"|"tag", "name", "action", ...}``.

    Raises:
        ConfigError: ``pools.yaml`` or a template is invalid, or an existing pool has another type
            (Prefect cannot change a pool's type: delete it first).
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound

    from gradlab.deploy.pools import base_job_template, load_pools
    from gradlab.errors import ConfigError

    config = load_pools(root)
    rows: list[dict[str, Any]] = []
    with get_client(sync_client=True) as client:
        for pool in config.pools:
            template = base_job_template(root, pool)
            try:
                existing = client.read_work_pool(pool.name)
            except ObjectNotFound:
                client.create_work_pool(WorkPoolCreate(
                    name=pool.name, type=pool.type, description=pool.description, base_job_template=template,
                    concurrency_limit=pool.concurrency_limit))
                action = "created"
            else:
                if existing.type != pool.type:
                    raise ConfigError(f"work pool {pool.name!r} exists with type {existing.type!r}, expected "
                                      f"{pool.type!r}: delete it (prefect work-pool delete {pool.name}) and rerun")
                same = (existing.base_job_template == template and existing.concurrency_limit == pool.concurrency_limit
                        and (existing.description or "") == pool.description)
                if same:
                    action = "unchanged"
                else:
                    client.update_work_pool(pool.name, WorkPoolUpdate(
                        description=pool.description, base_job_template=template,
                        concurrency_limit=pool.concurrency_limit))
                    action = "updated"
            rows.append({"kind": "pool", "name": pool.name, "action": action, "type": pool.type,
                         "concurrency_limit": pool.concurrency_limit, "worker_limit": pool.worker_limit})
        for limit in config.tag_concurrency_limits:
            try:
                current = client.read_concurrency_limit_by_tag(limit.tag).concurrency_limit
            except ObjectNotFound:
                current = None
            if current == limit.limit:
                action = "unchanged"
            else:
                client.create_concurrency_limit(tag=limit.tag, concurrency_limit=limit.limit)
                action = "created" if current is None else "updated"
            rows.append({"kind": "tag", "name": limit.tag, "action": action, "concurrency_limit": limit.limit})
    return rows


def list_pools(root: Path | None) -> list[dict[str, Any]]:
    """Every pool on the server plus every pool ``pools.yaml`` defines (``exists`` False if absent)."""
    from prefect.client.orchestration import get_client

    from gradlab.deploy.pools import load_pools

    defined = {p.name: p for p in load_pools(root).pools} if root is not None else {}
    rows = []
    with get_client(sync_client=True) as client:
        server = {p.name: p for p in client.read_work_pools()}
        for name in sorted(set(server) | set(defined)):
            pool = server.get(name)
            workers = client.read_workers_for_work_pool(name) if pool is not None else []
            rows.append({
                "name": name, "defined": name in defined, "exists": pool is not None,
                "type": pool.type if pool else defined[name].type,
                "concurrency_limit": pool.concurrency_limit if pool else None,
                "status": (pool.status.value if pool.status is not None else None) if pool else None,
                "paused": pool.is_paused if pool else None,
                "workers": sorted(w.name for w in workers),
                "online_workers": sorted(w.name for w in workers if str(getattr(w.status, "value", w.status)) == "ONLINE"),
            })
    return rows


@pools_app.command("create")
def create(json_out: JsonOption = False) -> None:
    """Create (or update in place) gradlab-local and gradlab-gpu and the `gpu` tag limit. Idempotent."""
    from gradlab.errors import GradlabError

    root = _project_root()
    api_url = use_prefect_server()
    try:
        rows = apply_pools(root)
    except GradlabError as e:
        fail(str(e))
    if json_out:
        print_json({"api_url": api_url, "applied": rows})
        return
    for row in rows:
        what = "pool" if row["kind"] == "pool" else "tag limit"
        console.print(f"{what} {row['name']}: {row['action']} (concurrency limit {row['concurrency_limit']})")
    console.print(f"on {api_url}; start a worker: prefect worker start --pool gradlab-local")


@pools_app.command("list")
def list_(json_out: JsonOption = False) -> None:
    """List work pools on the server: type, concurrency limit, status, workers; and which are missing."""
    from gradlab.deploy.project import find_project_root
    from gradlab.errors import GradlabError

    use_prefect_server()
    try:
        rows = list_pools(find_project_root())
    except GradlabError as e:
        fail(str(e))
    if json_out:
        print_json(rows)
        return
    table = Table("pool", "type", "limit", "status", "workers (online)", "note")
    for r in rows:
        note = "" if r["exists"] else "missing: gradlab pools create"
        if r["exists"] and not r["defined"]:
            note = "not in pools.yaml"
        table.add_row(r["name"], r["type"], str(r["concurrency_limit"] or "-"), str(r["status"] or "-"),
                      f"{len(r['workers'])} ({len(r['online_workers'])})", note)
    console.print(table)
