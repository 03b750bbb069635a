"""The player's API answers bad names and bad parameters with a status and one-line detail, never a 500
traceback (no trained run needed: an empty file store and FastAPI's in-process client)."""

from __future__ import annotations

import pytest

from gradlab.play.catalog import Catalog
from gradlab.play.server import TOKEN_HEADER, PlayConfig, create_app
from gradlab.settings import load_settings
from gradlab.stores import open_stores


@pytest.fixture
def client():
    from fastapi.testclient import TestClient

    settings = load_settings()
    config = PlayConfig(catalog=Catalog(stores=open_stores(settings), settings=settings), port=12345, token="t")
    with TestClient(create_app(config), base_url="http://127.0.0.1:12345", raise_server_exceptions=False) as c:
        c.headers[TOKEN_HEADER] = "t"
        yield c


@pytest.mark.parametrize("run_id, found", [
    ("%2e%2e", "'..'"),
    ("a%00b", "control characters"),
    ("a" * 5000, "5000 characters"),
])
def test_a_malformed_run_id_is_400_naming_it(client, run_id: str, found: str) -> None:
    res = client.get(f"/api/runs/{run_id}")
    assert res.status_code == 400 and "run id" in res.json()["detail"] and found in res.json()["detail"], res.text[:300]
    for path in (f"/api/runs/{run_id}/checkpoints/1", f"/api/runs/{run_id}/checkpoints/1/video"):
        res = client.get(path)
        assert res.status_code in (400, 404) and isinstance(res.json()["detail"], str), (path, res.text[:300])


def test_a_negative_video_seed_is_422(client) -> None:
    res = client.get("/api/runs/r/checkpoints/1/video", params={"seed": -5})
    assert res.status_code == 422 and res.json()["detail"][0]["loc"] == ["query", "seed"]


@pytest.mark.parametrize("path", ["/web/a%00b.js", "/web/%00", "/web/pages/%00.js", "/web/..%2f..%2fpyproject.toml"])
def test_an_asset_path_with_a_nul_byte_or_leaving_the_folder_is_404(client, path: str) -> None:
    answer = client.get(path)
    assert (answer.status_code, answer.json()) == (404, {"detail": "no such asset"})
