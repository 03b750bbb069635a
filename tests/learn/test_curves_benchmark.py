"""`gradlab benchmark curves` end to end on the bandit: two sides through the learner, paused and continued."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gradlab.benchmarks.curve_stats import Curve, compare_at
from gradlab.cli.app import app

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_sides_survive_a_pause_and_leave_json_png_and_verdict(tmp_path: Path) -> None:
    out = tmp_path / "curves"
    cmd = [sys.executable, "-m", "gradlab.cli.app", "benchmark", "curves", "--goal", "gradlab__bandit",
           "--side", "sb3.ppo", "--side", "gradlab.ppo", "--steps", "4096", "--seeds", "3", "--jobs", "2",
           "--milestone", "2048", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "COLUMNS": "200"})
    try:
        # As soon as a worker has written its first record (it is about to train), stop the whole group.
        first = [out / "runs" / f"{k}-s3.json" for k in ("sb3.ppo", "gradlab.ppo")]
        deadline = time.monotonic() + 120
        while not any(p.exists() for p in first):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGSTOP)
        time.sleep(2.5)  # the pause under test
        os.killpg(proc.pid, signal.SIGCONT)
        text, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, text

    doc = json.loads((out / "curves.json").read_text())
    assert doc["complete"] and doc["goal"] == "gradlab__bandit" and doc["sides"] == ["sb3.ppo", "gradlab.ppo"]
    runs = {r["side"]: r for r in doc["runs"]}
    for r in runs.values():
        # The first 4096 steps of the recipe's own run: its 16384-step schedules, stopped at 4096.
        assert r["status"] == "done" and r["stop_reason"] == "stop_requested" and r["seed"] == 3
        assert r["schedule_timesteps"] == 16384
        assert r["steps"] == r["final_step"] == 4096
        # The bandit's episodes are one step long: one per lane step, each return 0 or 1, steps in order.
        assert len(r["returns"]) == len(r["episode_steps"]) == 4096
        assert set(r["returns"]) <= {0.0, 1.0} and r["episode_steps"] == sorted(r["episode_steps"])
        assert r["outbox_check"]["match"] is True, r["outbox_check"]  # the learner's own window mean agrees
        assert r["steps_per_s"] == pytest.approx(r["steps"] / (r["seconds"] - r["stalled_s"]))
        assert r["cpu_seconds"] > 0
    from gradlab.benchmarks.curve_sides import Side, side_ref

    # ppo-sb3 for sb3.ppo where the goal has one (main's bandit does), else ppo; ppo for gradlab.ppo.
    assert runs["sb3.ppo"]["ref"] == side_ref("gradlab__bandit", Side.parse("sb3.ppo"))
    assert runs["gradlab.ppo"]["ref"] == "gradlab__bandit/ppo"
    # The pause was seen by the worker that had started (about 2.5 s).
    assert max(r["stalled_s"] for r in runs.values()) >= 1.5
    # Both learn the bandit: the last window's mean raw return is well above chance (1/4).
    assert all(np.mean(r["returns"][-100:]) > 0.6 for r in runs.values())

    # The summary in the JSON is what curve_stats gives on the recorded episodes.
    summary = doc["summary"]
    assert [m["step"] for m in summary["milestones"]] == [2048, 4096]
    ref = [Curve.of(runs["sb3.ppo"]["episode_steps"], runs["sb3.ppo"]["returns"])]
    other = [Curve.of(runs["gradlab.ppo"]["episode_steps"], runs["gradlab.ppo"]["returns"])]
    again = compare_at(4096, ref, other).as_json()
    assert summary["milestones"][-1]["compare"]["gradlab.ppo"] == again
    v = summary["verdicts"]["gradlab.ppo"]
    assert v["kind"] == "episode" and v["final"] == again and "seed noise NOT estimated" in v["text"]
    assert summary["milestones"][-1]["mean"]["sb3.ppo"] == pytest.approx(np.mean(runs["sb3.ppo"]["returns"][-100:]))

    # The printed tables and verdict line.
    assert "up to 2,048 steps" in text and ": final" in text and v["text"][:40] in " ".join(text.split())
    assert "wrote" in text and "curves.json" in text

    # The plot: a real PNG of the figure's size, with lines and bands (many colours, not a blank canvas).
    png = out / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    img = matplotlib.image.imread(png)
    assert img.shape[:2] == (600, 1000)
    colours = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 50 and img[..., :3].std() > 0.05


@pytest.mark.slow
def test_a_recipe_side_records_the_target_origin_curve_of_an_archive_curriculum(tmp_path: Path) -> None:
    """``gradlab.ppo@ppo-archive-curriculum``: episodes started from archived states stay out of the curve,
    as the learner's own ``train/episode/*`` metrics leave them out."""
    out = tmp_path / "curves"
    cmd = [sys.executable, "-m", "gradlab.cli.app", "benchmark", "curves", "--goal", "gradlab__keydoor",
           "--side", "gradlab.ppo@ppo-archive-curriculum", "--steps", "8192", "--seeds", "0", "--out", str(out)]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stdout + res.stderr
    (run,) = json.loads((out / "curves.json").read_text())["runs"]
    assert run["side"] == "gradlab.ppo@ppo-archive-curriculum" and run["ref"] == "gradlab__keydoor/ppo-archive-curriculum"
    assert run["status"] == "done" and run["steps"] == 8192
    # Half the maze's episodes start from the archive (share 0.5): they are counted apart ...
    assert run["archive_episodes"] > 10 and len(run["returns"]) > 10
    # ... and the curve's last window is the learner's own target-origin mean, exactly.
    assert run["outbox_check"]["match"] is True, run["outbox_check"]
    assert (out / "runs" / "gradlab.ppo-ppo-archive-curriculum-s0.json").exists()


