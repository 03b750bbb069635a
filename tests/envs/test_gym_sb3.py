"""gymnasium lanes against the bare library, and the stable-baselines3 VecEnv adapter."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.envs import make_vector_env
from gradlab.envs.sb3 import SB3VecEnv


def _cartpole(n_envs=2, **kw) -> EnvironmentSpec:
    return EnvironmentSpec.model_validate({"provider": "gymnasium", "env_id": "CartPole-v1", "n_envs": n_envs,
                                           "task": {"termination": {"native_terminated": "failure"}}, **kw})


def test_cartpole_lanes_match_bare_gymnasium_step_for_step():
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, size=(60, 2))
    bare = [gym.make("CartPole-v1") for _ in range(2)]
    bare_obs = [env.reset(seed=7 * 1024 + lane)[0] for lane, env in enumerate(bare)]
    with make_vector_env(_cartpole(), seed=7) as venv:
        obs = venv.reset()
        assert np.array_equal(obs, np.stack(bare_obs))
        n_episodes = 0
        for t in range(60):
            res = venv.step(actions[t])
            for lane, env in enumerate(bare):
                o, r, te, tr, _ = env.step(int(actions[t, lane]))
                assert res.raw_reward[lane] == r
                assert (bool(res.terminated[lane]), bool(res.truncated[lane])) == (te, tr)
                if te or tr:
                    assert np.array_equal(res.final_obs[lane], o)  # true final observation
                    o, _ = env.reset()  # continue the lane's own RNG, as gradlab does
                    n_episodes += 1
                assert np.array_equal(res.obs[lane], o)
    assert n_episodes >= 2


def test_cartpole_native_time_limit_is_truncation():
    # CartPole-v1 with the time limit cut to 5 steps: no random policy falls over that fast.
    spec = _cartpole(n_envs=1, provider_args={"max_episode_steps": 5})
    with make_vector_env(spec, seed=1) as venv:
        venv.reset()
        for _ in range(4):
            assert not venv.step(np.array([0])).episodes
        res = venv.step(np.array([1]))
    assert res.truncated.tolist() == [True] and res.terminated.tolist() == [False]
    ep = res.episodes[0]
    assert (ep.outcome, ep.reason, ep.length, ep.return_) == ("timeout", "native_time_limit", 5, 5.0)
    bare = gym.make("CartPole-v1", max_episode_steps=5)
    bare.reset(seed=1024)
    for a in (0, 0, 0, 0, 1):
        final, *_ = bare.step(a)
    assert np.array_equal(res.final_obs[0], final)


def test_cartpole_fall_is_failure():
    with make_vector_env(_cartpole(n_envs=1), seed=0) as venv:
        venv.reset()
        for _ in range(100):
            res = venv.step(np.array([1]))  # always push right: the pole falls in ~10 steps
            if res.episodes:
                break
    assert res.terminated.tolist() == [True]
    assert (res.episodes[0].outcome, res.episodes[0].reason) == ("failure", "native_terminated")
    assert 5 <= res.episodes[0].length <= 30


def _corridor(end: str) -> EnvironmentSpec:
    return EnvironmentSpec.model_validate({"provider": "gradlab", "env_id": "Corridor-v0", "n_envs": 2,
                                           "provider_args": {"length": 3, "end": end}})


def test_sb3_adapter_marks_truncation_for_bootstrap():
    venv = SB3VecEnv(make_vector_env(_corridor("truncate"), seed=0))
    try:
        assert venv.reset().tolist() == [[0.0], [0.0]]
        for _ in range(2):
            venv.step_async(np.zeros(2, dtype=np.int64))
            obs, rew, dones, infos = venv.step_wait()
            assert not dones.any()
        venv.step_async(np.zeros(2, dtype=np.int64))
        obs, rew, dones, infos = venv.step_wait()
    finally:
        venv.close()
    assert dones.tolist() == [True, True]
    assert obs.tolist() == [[0.0], [0.0]]
    assert rew.dtype == np.float32 and rew.tolist() == [1.0, 1.0]
    for info in infos:
        assert info["terminal_observation"].tolist() == [3.0]
        assert info["TimeLimit.truncated"] is True
        assert info["episode"] == {"r": 3.0, "l": 3}
        assert info["gradlab_episode"]["outcome"] == "timeout"


def test_sb3_adapter_does_not_bootstrap_termination():
    venv = SB3VecEnv(make_vector_env(_corridor("both"), seed=0))
    try:
        venv.reset()
        for _ in range(3):
            obs, rew, dones, infos = venv.step(np.zeros(2, dtype=np.int64))
    finally:
        venv.close()
    assert dones.tolist() == [True, True]
    assert [info["TimeLimit.truncated"] for info in infos] == [False, False]
    assert len(venv.pop_episodes()) == 2 and venv.pop_episodes() == []


@pytest.mark.slow
def test_sb3_ppo_learns_on_the_adapter_bandit():
    import torch
    from stable_baselines3 import PPO

    torch.set_num_threads(1)

    spec = EnvironmentSpec.model_validate({"provider": "gradlab", "env_id": "Bandit-v0", "n_envs": 8,
                                           "provider_args": {"n_arms": 2}})
    venv = SB3VecEnv(make_vector_env(spec, seed=0))
    try:
        model = PPO("MlpPolicy", venv, n_steps=16, batch_size=128, n_epochs=4, learning_rate=3e-3, seed=0,
                    device="cpu")
        model.learn(1536)
        obs = venv.reset()
        actions, _ = model.predict(obs, deterministic=True)
    finally:
        venv.close()
    assert np.array_equal(actions, obs.argmax(axis=1))
