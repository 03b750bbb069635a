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


@pytest.mark.parametrize("grouped", [False, True])
def test_an_episode_restored_from_an_archived_state_is_kept_out_of_the_curve(grouped: bool) -> None:
    """EpisodeLog counts the episode a restore began as archive-origin, once, on a lane env and on lane groups."""
    from gradlab.benchmarks.curve_worker import EpisodeLog
    from gradlab.contracts.experiments import Experiments
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.envs import make_vector_env
    from gradlab.envs.groups import make_lane_groups
    from gradlab.learn.ppo_curriculum import lane_env

    spec = RunSpec.from_resolved(Experiments().resolve("gradlab__keydoor/ppo"), seed=0)
    venv = make_lane_groups(spec.environment, seed=0, groups=2) if grouped else make_vector_env(spec.environment, seed=0)
    log = EpisodeLog(venv)
    ends: list[tuple[int, int]] = []  # (lane steps so far, lane) of every episode end, as the envs report them
    try:
        log.reset()
        actions = np.zeros(venv.num_envs, dtype=np.int64)  # into a wall: every episode times out at 150 steps

        def steps(k: int) -> None:
            for _ in range(k):
                res = log.step(actions)
                ends.extend((log.steps, ep.lane) for ep in res.episodes)

        steps(40)
        env, local = lane_env(log, 5)  # how the curriculum reaches a lane (a group, or this env)
        state = env.capture_lane(local)  # lane 5, 40 steps into its episode
        steps(110)  # every lane's first episode ends (target origin)
        env.restore_lane(local, state)  # lane 5's second episode starts 40 steps in
        steps(150)
    finally:
        log.close()
    n = venv.num_envs
    assert sorted(ends) == sorted([(150 * n, lane) for lane in range(n)] + [(260 * n, 5)]
                                  + [(300 * n, lane) for lane in range(n) if lane != 5])
    assert log.archive_episode_steps == [260 * n] and log.archive_returns == [0.0]
    assert log.episode_steps == [150 * n] * n + [300 * n] * (n - 1) and len(log.returns) == 2 * n - 1


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
                         (["0,,1"], "an empty item in '0,,1'"), (["-1"], "expected seeds in 0..1048576, found -1"),
                         (["1048577"], "found 1048577")):
        res = CliRunner().invoke(app, ["benchmark", "curves", *(a for s in seeds for a in ("--seeds", s))])
        text = " ".join(res.output.replace("│", " ").split())  # rich's error box, wrapped
        assert res.exit_code == 2 and "--seeds" in text and found in text, res.output
    res = CliRunner().invoke(app, ["benchmark", "curves", "--side", "gradlab.ppo:@ppo"])
    assert res.exit_code == 2 and "expected a precision after ':'" in " ".join(res.output.replace("│", " ").split())


def test_a_side_that_cannot_train_or_trains_twice_and_an_out_in_the_way_are_refused(tmp_path: Path) -> None:
    from gradlab.benchmarks.curve_sides import Side
    from gradlab.benchmarks.curves import run
    from gradlab.errors import ConfigError

    with pytest.raises(ConfigError, match=r"recipe gradlab__keydoor/go-explore trains gradlab.go_explore; a curves "
                                          r"side trains sb3.ppo or gradlab.ppo"):
        run("gradlab__keydoor", [Side.parse("gradlab.ppo@go-explore")], [0], 10, out=tmp_path / "a")
    with pytest.raises(ConfigError, match=r"gradlab.ppo and gradlab.ppo@ppo train the same recipe \(gradlab__keydoor/ppo\)"):
        run("gradlab__keydoor", [Side.parse("gradlab.ppo"), Side.parse("gradlab.ppo@ppo")], [0], 10, out=tmp_path / "b")
    in_the_way = tmp_path / "file"
    in_the_way.write_text("keep me")
    with pytest.raises(ConfigError, match=r"--out .*file: expected a folder that can be created"):
        run("gradlab__keydoor", [Side.parse("gradlab.ppo")], [0], 10, out=in_the_way)
    assert in_the_way.read_text() == "keep me" and not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_unknown_goal_is_reported_as_train_reports_it() -> None:
    from typer.testing import CliRunner

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
