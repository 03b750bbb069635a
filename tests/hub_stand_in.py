"""A local HTTP stand-in for the Hugging Face Hub at huggingface_hub's endpoint setting (``HF_ENDPOINT``):
it records what the client sends (repo creation, pre-upload, the NDJSON commit) for models and datasets."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class StandIn(BaseHTTPRequestHandler):
    """The Hub's model- and dataset-repository endpoints huggingface_hub's create_repo / upload_folder call."""

    requests: list[tuple[str, str, bytes]] = []

    def log_message(self, *args) -> None:
        pass

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
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
            return self._reply(200, {"commitUrl": f"{host}/{m.group(1)}/commit/{'c' * 40}", "commitOid": "c" * 40})
        return self._reply(404, {"error": f"stand-in: no route {self.path}"})

    def do_GET(self) -> None:
        type(self).requests.append((self.path, self.headers.get("Authorization", ""), b""))
        self._reply(404, {"error": f"stand-in: no route {self.path}"})


@pytest.fixture
def hub_stand_in():
    StandIn.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", StandIn.requests
    finally:
        server.shutdown()
