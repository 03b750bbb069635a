"""``gradlab play``: bad sources fail before any server starts; the URL line; Ctrl-C; ``--record``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradlab.cli.app import app
from gradlab.play.session import PlaybackSession
from gradlab.video import count_frames, read_mp4_metadata
from tests.play.conftest import CARTPOLE_RUN_ID, write_cartpole_run

REPO = Path(__file__).resolve().parents[2]


def _gradlab(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradlab.cli.app", *args], capture_output=True, text=True,
                          cwd=REPO, env=os.environ.copy(), timeout=timeout_s)


@pytest.fixture
def local_run(gradlab_home: Path) -> tuple[Path, Path]:
    """The untrained CartPole run inside this test's GRADLAB_HOME (a local run, not in any store)."""
    return write_cartpole_run(gradlab_home / "runs")


def test_unknown_run_step_or_folder_is_one_error_line_and_exit_1(local_run: tuple[Path, Path]) -> None:
    cases = [
        (["gradlab-19990101T000000-deadbeef"], "gradlab-19990101T000000-deadbeef"),
        ([f"{CARTPOLE_RUN_ID}:999"], "no checkpoint at step 999 (steps: 64)"),
        (["/nonexistent/checkpoints/000000000064-0000000000000000"], "no such checkpoint directory"),
        (["--recipe", "CartPole-v1/ppo"], "no run of it with a promoted checkpoint"),
    ]
    for args, expected in cases:
        out = _gradlab("play", *args, "--no-open")
        assert out.returncode == 1, (args, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], (args, out.stderr)
        assert out.stdout == ""  # no URL: no server started


def test_prints_one_url_line_serves_and_exits_cleanly_on_ctrl_c(local_run: tuple[Path, Path]) -> None:
    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "gradlab.cli.app", "play", CARTPOLE_RUN_ID, "--no-open"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=os.environ.copy())
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and f"/runs/{CARTPOLE_RUN_ID}/checkpoints/64#token=" in url
        base, _, token = url.partition("#token=")
        assert len(token) >= 40
        origin = base.split("/runs/")[0]
        page = httpx.get(f"{origin}/api/runs/{CARTPOLE_RUN_ID}/checkpoints/64", headers={"X-Gradlab-Token": token})
        assert page.status_code == 200 and page.json()["sha256"] == json.loads(
            (local_run[1] / "manifest.json").read_text())["sha256"]
        assert httpx.get(f"{origin}/api/projects").status_code == 401
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert "stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_record_writes_the_episodes_as_mp4_with_provenance(local_run: tuple[Path, Path], tmp_path: Path) -> None:
    run_dir, ckpt = local_run
    session = PlaybackSession(ckpt, json.loads((run_dir / "spec.json").read_text()), deterministic=False, seed=3)
    lengths, returns = [], []
    session.reset(3)
    while len(lengths) < 2:
        r = session.step()
        if r.episode:
            lengths.append(r.episode["length"])
            returns.append(r.episode["return"])
    session.close()
    out = tmp_path / "episodes.mp4"
    res = CliRunner().invoke(app, ["play", CARTPOLE_RUN_ID, "--record", str(out), "--episodes", "2", "--stochastic",
                                   "--seed", "3", "--fps", "50"])
    assert res.exit_code == 0, res.output
    assert count_frames(out) == sum(lengths)  # one frame per step: the state each action was taken in
    meta = read_mp4_metadata(out)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert meta["checkpoint_sha256"] == manifest["sha256"] and meta["goal"] == "CartPole-v1"
    assert meta["seed"] == "3" and meta["episodes"] == "2" and meta["policy"] == "stochastic"
    assert [float(x) for x in meta["return"].split(",")] == returns
    bad = CliRunner().invoke(app, ["play", CARTPOLE_RUN_ID, "--record", str(tmp_path / "no" / "x.mp4")])
    assert bad.exit_code == 1 and "does not exist" in bad.output


def test_an_s3_uri_of_another_store_is_refused_not_played_from_the_configured_one(
        local_run: tuple[Path, Path], tmp_path: Path) -> None:
    out_mp4 = tmp_path / "never.mp4"
    uri = f"s3://elsewhere/model/runs/{CARTPOLE_RUN_ID}/checkpoints/000000000064-0000000000000000/"
    out = _gradlab("play", uri, "--record", str(out_mp4))
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {uri}: names the model store s3://elsewhere/model"), lines
    assert "GRADLAB_MODEL_STORE_URL" in lines[0] and not out_mp4.exists()
