"""`gradlab benchmark learning` finds the first accepted checkpoint with the goal's own evaluation."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradlab.benchmarks.learning import SeedResult, parity, render, run, steps_to_acceptance


def test_gradlab_ppo_reaches_the_bandit_goals_acceptance(tmp_path: Path) -> None:
    # The bandit recipe (sb3.ppo's hyperparameters) switched to gradlab.ppo; checkpoints every 2048 steps.
    row = steps_to_acceptance("gradlab__bandit/ppo", "gradlab.ppo", seed=0, checkpoint_freq=2048, work=tmp_path)
    assert row.backend == "gradlab.ppo" and math.isfinite(row.steps_to_accept)
    assert row.steps_to_accept % 2048 == 0 and row.steps_to_accept <= 16384
    assert row.evaluated == row.steps_to_accept // 2048  # every earlier checkpoint was evaluated and rejected
    assert row.best_return > 0


def test_gradlab_ppo_reaches_acrobots_acceptance_within_twice_sb3s_median(tmp_path: Path) -> None:
    # The normalised goal whose parity was in question (docs/BENCHMARKS.md: both backends accept at
    # 32,768 steps on seeds 0-3, 49,152 on seed 4). One seed, with a margin of two: 65,536 steps.
    row = steps_to_acceptance("Acrobot-v1/ppo", "gradlab.ppo", seed=1, checkpoint_freq=16384, work=tmp_path,
                              max_steps=65536)
    assert math.isfinite(row.steps_to_accept), f"not accepted by 65,536 steps (best mean return {row.best_return})"
    assert row.steps_to_accept <= 65536 and row.best_return >= -100


def test_gradlab_ppo_reaches_cartpoles_acceptance_within_twice_sb3s_median(tmp_path: Path) -> None:
    # The un-normalised classic-control goal (docs/BENCHMARKS.md: sb3.ppo's median over 5 seeds is
    # 16,384 steps). One seed, with a margin of two: 32,768 steps.
    row = steps_to_acceptance("CartPole-v1/ppo", "gradlab.ppo", seed=3, checkpoint_freq=8192, work=tmp_path,
                              max_steps=32768)
    assert math.isfinite(row.steps_to_accept), f"not accepted by 32,768 steps (best mean return {row.best_return})"
    assert row.steps_to_accept <= 32768 and row.best_return >= 475


@pytest.mark.slow
def test_gradlab_ppo_reaches_mountaincars_acceptance_within_twice_sb3s_median(tmp_path: Path) -> None:
    # docs/BENCHMARKS.md: sb3.ppo's median over seeds 0-4 is 327,680 steps; gradlab.ppo accepted seed
    # 1 at 360,448. One seed, with a margin of two: 655,360 steps.
    row = steps_to_acceptance("MountainCar-v0/ppo", "gradlab.ppo", seed=1, checkpoint_freq=32768, work=tmp_path,
                              max_steps=655360)
    assert math.isfinite(row.steps_to_accept), f"not accepted by 655,360 steps (best mean return {row.best_return})"
    assert row.steps_to_accept <= 655360 and row.best_return >= -110


@pytest.mark.slow
def test_gradlab_ppo_reaches_lunarlanders_acceptance_within_its_budget(tmp_path: Path) -> None:
    # docs/BENCHMARKS.md: both backends' median over seeds 0-4 is 557,056 steps of the 1M budget;
    # gradlab.ppo accepted seed 4 at 360,448. One seed, within 1.3x that median: 720,896 steps.
    row = steps_to_acceptance("LunarLander-v3/ppo", "gradlab.ppo", seed=4, checkpoint_freq=32768, work=tmp_path,
                              max_steps=720896)
    assert math.isfinite(row.steps_to_accept), f"not accepted by 720,896 steps (best mean return {row.best_return})"
    assert row.steps_to_accept <= 720896 and row.best_return >= 200


def test_sigterm_ends_the_benchmark_not_only_the_run_it_trains(tmp_path: Path) -> None:
    """The learner takes SIGTERM (and Ctrl-C) for its run; in-process, the benchmark stops with it
    instead of going on to the next seed."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, "-m", "gradlab.cli.app", "benchmark", "learning", "--ref",
                             "CartPole-v1/ppo", "--seeds", "5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob("gradlab-learning-*/*/outbox.sqlite")):  # training has started
            assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.1)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and time.monotonic() - signalled < 120
    assert "learning parity" not in out and "stopped by SIGTERM or Ctrl-C" in out + err
    assert not list(tmp_path.glob("gradlab-learning-*"))  # its work folder removed


def _rows(sb3: list[float], gradlab: list[float], evaluated: int = 1) -> list[SeedResult]:
    return ([SeedResult("sb3.ppo", i, x, evaluated, 0.0, 1.0) for i, x in enumerate(sb3)]
            + [SeedResult("gradlab.ppo", i, x, evaluated, 0.0, 1.0) for i, x in enumerate(gradlab)])


def test_parity_ranks_a_seed_never_accepted_after_every_accepted_one() -> None:
    inf = float("inf")
    same = parity(_rows([8192, 16384, 24576], [8192, 16384, 24576]))
    assert same["holds"] and same["ratio"] == 1.0 and same["sooner"]["value"] == 0.5 and same["shown"] == "none"
    # gradlab.ppo sooner on every pair but one tie (its seed 2 at 24,576 against sb3.ppo's seed 0 never accepting).
    later = parity(_rows([inf, inf, inf, 32768, 32768, 32768], [8192, 8192, 8192, 8192, 16384, 24576]))
    assert later["median"] == {"sb3.ppo": inf, "gradlab.ppo": 8192.0} and later["holds"]
    assert later["sooner"]["value"] == 1.0 and later["shown"] == "gradlab.ppo"
    worse = parity(_rows([8192] * 6, [inf] * 6))
    assert not worse["holds"] and worse["sooner"]["value"] == 0.0 and worse["shown"] == "sb3.ppo"
    one = parity(_rows([8192], [16384]))
    assert one["sooner"]["low"] is None and one["shown"] == "none" and one["ratio"] == 2.0


def test_the_verdict_names_its_seeds_and_a_figure_that_is_only_the_checkpoint_spacing(capsys) -> None:
    render(_rows([2048, 2048], [2048, 2048]), "gradlab__bandit/ppo", as_json=False)
    out = " ".join(capsys.readouterr().out.split())
    assert "gradlab.ppo's median <= sb3.ppo's over 2 seeds: met" in out
    assert "every seed was accepted at its first checkpoint" in out
    render(_rows([8192], [16384], evaluated=2), "CartPole-v1/ppo", as_json=False)
    out = " ".join(capsys.readouterr().out.split())
    assert "over 1 seed: not met" in out and "no interval with one seed per side (--seeds 2 or more)" in out
    assert "gradlab sweep" not in out and "first checkpoint" not in out


def test_nothing_accepted_is_undecided_and_the_json_is_strict(capsys) -> None:
    import json

    inf = float("inf")
    figures = parity(_rows([inf, inf], [inf, inf], evaluated=3))
    assert figures["holds"] is None and figures["ratio"] is None
    render(_rows([inf, inf], [inf, inf], evaluated=3), "CartPole-v1/ppo", as_json=False)
    assert "undecided (neither side's median seed was accepted" in " ".join(capsys.readouterr().out.split())
    render(_rows([inf, 8192], [inf, inf], evaluated=3), "CartPole-v1/ppo", as_json=True)
    doc = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert doc["median"]["gradlab.ppo"] is None and doc["rows"][0]["steps_to_accept"] is None


def test_parallel_jobs_give_the_steps_one_process_gives(tmp_path: Path) -> None:
    serial = run("gradlab__bandit/ppo", seeds=2, checkpoint_freq=1024, first_seed=3)
    parallel = run("gradlab__bandit/ppo", seeds=2, checkpoint_freq=1024, first_seed=3, jobs=2)
    assert [(r.seed, r.backend) for r in parallel] == [(3, "sb3.ppo"), (3, "gradlab.ppo"), (4, "sb3.ppo"),
                                                      (4, "gradlab.ppo")]
    assert [r.steps_to_accept for r in parallel] == [r.steps_to_accept for r in serial]
    assert all(math.isfinite(r.steps_to_accept) for r in parallel)


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _benchmark(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen([sys.executable, "-m", "gradlab.cli.app", "benchmark", "learning", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_an_unknown_goal_or_a_recipe_that_is_not_ppo_is_one_line_before_any_job_starts(tmp_path: Path) -> None:
    out, err = _benchmark(tmp_path, "--ref", "nosuch/ppo", "--jobs", "2").communicate(timeout=300)
    assert "unknown goal 'nosuch'" in err and "Traceback" not in err and not list(tmp_path.glob("gradlab-learning-*"))
    proc = _benchmark(tmp_path, "--ref", "CartPole-v1/a2c", "--jobs", "2")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "CartPole-v1/a2c trains sb3.a2c: benchmark learning compares PPO recipes" in err
    assert "Traceback" not in err and not list(tmp_path.glob("gradlab-learning-*"))
    proc = _benchmark(tmp_path, "--first-seed", "1048576", "--seeds", "2")  # past the largest run seed
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2 and "expected seeds up to 1048576" in " ".join(err.replace("│", " ").split())


def _with_two_jobs_training(tmp_path: Path, act) -> tuple[int, list[int], str, str, float]:
    """Start a 5-seed CartPole benchmark with 2 jobs, wait until both train, ``act(proc, workers)``;
    the exit code, the workers' pids, stdout, stderr and the seconds from the act to the exit."""
    proc = _benchmark(tmp_path, "--ref", "CartPole-v1/ppo", "--seeds", "5", "--jobs", "2")
    try:
        deadline = time.monotonic() + 300
        while len(list(tmp_path.glob("gradlab-learning-*/*/outbox.sqlite"))) < 2:  # both jobs are training
            assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.1)
        workers = [pid for pid in _children(proc.pid) if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(workers) == 2
        acted = time.monotonic()
        act(proc, workers)
        out, err = proc.communicate(timeout=120)
        return proc.returncode, workers, out, err, time.monotonic() - acted
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_stops_every_parallel_job(tmp_path: Path) -> None:
    code, workers, out, err, _ = _with_two_jobs_training(tmp_path, lambda proc, _: proc.send_signal(signal.SIGTERM))
    assert code == 130 and "learning parity" not in out and "stopped by SIGTERM or Ctrl-C" in err
    assert not list(tmp_path.glob("gradlab-learning-*"))  # its work folder removed
    assert not [pid for pid in workers if _running(pid)]  # no job outlives it


def test_sigterm_ends_the_benchmark_with_a_stopped_job_at_once(tmp_path: Path) -> None:
    def stop_one_then_the_benchmark(proc, workers) -> None:
        os.kill(workers[0], signal.SIGSTOP)
        proc.send_signal(signal.SIGTERM)

    code, workers, _, _, seconds = _with_two_jobs_training(tmp_path, stop_one_then_the_benchmark)
    assert code == 130 and seconds < 45  # not the 60 s join of a stopped worker
    assert not [pid for pid in workers if _running(pid)] and not list(tmp_path.glob("gradlab-learning-*"))


def test_a_killed_job_stops_the_benchmark_at_once(tmp_path: Path) -> None:
    code, workers, _, err, _ = _with_two_jobs_training(tmp_path, lambda _, workers: os.kill(workers[0], signal.SIGKILL))
    # the other job's remaining pairs are not trained first
    assert code == 1 and f"worker pid {workers[0]} ended with exit code -9" in err, err[-2000:]
    assert "Traceback" not in err and not list(tmp_path.glob("gradlab-learning-*"))
    assert not [pid for pid in workers if _running(pid)]
