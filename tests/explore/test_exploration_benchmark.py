"""`gradlab benchmark exploration` end to end on the key-door maze: Go-Explore to the goal, then random actions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_go_explore_reaches_the_maze_goal_and_random_actions_get_as_many_steps(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    # A budget 8x the recipe's: the search reaches the goal near 5,600 steps and, on a quiet machine, runs
    # ~10k steps a second, so a stop request read every WATCH_S (while the watcher also writes the JSON and the
    # plot) lands well before 131,072 steps; within the recipe's 16,384 it often did not.
    cmd = [sys.executable, "-m", "gradlab.cli.app", "benchmark", "exploration", "--goal", "gradlab__keydoor",
           "--score", "1.0", "--seeds", "0", "--steps", "131072", "--out", str(out)]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads((out / "exploration.json").read_text())
    assert doc["complete"] and doc["budget"] == 131072 and doc["backend"] == "gradlab.go_explore"
    (run,) = doc["runs"]
    search, rnd = run["search"], run["random"]
    reached = search["reached_step"]
    # The first rollout whose best trajectory reached the goal (1.0, plus the key's 0.1) is the one recorded ...
    steps = np.array([s for s, _ in search["series"]])
    best = np.array([b for _, b in search["series"]])
    first = int(steps[np.argmax(best >= 1.0)])
    assert reached == first and best[steps < reached].max() < 1.0
    assert np.all(np.diff(best) >= 0) and np.all(np.diff(steps) > 0)  # a best-so-far, one point per rollout
    # ... and the learner stopped on the benchmark's outbox request, well before its budget.
    assert search["stop_reason"] == "stop_requested" and reached <= search["final_step"] < 131072
    # Random actions get exactly as many agent steps, and on this maze find the key at best.
    assert rnd["status"] == "done" and rnd["steps"] == rnd["budget"] == reached
    assert rnd["reached_step"] is None and rnd["best"] < 1.0 and rnd["episodes"] > 0
    assert run["status"] == "done"
    # The table and the plot.
    text = " ".join(res.stdout.split())
    assert f"{reached:,}" in text and "wrote" in text
    assert (out / "exploration.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_search_that_ends_before_the_watchers_first_read_is_still_recorded(tmp_path: Path) -> None:
    """One rollout's budget and a score its first rollout reaches: the watcher's last read finds it."""
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "gradlab.cli.app", "benchmark", "exploration", "--goal", "gradlab__keydoor",
           "--score", "0", "--steps", "512", "--seeds", "0", "--out", str(out)]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stdout + res.stderr
    (run,) = json.loads((out / "exploration.json").read_text())["runs"]
    search = run["search"]
    assert search["metric"] == "train/algorithm/go_explore/best/return"
    assert search["reached_step"] == 512 == search["final_step"] and search["series"][0][0] == 512
    assert run["random"]["steps"] == 512 and run["status"] == "done"


def test_bad_arguments_are_refused_by_name_before_anything_runs(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gradlab.cli.app import app

    def invoke(*args: str):
        res = CliRunner().invoke(app, ["benchmark", "exploration", "--goal", "gradlab__keydoor", *args])
        return res, " ".join((res.output + str(res.exception or "")).replace("│", " ").split())

    res, text = invoke("--recipe", "ppo", "--out", str(tmp_path / "a"))
    assert res.exit_code != 0 and "expected a search recipe" in text and not (tmp_path / "a").exists()
    for args, found in ((["--seeds", "0,x"], "--seeds"), (["--seeds", "-1"], "expected seeds in 0..1048576, found -1"),
                        (["--seeds", "0,0"], "0 repeated"), (["--score", "nan"], "expected a finite number, found nan"),
                        (["--score", "-inf"], "found -inf")):
        res, text = invoke(*args)
        assert res.exit_code == 2 and found in text, text
    in_the_way = tmp_path / "file"
    in_the_way.write_text("keep me")
    res, text = invoke("--out", str(in_the_way))
    assert res.exit_code != 0 and "expected a folder that can be created" in text and in_the_way.read_text() == "keep me"
