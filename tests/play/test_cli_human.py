"""``gradlab dataset record --agent human``: the command serves the player's play-yourself page,
prints its URL, and ends with the manifest once the episodes have landed (driven here over the
``/api/human`` WebSocket, no browser); Ctrl-C before that stores nothing."""

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
from gradlab.play.protocol import PROTOCOL_VERSION

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _start(name: str) -> tuple[subprocess.Popen, str, str]:
    """The record command (CartPole-v1, one episode, no frames); (process, origin, token) from its URL line."""
    proc = subprocess.Popen([sys.executable, "-m", "gradlab.cli.app", "dataset", "record", name, "--goal",
                             "CartPole-v1", "--agent", "human", "--episodes", "1", "--no-frames", "--no-open",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=os.environ.copy())
    line = proc.stderr.readline().strip()
    assert line.startswith("play 1 episode(s) of CartPole-v1 at http://127.0.0.1:"), line
    url = line.split(" at ", 1)[1]
    base, _, token = url.partition("#token=")
    assert f"/human/CartPole-v1?dataset={name}&episodes=1&frames=0" in base
    return proc, base.split("/human/")[0], token


def test_the_human_agent_serves_the_page_and_prints_the_manifest_once_the_episode_lands(gradlab_home: Path,
                                                                                       tmp_path: Path) -> None:
    from websockets.sync.client import connect

    from gradlab.contracts.dataset import DatasetManifest
    from gradlab.datasets.verify import verify_dataset
    from gradlab.stores import open_dataset_store

    name = "human-cli"
    proc, origin, token = _start(name)
    try:
        port = origin.rsplit(":", 1)[1]
        pressed = 0
        with connect(f"ws://127.0.0.1:{port}/api/human", additional_headers={"Origin": origin}, open_timeout=30,
                     max_size=None) as ws:
            ws.send(json.dumps({"type": "hello", "protocol": PROTOCOL_VERSION, "token": token,
                                "goal_id": "CartPole-v1", "dataset": name, "episodes": 1, "frames": False}))
            published = None
            while published is None:
                msg = ws.recv(timeout=120)
                if isinstance(msg, bytes):
                    continue
                msg = json.loads(msg)
                assert msg["type"] != "error", msg
                if msg["type"] != "step":
                    continue
                published = ((msg.get("episode") or {}).get("recording") or {}).get("published")
                if published is None:
                    assert pressed < 400, "the episode did not end"
                    ws.send(json.dumps({"type": "keys", "held": ["ArrowRight"], "press": True}))
                    pressed += 1
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    manifest = DatasetManifest.model_validate(json.loads(out))
    assert manifest.name == name and manifest.agent.kind == "human" and manifest.sha256 == published
    assert not manifest.frames and len(manifest.episodes) == 1 and manifest.episodes[0].length == pressed
    report = verify_dataset(open_dataset_store(), name, cache=tmp_path / "cache")
    assert report.ok and report.episodes_replayed == 1 and not report.divergences, report


def test_ctrl_c_before_the_episode_ends_stores_no_dataset(gradlab_home: Path) -> None:
    proc, _, _ = _start("human-interrupted")
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    from gradlab.datasets.store import dataset_exists
    from gradlab.stores import open_dataset_store

    assert proc.returncode == 1 and "the player stopped before 1 episode(s) ended; no dataset was stored" in err, err
    assert not dataset_exists(open_dataset_store(), "human-interrupted")


def test_seeds_are_refused_for_a_human_recording(gradlab_home: Path) -> None:
    res = CliRunner().invoke(app, ["dataset", "record", "h", "--goal", "CartPole-v1", "--agent", "human",
                                   "--episodes", "1", "--seeds", "3"])
    assert res.exit_code == 2 and "--seeds" in res.output, res.output
