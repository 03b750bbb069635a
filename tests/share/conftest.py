"""Real learner runs for the sharing tests: a run directory (``spec.json`` + checkpoints) per recipe.

Runs are trained by gradlab's own learner (``run_learner``) with the checked-in recipes and a small
budget, so their checkpoints are exactly what ``gradlab train`` writes.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def train_run(root: Path, ref: str, *, run_id: str, seed: int = 0, overrides: tuple[str, ...] = ()) -> Path:
    """Train ``ref`` (GOAL/RECIPE with ``--set`` overrides) into ``root/<run_id>``; returns the run directory."""
    import torch

    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.learn.learner import run_learner

    spec = RunSpec.from_resolved(Experiments().resolve(ref, list(overrides)), seed=seed, run_id=run_id)
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(spec.to_json()))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_learner(spec, run_dir, watch_parent=False)
    finally:
        torch.set_num_threads(threads)
    return run_dir


CARTPOLE_RUN_ID = "gradlab-20260101T000000-00c0ffee"
CARTPOLE_OVERRIDES = ("train.timesteps=4096", "train.checkpoint_freq=2048")


@pytest.fixture(scope="session")
def cartpole_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CartPole-v1/ppo run of 4096 steps (checkpoints at 2048 and 4096)."""
    return train_run(tmp_path_factory.mktemp("share_runs"), "CartPole-v1/ppo", run_id=CARTPOLE_RUN_ID,
                     overrides=CARTPOLE_OVERRIDES)


def gradlab(*args: str, env: dict[str, str] | None = None, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """``gradlab ARGS`` as a user runs it (a subprocess with this test's environment)."""
    return subprocess.run([sys.executable, "-m", "gradlab.cli.app", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}, timeout=timeout_s)


class HubStandIn(BaseHTTPRequestHandler):
    """The Hub's model-repository endpoints, on loopback: what huggingface_hub's create_repo and
    upload_folder call (recorded; a commit's files are kept), and the file downloads that
    hf_hub_download makes (``HEAD``/``GET /<repo>/resolve/<revision>/<path>``) of what was committed,
    with the headers it reads (commit, etag, size; ``X-Error-Code: EntryNotFound`` for a missing file)."""

    requests: list[tuple[str, str, bytes]] = []
    repos: dict[str, dict[str, bytes]] = {}

    def log_message(self, *args) -> None:
        pass

    def _reply(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).requests.append((self.path, self.headers.get("Authorization", ""), body))
        host = f"http://{self.headers['Host']}"
        if self.path == "/api/repos/create":
            name = json.loads(body)
            return self._reply(200, {"url": f"{host}/{name.get('organization')}/{name['name']}"})
        if self.path == "/api/validate-yaml":  # the card's metadata, checked before the commit
            return self._reply(200, {"errors": [], "warnings": []})
        m = re.match(r"^/api/models/([^/]+/[^/]+)/preupload/main", self.path)
        if m:
            files = json.loads(body)["files"]
            return self._reply(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                               for f in files]})
        m = re.match(r"^/api/models/([^/]+/[^/]+)/commit/main", self.path)
        if m:
            lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
            files = type(self).repos.setdefault(m.group(1), {})
            for line in lines:
                if line["key"] == "file":
                    files[line["value"]["path"]] = base64.b64decode(line["value"]["content"])
            return self._reply(200, {"commitUrl": f"{host}/{m.group(1)}/commit/{'c' * 40}", "commitOid": "c" * 40})
        return self._reply(404, {"error": f"stand-in: no route {self.path}"})

    def _file(self) -> None:
        type(self).requests.append((self.path, self.headers.get("Authorization", ""), b""))
        m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", self.path.split("?")[0])
        if not m or m.group(1) not in type(self).repos:
            return self._reply(404, {"error": f"stand-in: no route {self.path}"}, {"X-Error-Code": "RepoNotFound"})
        data = type(self).repos[m.group(1)].get(urllib.parse.unquote(m.group(3)))
        if data is None:
            return self._reply(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("X-Repo-Commit", "c" * 40)
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(data)

    do_GET = _file
    do_HEAD = _file


@contextlib.contextmanager
def serve_hub_stand_in():
    """(endpoint URL, the requests it got) of a fresh :class:`HubStandIn` on loopback, while in the block."""
    HubStandIn.requests, HubStandIn.repos = [], {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), HubStandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", HubStandIn.requests
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def hub_stand_in():
    with serve_hub_stand_in() as served:
        yield served


def hf_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A private Hugging Face home for a test's subprocesses (no token unless given)."""
    return {"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": "", **extra}


def place_in_hub_cache(folder: Path, cache: Path, repo: str) -> Path:
    """Place a repository folder in huggingface_hub's cache layout (what snapshot_download leaves);
    returns the snapshot folder (``<cache>/models--OWNER--NAME/snapshots/<commit>``)."""
    import shutil

    owner, name = repo.split("/")
    root = cache / f"models--{owner}--{name}"
    snapshot = root / "snapshots" / ("a" * 40)
    shutil.copytree(folder, snapshot)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text("a" * 40)
    return snapshot
