"""Recorded dataset episodes in the player: ``gradlab dataset play`` refuses what it cannot show, the
catalog and the reports list a goal's datasets, and a replay's frames are the recording's (decoded
from its verified MP4), re-simulated for a deterministic goal recorded without frames, or said to be
missing for a sticky one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gradlab.cli.app import app
from gradlab.errors import IntegrityError
from gradlab.play.worker import encode_jpeg
from gradlab.stores import keys
from tests.play.conftest import RecordedDataset, record_dataset


def _use(monkeypatch, dataset: RecordedDataset) -> None:
    monkeypatch.setenv("GRADLAB_DATASET_STORE_URL", dataset.store_url)


def _play(*args: str):
    return CliRunner().invoke(app, ["dataset", "play", *args, "--no-open"], catch_exceptions=False)


def test_dataset_play_refuses_a_missing_dataset_an_episode_out_of_range_and_a_damaged_frames_file(
        breakout_dataset: RecordedDataset, monkeypatch, tmp_path: Path) -> None:
    _use(monkeypatch, breakout_dataset)
    missing = _play("no-such-dataset")
    assert missing.exit_code == 1
    assert "dataset 'no-such-dataset': no " in missing.output and "gradlab dataset list" in missing.output
    out_of_range = _play("breakout-random", "--episode", "2")
    assert out_of_range.exit_code == 1
    assert "dataset 'breakout-random': no episode 2 (expected an episode index in 0..1, 2 episodes)" in out_of_range.output
    assert _play("breakout-random", "--episode", "-1").exit_code == 2  # a malformed command line: usage

    m = breakout_dataset.manifest
    copy = tmp_path / "store"
    shutil.copytree(Path(breakout_dataset.store_url.removeprefix("file://")), copy)
    frames = copy / keys.dataset_file(m.name, m.recording_id, m.episodes[1].frames_file)
    data = bytearray(frames.read_bytes())
    data[len(data) // 2] ^= 0x01
    frames.write_bytes(bytes(data))
    monkeypatch.setenv("GRADLAB_DATASET_STORE_URL", copy.as_uri())
    damaged = _play("breakout-random", "--episode", "1")
    assert damaged.exit_code == 1
    assert f"{m.episodes[1].frames_file}: sha256 expected {m.files[m.episodes[1].frames_file].sha256}" in damaged.output

    # An episode whose offsets point past its shard is refused before serving, as verify refuses it.
    shutil.rmtree(copy)
    shutil.copytree(Path(breakout_dataset.store_url.removeprefix("file://")), copy)
    manifest_file = next(copy.rglob(f"{m.name}/manifest.json"))
    body = json.loads(manifest_file.read_text())
    body["episodes"][1]["step_offset"] = body["episodes"][1]["observation_offset"] = 100_000
    manifest_file.write_text(json.dumps(body))
    shifted = _play("breakout-random", "--episode", "1")
    assert shifted.exit_code == 1 and "the shard has fewer" in shifted.output, shifted.output
    out = tmp_path / "hf-export"  # and an export of it leaves no partial folder behind
    export = CliRunner().invoke(app, ["dataset", "export", "breakout-random", "--format", "hf", "--out", str(out)])
    assert export.exit_code == 1 and "the shard has fewer" in export.output and not out.exists(), export.output


def test_the_goal_page_and_the_report_list_the_goals_datasets(breakout_dataset: RecordedDataset, monkeypatch,
                                                              tmp_path: Path) -> None:
    from gradlab.play.catalog import Catalog
    from gradlab.results.reports import build_site
    from gradlab.settings import load_settings
    from gradlab.stores import open_stores

    _use(monkeypatch, breakout_dataset)
    settings = load_settings()
    catalog = Catalog(stores=open_stores(settings), settings=settings)
    (row,) = catalog.goal_page("atari", "Breakout-Atari2600-v0").datasets
    m = breakout_dataset.manifest
    assert (row.name, row.episodes, row.steps, row.agent, row.frames) == (
        "breakout-random", 2, sum(e.length for e in m.episodes), "random", True)
    assert catalog.goal_page("atari", "MsPacman-Atari2600-v0").datasets == []
    page = catalog.dataset_page("breakout-random")
    assert page.project == "atari" and [e.index for e in page.episodes] == [0, 1]
    assert [e.length for e in page.episodes] == [e.length for e in m.episodes]

    site = build_site(settings, open_stores(settings), tmp_path / "site")  # no sealed run: the datasets' goal only
    assert site.pages == ("index.html", "atari/Breakout-Atari2600-v0.html")
    html = (tmp_path / "site" / "atari" / "Breakout-Atari2600-v0.html").read_text()
    assert "<td>breakout-random</td><td>random</td><td>2</td>" in html
    assert "gradlab dataset play breakout-random --episode 0" in html
    assert "(0 runs, 1 dataset)" in (tmp_path / "site" / "index.html").read_text()

    monkeypatch.setenv("GRADLAB_DATASET_STORE_URL", "ftp://nowhere/datasets")  # a store that cannot be read
    settings = load_settings()
    page = Catalog(stores=open_stores(settings), settings=settings).goal_page("atari", "Breakout-Atari2600-v0")
    assert page.datasets == [] and "ftp://nowhere/datasets: unsupported store URL" in page.datasets_error


def test_replay_frames_are_the_recorded_mp4s_and_steps_the_recorded_arrays(breakout_dataset: RecordedDataset,
                                                                          monkeypatch) -> None:
    from gradlab.datasets.store import load_steps
    from gradlab.play.replay import ReplaySession, prepare_replay
    from gradlab.settings import load_settings
    from gradlab.video import read_frames

    _use(monkeypatch, breakout_dataset)
    manifest, folder = prepare_replay(load_settings(), "breakout-random", 0)
    session = ReplaySession(folder, manifest.sha256, 0, encode=encode_jpeg)
    info = session.info()
    steps = load_steps(folder, manifest.episodes[0])
    assert info["frames"] == "recorded" and info["n_frames"] == manifest.episodes[0].length
    assert info["action_meanings"] == ["NOOP", "FIRE", "RIGHT", "LEFT"]
    assert info["steps"]["actions"] == steps["actions"].tolist()
    assert info["steps"]["rewards"] == [float(x) for x in steps["rewards"]]
    assert info["steps"]["returns"][-1] == pytest.approx(manifest.episodes[0].return_)
    assert info["provenance"]["seed"] == manifest.episodes[0].seed and info["provenance"]["agent"] == "random"
    first = next(read_frames(folder / manifest.episodes[0].frames_file, max_frames=1))
    assert session.frames(0, 1) == [(0, encode_jpeg(first))]
    with pytest.raises(Exception, match="expected start >= 0 and 1 <= n <= 64"):
        session.frames(0, 65)
    with pytest.raises(Exception, match="sha256"):  # a copy whose manifest is not the verified one
        ReplaySession(folder, "0" * 64, 0, encode=encode_jpeg)
    frames = folder / manifest.episodes[0].frames_file  # the copy changed after it was verified
    data = bytearray(frames.read_bytes())
    data[-100] ^= 0x01
    frames.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=f"{frames}: sha256 differs from the manifest's"):
        ReplaySession(folder, manifest.sha256, 0, encode=encode_jpeg)


def test_a_deterministic_goal_recorded_without_frames_is_re_simulated_a_sticky_one_says_it_has_none(
        tmp_path: Path, monkeypatch) -> None:
    from gradlab.play.replay import ReplaySession, prepare_replay
    from gradlab.settings import load_settings

    cartpole = record_dataset(tmp_path / "cartpole", "cartpole-noframes", "CartPole-v1", episodes=1, frames=False)
    _use(monkeypatch, cartpole)
    manifest, folder = prepare_replay(load_settings(), "cartpole-noframes", 0)
    session = ReplaySession(folder, manifest.sha256, 0, encode=encode_jpeg)
    assert session.frames_source == "re-simulated" and "diverges" not in session.frames_note
    assert session.n_frames == manifest.episodes[0].length
    (t, jpeg), = session.frames(0, 1)
    assert t == 0 and jpeg[:2] == b"\xff\xd8"

    breakout = record_dataset(tmp_path / "breakout", "breakout-noframes", "Breakout-Atari2600-v0", episodes=1,
                              frames=False)
    _use(monkeypatch, breakout)
    manifest, folder = prepare_replay(load_settings(), "breakout-noframes", 0)
    session = ReplaySession(folder, manifest.sha256, 0, encode=encode_jpeg)
    assert session.frames_source == "none" and session.n_frames == 0
    assert "recorded without frames" in session.frames_note and "sticky actions" in session.frames_note
    assert np.asarray(session.info()["steps"]["actions"]).shape == (manifest.episodes[0].length,)


def test_dataset_play_prints_the_episodes_url_serves_it_and_stops_on_ctrl_c(
        breakout_dataset: RecordedDataset, monkeypatch) -> None:
    import os
    import signal
    import subprocess
    import sys

    import httpx

    _use(monkeypatch, breakout_dataset)
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "gradlab.cli.app", "dataset", "play", "breakout-random",
                             "--episode", "1", "--no-open"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=repo, env=os.environ.copy())
    try:
        url = proc.stdout.readline().strip()
        base, _, token = url.partition("#token=")
        assert base.startswith("http://127.0.0.1:") and base.endswith("/datasets/breakout-random/episodes/1")
        origin = base.split("/datasets/")[0]
        page = httpx.get(f"{origin}/api/datasets/breakout-random", headers={"X-Gradlab-Token": token}, timeout=60)
        assert page.status_code == 200 and page.json()["summary"]["sha256"] == breakout_dataset.manifest.sha256
        assert httpx.get(base, timeout=60).status_code == 200  # the page itself (the token stays in the fragment)
        assert httpx.get(f"{origin}/api/datasets/breakout-random", timeout=60).status_code == 401
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert "stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
