"""A real S3-protocol server on 127.0.0.1 for tests: moto's ThreadedMotoServer.

Use the fixture (import it into a test module or a conftest)::

    from tests.s3server import s3_server  # noqa: F401  (pytest fixture)

    def test_x(s3_server):
        store = open_store(s3_server.url("prefix"))
        ...
        s3_server.stop()      # fault: the endpoint refuses connections
        s3_server.restart()   # same port, same bucket and objects (moto keeps state in-process)

The fixture creates a fresh bucket, sets ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
``AWS_DEFAULT_REGION`` and ``GRADLAB_S3_ENDPOINT_URL``, yields an :class:`S3Server`, and always
stops the server. Tests that never stop the server can use ``s3_bucket`` instead (import both
``shared_s3_server`` and ``s3_bucket``): a fresh bucket on one session-wide server, which saves the
~0.5 s server stop per test. Outside pytest, use ``with running_s3_server() as server: ...``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Iterator

import pytest

_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "gradlab-test",
    "AWS_SECRET_ACCESS_KEY": "gradlab-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until(port: int, *, listening: bool, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(0.2)
            up = sock.connect_ex(("127.0.0.1", port)) == 0
        if up == listening:
            return
        time.sleep(0.02)
    raise TimeoutError(f"127.0.0.1:{port}: server did not {'start' if listening else 'stop'} in {timeout_s} s")


class S3Server:
    """A moto S3 server on 127.0.0.1 that can be stopped and restarted on the same port."""

    def __init__(self, port: int | None = None, bucket: str | None = None):
        self.port = port or free_port()
        self.bucket = bucket or f"gradlab-test-{secrets.token_hex(4)}"
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._server = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        _wait_until(self.port, listening=True)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
            _wait_until(self.port, listening=False)

    def restart(self) -> None:
        """Start again on the same port; the bucket and its objects are still there."""
        self.stop()
        self.start()

    def create_bucket(self, bucket: str | None = None) -> str:
        import botocore.session

        name = bucket or self.bucket
        client = botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=_CREDENTIALS["AWS_DEFAULT_REGION"],
        )
        client.create_bucket(Bucket=name)
        return name

    def url(self, prefix: str = "") -> str:
        """``s3://<bucket>/<prefix>`` for :func:`gradlab.stores.open_store`."""
        return f"s3://{self.bucket}/{prefix}".rstrip("/")


@contextlib.contextmanager
def running_s3_server(*, set_env: bool = True) -> Iterator[S3Server]:
    """Start a server with a fresh bucket; set credentials and endpoint env; always stop it."""
    saved = {k: os.environ.get(k) for k in (*_CREDENTIALS, "GRADLAB_S3_ENDPOINT_URL")}
    server = S3Server()
    try:
        server.start()
        if set_env:
            os.environ.update(_CREDENTIALS)
            os.environ["GRADLAB_S3_ENDPOINT_URL"] = server.endpoint_url
        server.create_bucket()
        yield server
    finally:
        server.stop()
        if set_env:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture
def s3_server() -> Iterator[S3Server]:
    """A running moto S3 server on 127.0.0.1 with a fresh bucket, of this test alone (stop/restart freely)."""
    with running_s3_server() as server:
        yield server


@pytest.fixture(scope="session")
def shared_s3_server() -> Iterator[S3Server]:
    """One moto server for the whole session (do not stop it; use :func:`s3_bucket` for isolation)."""
    with running_s3_server(set_env=False) as server:
        yield server


@pytest.fixture
def s3_bucket(shared_s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """A fresh bucket on the shared server, with credentials and endpoint set for this test only.

    Returns an :class:`S3Server` view whose ``bucket`` and ``url()`` name the new bucket.
    """
    for key, value in _CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("GRADLAB_S3_ENDPOINT_URL", shared_s3_server.endpoint_url)
    view = S3Server(port=shared_s3_server.port)
    view._server = None  # a view: stopping it is a no-op, the shared server keeps running
    view.create_bucket()
    return view