def test_a_side_naming_a_recipe_the_goal_lacks_lists_its_recipes() -> None:
    from gradlab.benchmarks.curve_sides import Side, side_ref
    from gradlab.errors import NotFound

    assert side_ref("gradlab__keydoor", Side.parse("gradlab.ppo@go-explore")) == "gradlab__keydoor/go-explore"
    with pytest.raises(NotFound, match=r"gradlab__keydoor has no recipe 'nope'; its recipes: go-explore, jerk"):
        side_ref("gradlab__keydoor", Side.parse("gradlab.ppo@nope"))


def test_run_spec_keeps_the_recipes_schedule_horizon_unless_told() -> None:
    from gradlab.benchmarks.curve_sides import Side, run_spec

    spec = run_spec("Breakout-Atari2600-v0", Side.parse("gradlab.ppo:bf16"), 1, 1_000_000, 2)
    train = spec.recipe.train
    assert spec.recipe_id == "ppo" and train.backend.id == "gradlab.ppo" and spec.seed == 1
    assert train.timesteps == 10_000_000 and spec.checkpoint_freq == 1_000_000  # one final checkpoint only
    assert train.backend.config["precision"] == "bf16" and train.backend.config["threads"] == 2
    assert train.torch_threads == 2 and train.device == "cpu"
    sb3 = run_spec("Breakout-Atari2600-v0", Side.parse("sb3.ppo"), 0, 200_000, 1, horizon="steps")
    assert sb3.recipe_id == "ppo-sb3" and sb3.recipe.train.backend.id == "sb3.ppo"
    assert sb3.recipe.train.timesteps == 200_000
    # The same hyperparameters on both sides.
    keys = ("n_steps", "batch_size", "n_epochs", "learning_rate", "clip_range", "ent_coef", "vf_coef")
    assert {k: sb3.recipe.train.backend.config[k] for k in keys} == {k: train.backend.config[k] for k in keys}
    # A budget past the recipe's: the horizon grows to it.
    assert run_spec("gradlab__bandit", Side.parse("sb3.ppo"), 0, 50_000, 1).recipe.train.timesteps == 50_000


def test_bad_side_seeds_and_unknown_goal_are_one_line_errors() -> None:
    from typer.testing import CliRunner

    res = CliRunner().invoke(app, ["benchmark", "curves", "--side", "sb3.ppo:bf16"])
    assert res.exit_code == 2 and "--side" in res.output and "sb3.ppo trains in fp32 only" in res.output
    res = CliRunner().invoke(app, ["benchmark", "curves", "--side", "sb3.ppo", "--side", "sb3.ppo"])
    assert res.exit_code == 2 and "expected each side once, found sb3.ppo, sb3.ppo" in " ".join(
        res.output.replace("│", " ").split())
    res = CliRunner().invoke(app, ["benchmark", "curves", "--seeds", "0,x"])
    assert res.exit_code == 2 and "--seeds" in res.output
    for seeds, found in ((["0,0"], "0 repeated in '0,0'"), (["1", "0,1"], "1 repeated in '1,0,1'"),
                         (["0,,1"], "an empty item in '0,,1'")):
        res = CliRunner().invoke(app, ["benchmark", "curves", *(a for s in seeds for a in ("--seeds", s))])
        text = " ".join(res.output.replace("│", " ").split())  # rich's error box, wrapped
        assert res.exit_code == 2 and "--seeds" in text and found in text, res.output
    # The unknown goal is reported as `gradlab train` reports it (Experiments.goal_path).
    res = CliRunner().invoke(app, ["benchmark", "curves", "--goal", "NoSuchGoal-v0", "--steps", "10"])
    assert res.exit_code != 0 and "unknown goal 'NoSuchGoal-v0'" in str(res.exception)
    assert "known goals" in str(res.exception) or "did you mean" in str(res.exception)


@pytest.mark.slow
def test_sigint_to_the_command_alone_stops_its_runs_and_starts_no_queued_one(tmp_path: Path) -> None:
    out = tmp_path / "curves"
    cmd = [sys.executable, "-m", "gradlab.cli.app", "benchmark", "curves", "--goal", "gradlab__bandit",
           "--side", "gradlab.ppo", "--steps", "1000000", "--seeds", "0,1", "--jobs", "1", "--out", str(out)]
    # Started as a shell without job control starts a background command: SIGINT ignored on entry.
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "COLUMNS": "200"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        first = out / "runs" / "gradlab.ppo-s0.json"
        deadline = time.monotonic() + 120
        while not first.exists():  # the first run is about to train
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)  # the command only, not its group
        text, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, text
    doc = json.loads((out / "curves.json").read_text())
    assert doc["complete"] is False
    runs = {r["seed"]: r for r in doc["runs"]}
    assert runs[0]["status"] == "stopped" and runs[0]["stop_reason"] == "sigterm" and runs[0]["steps"] < 1_000_000
    assert runs[1]["status"] == "not run" and runs[1]["steps"] == 0
    assert not (out / "runs" / "gradlab.ppo-s1.json").exists() and not (out / "runs" / "gradlab.ppo-s1.log").exists()
    assert doc["judged_at"] == runs[0]["steps"]
    flat = " ".join(text.split())
    assert f"interrupted: 1 stopped, 1 not run; the comparison is judged at {runs[0]['steps']:,} env steps" in flat
    assert f"(interrupted: judged at {runs[0]['steps']:,} env steps): final" in flat
