"""A local HTTP stand-in for the Hugging Face Hub at huggingface_hub's endpoint setting (``HF_ENDPOINT``):
it records what the client sends (repo creation, pre-upload, the NDJSON commit) for model and dataset
repositories, keeps each commit's files, and serves a model repository's files back to
``hf_hub_download`` (what rl-zoo3's ``load_from_hub`` and huggingface_sb3's ``load_from_hub`` call)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


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
        m = re.match(r"^/api/(?:models|datasets)/([^/]+/[^/]+)/preupload/main", self.path)
        if m:
            files = json.loads(body)["files"]
            return self._reply(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                               for f in files]})
        m = re.match(r"^/api/(?:models|datasets)/([^/]+/[^/]+)/commit/main", self.path)
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
