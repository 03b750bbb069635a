"""Store fixtures: every store test runs against ``file://`` and a real moto S3 server on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradlab.stores import ObjectStore, open_store
from tests.s3server import s3_bucket, shared_s3_server  # noqa: F401 (pytest fixtures)

BACKENDS = ["file", "s3"]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """An empty store of each backend (the s3 one under a prefix, to exercise prefix handling)."""
    if request.param == "file":
        return open_store((tmp_path / "store").as_uri())
    server = request.getfixturevalue("s3_bucket")
    return open_store(server.url("some/prefix"))
