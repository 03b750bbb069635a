"""Goals as gymnasium environments: gradlab.make_env / make_vector_env."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

import gradlab
from gradlab.envs.goal_env import goal_environment
from gradlab.envs.vector import make_vector_env as gradlab_vector_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("goal", ["CartPole-v1", "Breakout-Atari2600-v0", "gradlab__bandit"])
def test_make_env_passes_gymnasiums_env_checker(goal: str) -> None:
    env = gradlab.make_env(goal, render_mode="rgb_array")
    try:
        check_env(env)
        frame = env.render()
        assert frame.ndim == 3 and frame.shape[2] == 3 and frame.dtype == np.uint8
        assert env.observation_space == env.gradlab_env.single_observation_space
    finally:
        env.close()


def test_single_env_returns_the_true_final_observation_then_the_next_episode() -> None:
    env = gradlab.make_env("CartPole-v1", seed=5)
    own = gradlab_vector_env(goal_environment("CartPole-v1").model_copy(update={"n_envs": 1}), seed=5)
    obs, _ = env.reset()
    np.testing.assert_array_equal(obs, own.reset()[0])
    done = False
    while not done:
        obs, reward, terminated, truncated, info = env.step(0)
        res = own.step(np.array([0]))
        done = terminated or truncated
    assert terminated and info["gradlab_episode"]["outcome"] == "failure"
    np.testing.assert_array_equal(obs, res.final_obs[0])
    obs, _ = env.reset()
    np.testing.assert_array_equal(obs, res.obs[0])  # the lane's next episode, no extra reset
    env.close()
    own.close()


def test_random_loop_over_make_vector_env_matches_gradlabs_vector_env_step_for_step() -> None:
    n, seed = 4, 7
    envs = gradlab.make_vector_env("CartPole-v1", n, seed=seed)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    own = gradlab_vector_env(goal_environment("CartPole-v1").model_copy(update={"n_envs": n}), seed=seed)
    rng = np.random.default_rng(0)
    obs, _ = envs.reset()
    np.testing.assert_array_equal(obs, own.reset())
    ended = 0
    for _ in range(200):
        actions = rng.integers(0, 2, size=n)
        obs, reward, terminated, truncated, info = envs.step(actions)
        res = own.step(actions)
        np.testing.assert_array_equal(obs, res.obs)
        np.testing.assert_array_equal(reward, res.reward)
        np.testing.assert_array_equal(terminated, res.terminated)
        np.testing.assert_array_equal(truncated, res.truncated)
        for lane in np.flatnonzero(terminated | truncated):
            assert info["_final_obs"][lane]
            np.testing.assert_array_equal(info["final_obs"][lane], res.final_obs[lane])
            ended += 1
        assert not info.get("_final_obs", np.zeros(n, bool))[~(terminated | truncated)].any()
    assert ended > 10
    assert envs.observation_space.shape == (n, 4) and envs.action_space.shape == (n,)
    envs.close()
    own.close()


def test_vector_env_runs_under_gymnasium_wrappers() -> None:
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    envs = RecordEpisodeStatistics(gradlab.make_vector_env("gradlab__bandit", 3, seed=1))
    envs.reset(seed=[10, 11, 12])
    _, _, terminated, _, info = envs.step(np.zeros(3, dtype=np.int64))
    assert terminated.all() and (info["episode"]["l"] == 1).all()
    envs.close()


def test_example_loop_learns_the_bandit_and_import_gradlab_stays_light() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "docs/examples/goal_loop.py"), "gradlab__bandit", "--updates", "30"],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    last = float(out.stdout.strip().splitlines()[-1].split()[-1])
    assert last >= 0.9
    probe = ("import sys, gradlab; env = gradlab.make_env('gradlab__bandit'); env.reset(seed=0); "
             "print('torch' in sys.modules, 'prefect' in sys.modules)")
    light = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert light.stdout.split() == ["False", "False"], light.stderr
