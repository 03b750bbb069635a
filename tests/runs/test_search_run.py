"""``gradlab train`` of a Go-Explore recipe through the real flow: its action program is evaluated,
accepted and promoted like a network; the player reads the promoted checkpoint's archive from the
stores; the goal's report page plots the archive's cells and best progress over emulator frames."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import pytest

from gradlab import receipts as rules
from gradlab.stores import open_stores
from tests.browser import artifacts_dir
from tests.runs.conftest import gradlab_env, last_json_line, run_gradlab


@pytest.mark.slow
def test_a_go_explore_run_is_promoted_its_archive_is_served_and_its_report_plots_the_search(
        prefect_api: str, gradlab_home: Path, tmp_path: Path) -> None:
    from PIL import Image

    from gradlab.play.catalog import Catalog
    from gradlab.results.reports import build_site
    from gradlab.settings import load_settings

    env = gradlab_env(prefect_api)
    out = run_gradlab(["train", "gradlab__keydoor/go-explore", "--set", "train.timesteps=8192",
                       "--set", "train.checkpoint_freq=4096", "--json"], env, timeout_s=900)
    receipt = last_json_line(out.stdout)
    assert out.returncode == 0 and receipt["outcome"] == "succeeded", (receipt, out.stderr[-3000:])
    run_id, promoted = receipt["run_id"], receipt["promotion"]
    stores = open_stores()
    assert rules.read_promotion(stores, run_id).checkpoint_sha256 == promoted["sha256"]

    # The player's catalog, over the stores: the promoted checkpoint keeps an archive with a solved lineage.
    settings = load_settings()
    catalog = Catalog(stores=stores, settings=settings)
    page = catalog.playback_page(run_id, promoted["checkpoint_step"])
    assert page.archive and page.promoted and page.error is None
    archive = catalog.archive_page(run_id, promoted["checkpoint_step"])
    assert archive.cell_count > 50 and archive.best is not None and archive.lineage[-1] == archive.best.cell

    # The goal's report page has the search section: one figure of cells and best progress over frames.
    site = build_site(settings, stores, tmp_path / "site", goal="gradlab__keydoor")
    html = next((site.root / p).read_text() for p in site.pages if p.endswith("/gradlab__keydoor.html"))
    assert "<h2>Search: go_explore</h2>" in html
    m = re.search(r"<img class='curves' id='search-go_explore'[^>]* src='data:image/png;base64,([^']+)'", html)
    assert m is not None, "no search figure on the goal page"
    image = Image.open(io.BytesIO(base64.b64decode(m.group(1))))
    image.save(artifacts_dir() / "report-search-go_explore.png")  # kept with the suite's screenshots
    assert image.size[0] > 1000 and len(set(image.convert("L").getdata())) > 8  # a drawn figure, not a blank
