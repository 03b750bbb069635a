"""``gradlab experiment preflight``: read-only checks of every service a queued run needs.

Checks, in order (``required`` ones make the report fail):

- ``config``: the operator config file loads (valid TOML, no literal secret, 0600 when it names
  a secret reference) and every secret reference resolves.
- ``prefect``: a Prefect API is configured (``PREFECT_API_URL`` / ``[prefect] api_url``, else the
  server ``gradlab server start`` keeps) and ``GET {api}/health`` answers 200 within the timeout.
- ``pool:<name>``: the default pool exists on that server (``GET /work_pools/{name}``); the other
  pools of ``pools.yaml`` are reported but not required.
- ``deployment:<flow>/<name>``: each deployment of ``prefect.yaml`` exists on the server (not
  required: ``prefect deploy --all`` creates them).
- ``store:<control|eval|model>``: each store accepts a create-only probe under the scratch prefix
  ``_preflight/<random hex>/probe`` and reads back the same bytes. That probe is the only write;
  objects under ``_preflight/`` may be deleted at any time.
- ``wandb``: the effective mode (``GRADLAB_WANDB_MODE`` / ``[wandb] mode``; offline when unset);
  ``online`` requires a key (``WANDB_API_KEY``, a ``wandb.api_key_ref`` secret reference, or an
  ``api.wandb.ai`` entry in ``~/.netrc``). The key is not verified (that needs the network).

Nothing here imports prefect: the API is probed over HTTP with :mod:`urllib`.
"""

from __future__ import annotations

import json
import logging
import netrc
import os
import secrets
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from gradlab.errors import GradlabError

if TYPE_CHECKING:
    from gradlab.settings import Settings

logger = logging.getLogger(__name__)

Status = Literal["ok", "fail", "warn", "skip"]
PREFLIGHT_PREFIX = "_preflight"
#: Default HTTP timeout of each Prefect API probe, seconds.
HTTP_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class CheckResult:
    """One check: ``name`` (``prefect``, ``store:model``...), ``status``, whether it is required,
    what was found (``detail``) and, when it did not pass, what to do (``fix``)."""

    name: str
    status: Status
    required: bool
    detail: str
    fix: str | None = None
    elapsed_s: float = 0.0


@dataclass
class PreflightReport:
    """Every check's result; ``ok`` is False when any required check failed."""

    checks: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(c.required and c.status == "fail" for c in self.checks)

    @property
    def missing(self) -> list[CheckResult]:
        """Required checks that failed."""
        return [c for c in self.checks if c.required and c.status == "fail"]

    def as_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [asdict(c) for c in self.checks]}


def _timed(fn):
    def wrapper(*args: Any, **kwargs: Any) -> CheckResult:
        start = time.monotonic()
        result = fn(*args, **kwargs)
        return CheckResult(**{**asdict(result), "elapsed_s": round(time.monotonic() - start, 3)})
    return wrapper


