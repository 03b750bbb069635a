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

from gradlab.benchmarks.learning import steps_to_acceptance


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
