"""Receipt fixtures: the three stores on ``file://`` and on a real moto S3 server on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradlab.stores import Stores, open_store
from tests.s3server import s3_bucket, shared_s3_server  # noqa: F401 (pytest fixtures)


@pytest.fixture(params=["file", "s3"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Stores:
    if request.param == "file":
        return Stores(*(open_store((tmp_path / name).as_uri()) for name in ("control", "eval", "model")))
    server = request.getfixturevalue("s3_bucket")
    return Stores(*(open_store(server.url(name)) for name in ("control", "eval", "model")))