def _get_json(url: str, timeout_s: float) -> tuple[int, Any]:
    """(HTTP status, parsed JSON body or None). Raises OSError when unreachable."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    auth = os.environ.get("PREFECT_API_AUTH_STRING")
    if auth:
        import base64

        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    key = os.environ.get("PREFECT_API_KEY")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
            status = response.status
    except urllib.error.HTTPError as e:
        return e.code, None
    try:
        return status, json.loads(body) if body else None
    except ValueError:
        return status, None


def prefect_api_url(settings: Settings) -> tuple[str | None, str]:
    """(API URL, where it came from): the configured URL, else a running ``gradlab server``."""
    if settings.prefect_api_url:
        source = "PREFECT_API_URL" if os.environ.get("PREFECT_API_URL") else f"{settings.config_file} [prefect] api_url"
        return settings.prefect_api_url.rstrip("/"), source
    from gradlab.runs.server import running_server

    state = running_server(settings)
    if state is not None:
        return state.api_url, f"gradlab server (pid {state.pid})"
    return None, "none"


@_timed
def check_config(settings: Settings) -> CheckResult:
    from gradlab.settings import resolve_secret

    refs = settings.secret_refs
    exists = settings.config_file.is_file()
    unresolved = []
    for key, ref in refs:
        try:
            value = resolve_secret(ref)
        except GradlabError as e:
            unresolved.append(f"{key} ({e})")
            continue
        if not value:
            unresolved.append(f"{key} -> {ref} is not set")
    where = str(settings.config_file) if exists else f"{settings.config_file} (absent: defaults and GRADLAB_* only)"
    if unresolved:
        return CheckResult("config", "fail", True, f"{where}: unresolved secret reference(s): {'; '.join(unresolved)}",
                           fix="export the named environment variables, or store the keyring entries")
    return CheckResult("config", "ok", True, f"{where}; {len(refs)} secret reference(s), all resolved")


@_timed
def check_prefect(api_url: str | None, source: str, timeout_s: float) -> CheckResult:
    if api_url is None:
        return CheckResult("prefect", "fail", True, "no Prefect API configured and no local server running",
                           fix="gradlab server start (this machine), or set PREFECT_API_URL / [prefect] api_url")
    try:
        status, _ = _get_json(f"{api_url}/health", timeout_s)
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return CheckResult("prefect", "fail", True, f"{api_url} ({source}): unreachable: {reason}",
                           fix="start the server (gradlab server start / prefect server start) or fix PREFECT_API_URL")
    if status != 200:
        return CheckResult("prefect", "fail", True, f"{api_url}/health ({source}): HTTP {status}",
                           fix="check the server's log; 401/403: set PREFECT_API_AUTH_STRING or PREFECT_API_KEY")
    return CheckResult("prefect", "ok", True, f"{api_url} ({source}) healthy")


@_timed
def check_pool(api_url: str, name: str, required: bool, timeout_s: float) -> CheckResult:
    try:
        status, body = _get_json(f"{api_url}/work_pools/{quote(name, safe='')}", timeout_s)
    except OSError as e:
        return CheckResult(f"pool:{name}", "fail", required, f"unreachable: {getattr(e, 'reason', e)}")
    if status == 404:
        return CheckResult(f"pool:{name}", "fail" if required else "warn", required, "work pool does not exist",
                           fix="gradlab pools create")
    if status != 200 or not isinstance(body, dict):
        return CheckResult(f"pool:{name}", "fail", required, f"HTTP {status}")
    detail = f"type {body.get('type')}, concurrency limit {body.get('concurrency_limit')}, status {body.get('status')}"
    return CheckResult(f"pool:{name}", "ok", required, detail)


@_timed
def check_deployment(api_url: str, flow_name: str, name: str, timeout_s: float) -> CheckResult:
    label = f"deployment:{flow_name}/{name}"
    try:
        status, body = _get_json(f"{api_url}/deployments/name/{quote(flow_name, safe='')}/{quote(name, safe='')}",
                                 timeout_s)
    except OSError as e:
        return CheckResult(label, "warn", False, f"unreachable: {getattr(e, 'reason', e)}")
    if status == 404:
        return CheckResult(label, "warn", False, "not deployed", fix=f"prefect deploy -n {name} (or --all)")
    if status != 200 or not isinstance(body, dict):
        return CheckResult(label, "warn", False, f"HTTP {status}")
    return CheckResult(label, "ok", False, f"pool {body.get('work_pool_name')}")


@_timed
def check_store(role: str, url: str, endpoint_url: str | None, settings: Settings | None = None) -> CheckResult:
    """Create-only probe ``_preflight/<hex>/probe`` then read back and compare the bytes."""
    from gradlab.stores import open_store

    key = f"{PREFLIGHT_PREFIX}/{secrets.token_hex(8)}/probe"
    body = json.dumps({"probe": key, "role": role, "at": time.time()}).encode()
    try:
        store = open_store(url, endpoint_url=endpoint_url, settings=settings)
        store.put_create_only(key, body)
        back = store.get(key)
    except GradlabError as e:
        return CheckResult(f"store:{role}", "fail", True, f"{url}: {type(e).__name__}: {e}",
                           fix="start the store / check its URL and credentials ([stores] s3_secret_ref and "
                               "s3_access_key_id_ref, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; "
                               "GRADLAB_S3_ENDPOINT_URL)")
    except OSError as e:
        return CheckResult(f"store:{role}", "fail", True, f"{url}: {type(e).__name__}: {e}",
                           fix="check the folder exists and is writable")
    if back != body:
        return CheckResult(f"store:{role}", "fail", True, f"{url}: read back {len(back)} bytes that differ from "
                           f"the {len(body)} written at {key}")
    return CheckResult(f"store:{role}", "ok", True, f"{url}: create-only probe written and read back ({key})")


def _netrc_has_wandb() -> bool:
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


@_timed
def check_wandb(settings: Settings) -> CheckResult:
    from gradlab.settings import resolve_secret

    mode = settings.wandb_mode or "offline"
    target = "/".join(x for x in (settings.wandb_entity, settings.wandb_project) if x) or "default entity/project"
    if mode not in ("disabled", "offline", "online"):
        return CheckResult("wandb", "fail", True, f"mode {mode!r}",
                           fix="set GRADLAB_WANDB_MODE or [wandb] mode to disabled, offline or online")
    if mode != "online":
        return CheckResult("wandb", "ok", True, f"mode {mode}: no network needed (local files, synced later)")
    sources = []
    if os.environ.get("WANDB_API_KEY"):
        sources.append("WANDB_API_KEY")
    for key, ref in settings.secret_refs:
        if key == "wandb.api_key_ref":
            try:
                if resolve_secret(ref):
                    sources.append(key)
            except GradlabError:
                pass
    if _netrc_has_wandb():
        sources.append("~/.netrc")
    if not sources:
        return CheckResult("wandb", "fail", True, f"mode online ({target}) but no API key found",
                           fix="export WANDB_API_KEY, set [wandb] api_key_ref = \"env:NAME\", run wandb login, "
                               "or use GRADLAB_WANDB_MODE=offline")
    return CheckResult("wandb", "ok", True, f"mode online ({target}); key from {', '.join(sources)} (not verified offline)")


def run_preflight(settings: Settings | None = None, *, root: Path | None = None,
                  timeout_s: float = HTTP_TIMEOUT_S) -> PreflightReport:
    """Run every check; read-only except each store's create-only probe.

    Args:
        settings: machine settings (default: :func:`gradlab.settings.load_settings`). When loading
            them fails (bad config file), the report holds one failed ``config`` check and stops.
        root: project root with ``prefect.yaml`` and ``deployments/work-pools/pools.yaml`` (default:
            :func:`gradlab.deploy.project.find_project_root`); without it pools and deployments are
            checked only for the default pool.
        timeout_s: timeout of each HTTP probe, seconds.

    Returns:
        The report; stores are probed concurrently (bounded by botocore's own timeouts for S3).
    """
    from gradlab.deploy.project import find_project_root, flow_signature, load_prefect_yaml

    report = PreflightReport()
    if settings is None:
        from gradlab.settings import config_path, load_settings

        try:
            settings = load_settings()
        except GradlabError as e:
            report.checks.append(CheckResult("config", "fail", True, str(e), fix=f"fix {config_path()}"))
            return report
    root = root if root is not None else find_project_root()
    with ThreadPoolExecutor(max_workers=3) as pool:
        store_futures = [
            pool.submit(check_store, role, url, settings.s3_endpoint_url, settings)
            for role, url in (("control", settings.control_store_url), ("eval", settings.eval_store_url),
                              ("model", settings.model_store_url))
        ]
        report.checks.append(check_config(settings))
        api_url, source = prefect_api_url(settings)
        prefect = check_prefect(api_url, source, timeout_s)
        report.checks.append(prefect)
        if prefect.status == "ok" and api_url is not None:
            pool_names = [settings.default_pool]
            deployments: list[tuple[str, str]] = []
            if root is not None:
                try:
                    from gradlab.deploy.pools import load_pools

                    pool_names += [p.name for p in load_pools(root).pools if p.name != settings.default_pool]
                    project = load_prefect_yaml(root)
                    for spec in project.deployments:
                        flow_name = flow_signature(root / spec.entrypoint_path, spec.function).flow_name
                        deployments.append((flow_name, spec.name))
                except GradlabError as e:
                    report.checks.append(CheckResult("deployments", "warn", False, f"{root}: {e}",
                                                     fix="gradlab validate"))
            for name in pool_names:
                report.checks.append(check_pool(api_url, name, name == settings.default_pool, timeout_s))
            for flow_name, name in deployments:
                report.checks.append(check_deployment(api_url, flow_name, name, timeout_s))
        report.checks += [f.result() for f in store_futures]
    report.checks.append(check_wandb(settings))
    return report
