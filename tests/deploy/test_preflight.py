"""`gradlab experiment preflight` and `gradlab pools create|list` against a real Prefect server and a
real S3-protocol server (moto), both on 127.0.0.1 and both always stopped by the test."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradlab.deploy.preflight import run_preflight
from gradlab.runs.server import ServerState, start_server, stop_server
from gradlab.settings import load_settings
from tests.s3server import S3Server, free_port, s3_server  # noqa: F401  (pytest fixture)

REPO = Path(__file__).resolve().parents[2]


def gradlab(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradlab.cli.app", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}, timeout=120)


def api_get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def api_patch(url: str, body: dict) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="PATCH",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as r:
        return r.status


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerState]:
    """`prefect server start` on 127.0.0.1 with its own home and SQLite database; always stopped."""
    home = tmp_path_factory.mktemp("prefect_server_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADLAB_HOME", str(home))
        mp.setenv("GRADLAB_CONFIG", str(home / "config.toml"))
        mp.delenv("PREFECT_API_URL", raising=False)
        settings = load_settings()
    state = start_server(settings, idle_s=0)
    try:
        yield state
    finally:
        stop_server(settings)


#: HTTP timeout of every probe against the test's real Prefect server: the 2 s default is for an
#: operator's idle machine; on a loaded CI box (load ~10) a healthy server answers in several seconds.
LOADED_HTTP_TIMEOUT_S = 30.0


def statuses(report) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


@pytest.mark.slow
def test_preflight_and_pools_create_against_a_real_prefect_server(prefect_server: ServerState,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    api = prefect_server.api_url
    monkeypatch.setenv("PREFECT_API_URL", api)
    before = run_preflight(root=REPO, timeout_s=LOADED_HTTP_TIMEOUT_S)
    assert statuses(before) == {
        "config": "ok", "prefect": "ok", "pool:gradlab-local": "fail", "pool:gradlab-gpu": "warn",
        "deployment:training-run/local": "warn", "deployment:training-run/gpu": "warn",
        "deployment:reports-sync/reports-sync": "warn",
        "store:control": "ok", "store:eval": "ok", "store:model": "ok", "wandb": "ok",
    }
    assert not before.ok and [c.name for c in before.missing] == ["pool:gradlab-local"]
    missing = before.missing[0]
    assert (missing.detail, missing.fix) == ("work pool does not exist", "gradlab pools create")
    deployment = next(c for c in before.checks if c.name == "deployment:training-run/local")
    assert (deployment.detail, deployment.fix, deployment.required) == ("not deployed", "prefect deploy -n local (or --all)", False)

    created = gradlab("pools", "create", "--json")
    assert created.returncode == 0, created.stderr
    doc = json.loads(created.stdout)
    assert doc["api_url"] == api
    assert [(r["kind"], r["name"], r["action"], r["concurrency_limit"]) for r in doc["applied"]] == [
        ("pool", "gradlab-local", "created", 2), ("pool", "gradlab-gpu", "created", 4), ("tag", "gpu", "created", 4)]
    pool = api_get(f"{api}/work_pools/gradlab-local")
    assert (pool["type"], pool["concurrency_limit"]) == ("process", 2)
    assert pool["base_job_template"] == json.loads((REPO / "deployments/work-pools/gradlab-local.json").read_text())
    assert api_get(f"{api}/concurrency_limits/tag/gpu")["concurrency_limit"] == 4

    # Idempotent: nothing changes on a second run; a drifted limit is put back in place.
    assert api_patch(f"{api}/work_pools/gradlab-local", {"concurrency_limit": 7}) == 204
    again = json.loads(gradlab("pools", "create", "--json").stdout)
    assert [r["action"] for r in again["applied"]] == ["updated", "unchanged", "unchanged"]
    assert api_get(f"{api}/work_pools/gradlab-local")["concurrency_limit"] == 2
    assert [r["action"] for r in json.loads(gradlab("pools", "create", "--json").stdout)["applied"]] == ["unchanged"] * 3

    listed = json.loads(gradlab("pools", "list", "--json").stdout)
    assert [(r["name"], r["exists"], r["defined"], r["concurrency_limit"], r["workers"]) for r in listed] == [
        ("gradlab-gpu", True, True, 4, []), ("gradlab-local", True, True, 2, [])]

    after = gradlab("experiment", "preflight", "--json", "--timeout", str(LOADED_HTTP_TIMEOUT_S))
    assert after.returncode == 0, after.stdout + after.stderr
    report = json.loads(after.stdout)
    assert report["ok"] is True
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["pool:gradlab-local"]["detail"] == "type process, concurrency limit 2, status NOT_READY"
    assert checks["prefect"]["detail"] == f"{api} (PREFECT_API_URL) healthy"


@pytest.mark.slow
def test_preflight_says_which_store_is_down(prefect_server: ServerState, s3_server: S3Server,  # noqa: F811
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_API_URL", prefect_server.api_url)
    monkeypatch.setenv("GRADLAB_EVAL_STORE_URL", s3_server.url("eval"))
    monkeypatch.setenv("GRADLAB_MODEL_STORE_URL", s3_server.url("model"))
    assert gradlab("pools", "create").returncode == 0  # idempotent: this test needs no other test's pools
    up = run_preflight(root=REPO, timeout_s=LOADED_HTTP_TIMEOUT_S)
    stores = {c.name: c for c in up.checks if c.name.startswith("store:")}
    assert {k: c.status for k, c in stores.items()} == {"store:control": "ok", "store:eval": "ok", "store:model": "ok"}
    # The probe is one create-only object under the scratch prefix, read back intact.
    from gradlab.stores import open_store

    keys = open_store(s3_server.url("model")).list("_preflight/")
    assert len(keys) == 1 and re.fullmatch(r"_preflight/[0-9a-f]{16}/probe", keys[0])
    assert json.loads(open_store(s3_server.url("model")).get(keys[0]))["role"] == "model"
    assert keys[0] in stores["store:model"].detail

    s3_server.stop()
    start = time.monotonic()
    out = gradlab("experiment", "preflight", "--json", "--timeout", str(LOADED_HTTP_TIMEOUT_S))
    elapsed = time.monotonic() - start
    assert out.returncode == 1
    report = json.loads(out.stdout)
    failed = {c["name"]: c for c in report["checks"] if c["status"] == "fail"}
    assert sorted(failed) == ["store:eval", "store:model"]
    assert failed["store:model"]["detail"].startswith(f"{s3_server.url('model')}: StoreUnavailable: ")
    assert "cannot reach" in failed["store:model"]["detail"]
    assert "GRADLAB_S3_ENDPOINT_URL" in failed["store:model"]["fix"]
    # A down store costs botocore's bounded connect retries, not the HTTP timeout: preflight never hangs on it.
    assert elapsed < 120
    human = gradlab("experiment", "preflight", "--timeout", str(LOADED_HTTP_TIMEOUT_S))
    assert human.returncode == 1 and "missing: store:eval, store:model" in human.stdout


def test_prefect_unreachable_or_unconfigured_is_a_required_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{port}/api")
    report = run_preflight(root=REPO, timeout_s=1.0)
    prefect = next(c for c in report.checks if c.name == "prefect")
    assert prefect.status == "fail" and prefect.required and not report.ok
    assert prefect.detail.startswith(f"http://127.0.0.1:{port}/api (PREFECT_API_URL): unreachable: ")
    assert prefect.elapsed_s < 1.0 + 10.0  # a refused connection: the 1 s probe timeout plus a loaded machine's slack
    assert not any(c.name.startswith(("pool:", "deployment:")) for c in report.checks)  # nothing to ask
    monkeypatch.delenv("PREFECT_API_URL")
    report = run_preflight(root=REPO)
    prefect = next(c for c in report.checks if c.name == "prefect")
    assert (prefect.status, prefect.detail) == ("fail", "no Prefect API configured and no local server running")
    assert prefect.fix.startswith("gradlab server start")


def test_wandb_online_needs_a_key_and_secret_references_must_resolve(gradlab_home: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("R2_SECRET", raising=False)
    config = Path(os.environ["GRADLAB_CONFIG"])
    config.write_text('[wandb]\nmode = "online"\nentity = "lab"\nproject = "gradlab"\n'
                      '[stores]\ns3_secret_ref = "env:R2_SECRET"\n')
    config.chmod(0o600)
    report = run_preflight(root=REPO)
    checks = {c.name: c for c in report.checks}
    assert (checks["wandb"].status, checks["wandb"].detail) == ("fail", "mode online (lab/gradlab) but no API key found")
    assert checks["config"].status == "fail"
    assert checks["config"].detail.endswith("unresolved secret reference(s): stores.s3_secret_ref -> env:R2_SECRET is not set")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("R2_SECRET", "s3cr3t")
    checks = {c.name: c for c in run_preflight(root=REPO).checks}
    assert checks["wandb"].detail == "mode online (lab/gradlab); key from WANDB_API_KEY (not verified offline)"
    assert checks["config"].status == "ok" and "1 secret reference(s), all resolved" in checks["config"].detail
    assert "s3cr3t" not in json.dumps(run_preflight(root=REPO).as_json())


def test_a_bad_config_file_is_the_one_failure_reported(gradlab_home: Path) -> None:
    config = Path(os.environ["GRADLAB_CONFIG"])
    config.write_text('[stores]\ns3_secret_ref = "env:R2_SECRET"\n')
    config.chmod(0o644)
    out = gradlab("experiment", "preflight", "--json")
    assert out.returncode == 1
    report = json.loads(out.stdout)
    assert [(c["name"], c["status"]) for c in report["checks"]] == [("config", "fail")]
    assert "mode is 0644; expected 0600" in report["checks"][0]["detail"]


def test_preflight_imports_neither_prefect_nor_torch() -> None:
    probe = (
        "import sys, runpy\n"
        "sys.argv = ['gradlab', 'experiment', 'preflight', '--json']\n"
        "try:\n    runpy.run_module('gradlab.cli.app', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'prefect', 'stable_baselines3', 'wandb'))\n"
        "print('HEAVY=' + ','.join(heavy), file=sys.stderr)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert "HEAVY=\n" in out.stderr, out.stderr[-500:]
