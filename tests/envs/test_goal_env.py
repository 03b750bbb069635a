"""Goals as gymnasium environments: gradlab.make_env / make_vector_env.

The goals cover every kind of provider a user meets: gymnasium's registry (CartPole-v1), gradlab's
built-in (the bandit), ALE (Breakout; ale-py ships the ROM) and ViZDoom (basic; vizdoom ships the
scenario). gymnasium's own code does the checking: its env checker, its vector-env info batching
(``VectorEnv._add_info``), ``SyncVectorEnv`` and ``RecordEpisodeStatistics``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers.vector import RecordEpisodeStatistics

import gradlab
from gradlab.envs.goal_env import goal_environment
from gradlab.envs.vector import make_vector_env as gradlab_vector_env
from gradlab.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
GOALS = ["CartPole-v1", "gradlab__bandit", "Breakout-Atari2600-v0", "VizdoomBasic-v1"]


@pytest.mark.parametrize("goal", GOALS)
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


def _info_dtypes(infos: dict, prefix: str = "") -> dict[str, tuple]:
    """Key path -> (dtype, shape per lane) of every array in a batched gymnasium info dict."""
    out: dict[str, tuple] = {}
    for key, value in infos.items():
        if isinstance(value, dict):
            out |= _info_dtypes(value, f"{prefix}{key}/")
        else:
            out[prefix + key] = (np.asarray(value).dtype, np.asarray(value).shape[1:])
    return out


def _run_through_episode_ends(envs: gym.vector.VectorEnv, *, episodes_per_lane: int, max_steps: int):
    """Random actions until every lane ended ``episodes_per_lane`` episodes; yields (step infos, done mask)."""
    rng = np.random.default_rng(0)
    ended = np.zeros(envs.num_envs, dtype=np.int64)
    for _ in range(max_steps):
        actions = rng.integers(0, envs.single_action_space.n, size=envs.num_envs)
        _, _, terminated, truncated, info = envs.step(actions)
        done = terminated | truncated
        ended += done
        yield info, done
        if (ended >= episodes_per_lane).all():
            return
    raise AssertionError(f"{max_steps} steps ended only {ended.tolist()} episodes per lane")


@pytest.mark.parametrize("goal", GOALS)
def test_gymnasium_batches_the_episode_record_with_one_dtype_per_key_through_many_episode_ends(goal: str) -> None:
    # Lanes end at different steps, so one step mixes a lane's first episode (seeded) with another's
    # later one (no seed): gymnasium types each key's array by the first lane that reports it and
    # failed with "int() argument must be ... not 'NoneType'" when seed was None there.
    n, seed = 3, 2
    envs = RecordEpisodeStatistics(gradlab.make_vector_env(goal, n, seed=seed))
    envs.reset()
    seen: dict[str, tuple] = {}
    seeds: list[list[int]] = [[] for _ in range(n)]
    starts: set[str] = set()
    for info, done in _run_through_episode_ends(envs, episodes_per_lane=2, max_steps=2000):
        for key, dtype in _info_dtypes(info).items():
            assert seen.setdefault(key, dtype) == dtype, f"{key}: {seen[key]} earlier, {dtype} now"
        if not done.any():
            continue
        record = info["final_info"]["gradlab_episode"]
        assert (info["_final_info"] == done).all() and (record["_seed"] == done).all()
        for lane in np.flatnonzero(done):
            seeds[lane].append(int(record["seed"][lane]))
            # gymnasium's own episode statistics agree with gradlab's record (shaped return, length).
            assert record["return"][lane] == pytest.approx(info["episode"]["r"][lane], rel=1e-5)
            assert record["length"][lane] == info["episode"]["l"][lane]
            assert record["lane"][lane] == lane
            starts.add(record.get("start", [None] * n)[lane])
    envs.close()
    assert starts == {""}  # always a str: "" is the environment's default start
    for key in ("seed", "lane", "length"):
        assert seen[f"final_info/gradlab_episode/{key}"][0] == np.int64
    assert seen["final_info/gradlab_episode/return"][0] == np.float64
    # The first episode used the run's lane seed; later ones continued the lane's RNG stream (-1).
    assert [s[0] for s in seeds] == [seed * 1024 + lane for lane in range(n)]
    assert all(s[1:] and set(s[1:]) == {-1} for s in seeds), seeds


@pytest.mark.parametrize("goal", GOALS)
def test_gymnasiums_sync_vector_env_over_make_env_batches_every_step(goal: str) -> None:
    # gymnasium's own vector env (next-step autoreset) over one-lane goal envs: the same info batching.
    envs = gym.vector.SyncVectorEnv([lambda: gradlab.make_env(goal) for _ in range(2)])
    envs.reset(seed=3)  # env i: reset(seed=3 + i), lane seed (3 + i) * 1024
    seen: dict[str, tuple] = {}
    seeds: list[list[int]] = [[], []]
    for info, done in _run_through_episode_ends(envs, episodes_per_lane=2, max_steps=2000):
        for key, dtype in _info_dtypes(info).items():
            assert seen.setdefault(key, dtype) == dtype, f"{key}: {seen[key]} earlier, {dtype} now"
        for lane in np.flatnonzero(done):
            seeds[lane].append(int(info["gradlab_episode"]["seed"][lane]))
    envs.close()
    assert [s[0] for s in seeds] == [3 * 1024, 4 * 1024]
    assert all(set(s[1:]) == {-1} for s in seeds), seeds


def test_a_reset_that_names_seeds_is_reported_and_negative_seeds_are_refused() -> None:
    envs = gradlab.make_vector_env("gradlab__bandit", 2, seed=0)
    envs.reset(seed=[40, 41])
    _, _, terminated, _, info = envs.step(np.zeros(2, dtype=np.int64))
    assert terminated.all() and info["final_info"]["gradlab_episode"]["seed"].tolist() == [40, 41]
    _, _, _, _, info = envs.step(np.zeros(2, dtype=np.int64))
    assert info["final_info"]["gradlab_episode"]["seed"].tolist() == [-1, -1]
    with pytest.raises(ConfigError, match=r"seed: expected non-negative lane seeds, found \[-1, 3\]"):
        envs.reset(seed=[-1, 3])
    envs.close()


@pytest.mark.slow
def test_example_reinforce_loop_runs_on_cartpole_whose_lanes_end_apart() -> None:
    # The command of issue 22 item 6, smaller: it ended inside gymnasium's vector_env.py.
    out = subprocess.run([sys.executable, str(ROOT / "docs/examples/goal_loop.py"), "CartPole-v1", "--updates", "3",
                          "--lanes", "4", "--steps", "48"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert [line.split()[:2] for line in lines] == [["update", "0"], ["update", "2"]]
    for line in lines:
        _, _, _, episodes, _, return_mean, _, _ = line.split()
        assert int(episodes) > 0 and 8.0 <= float(return_mean) <= 500.0  # CartPole: 8+ steps, at most 500


@pytest.mark.slow
def test_example_cleanrl_style_ppo_loop_runs_20_updates_and_improves_cartpole() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "docs/examples/ppo_loop.py"), "CartPole-v1", "--updates", "20"],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.strip().splitlines()]
    assert [int(r[1]) for r in rows] == list(range(20))
    returns = [float(r[5]) for r in rows if int(r[3]) > 0]
    assert all(np.isfinite(float(r[7])) for r in rows)
    # Random CartPole lasts ~22 steps; seed 0 reaches ~100 by update 15 (a loose bar: learning, not speed).
    assert np.mean(returns[-5:]) > 2 * returns[0], returns
