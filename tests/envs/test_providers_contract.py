"""One contract suite over every shipped provider, each with a real rollout.

The declared spaces (``describe``) must match the vector env's spaces, every observation of the
rollout (reset, step, final) must lie in the declared observation space, actions drawn from the
declared action space must be accepted, and render frames must have the declared shape.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.envs import describe, list_providers, make_vector_env
from gradlab.envs.preflight import random_actions

CASES = [
    ("gradlab", "Bandit-v0", {"n_arms": 3}, {}, 2),
    ("gradlab", "Corridor-v0", {"length": [3, 4]}, {}, 2),
    ("gradlab", "Lives-v0", {}, {}, 2),
    ("gradlab", "FailOn-v0", {"fail_episodes": [0]}, {}, 2),
    ("gradlab", "KeyDoor-v0", {}, {}, 2),
    ("ale", "Pong", {"single_lanes": True}, {"frame_stack": 2}, 1),
    ("gymnasium", "CartPole-v1", {}, {}, 2),
    ("gymnasium", "FrozenLake-v1", {}, {}, 2),
    ("gymnasium", "Pendulum-v1", {}, {"frame_stack": 2}, 2),
    ("ale", "Breakout", {}, {}, 2),
    ("ale", "MsPacman", {}, {"grayscale": False, "resize": [42, 32], "frame_stack": 2}, 2),
    ("vizdoom", "basic", {}, {}, 2),
    ("vizdoom", "defend_the_center", {}, {"screen_format": "RGB24", "resize": None, "frame_stack": 1}, 1),
    ("retro", "Airstriker-Genesis-v0", {}, {}, 1),
]


def test_every_shipped_provider_is_registered_and_available():
    rows = {r["provider"]: r for r in list_providers()}
    assert list(rows)[:5] == ["gradlab", "gymnasium", "ale", "vizdoom", "retro"]
    for name in ("gradlab", "gymnasium", "ale", "vizdoom", "retro"):
        assert rows[name]["available"], rows[name]
        assert rows[name]["version"]
        assert rows[name]["env_ids"]
    assert "Breakout" in rows["ale"]["env_ids"] and "basic" in rows["vizdoom"]["env_ids"]
    assert "Airstriker-Genesis-v0" in rows["retro"]["env_ids"]


@pytest.mark.parametrize(("provider", "env_id", "args", "pre", "n_envs"), CASES,
                         ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_declared_spaces_match_a_real_rollout(provider, env_id, args, pre, n_envs):
    spec = EnvironmentSpec.model_validate({"provider": provider, "env_id": env_id, "n_envs": n_envs,
                                           "vectorization": "sync" if provider != "retro" else "auto",
                                           "provider_args": args, "preprocessing": pre})
    info = describe(spec)
    rng = np.random.default_rng(0)
    with make_vector_env(spec, seed=0, render_mode="rgb_array") as venv:
        obs_space, act_space = venv.single_observation_space, venv.single_action_space
        assert str(obs_space) == info.observation_space
        assert str(act_space) == info.action_space
        assert tuple(obs_space.shape) == info.obs_shape and str(obs_space.dtype) == info.obs_dtype
        if info.n_actions is not None:
            assert info.n_actions == act_space.n
            assert len(info.action_meanings) == info.n_actions
        obs = venv.reset()
        assert obs.shape == (n_envs, *info.obs_shape) and obs.dtype == obs_space.dtype
        assert all(obs_space.contains(o) for o in obs)
        ended = 0
        for _ in range(40):
            actions = random_actions(act_space, n_envs, rng)
            assert all(act_space.contains(a) for a in actions)
            res = venv.step(actions)
            assert res.obs.shape == obs.shape and res.obs.dtype == obs.dtype
            assert all(obs_space.contains(o) for o in res.obs)
            assert res.reward.shape == (n_envs,) and res.reward.dtype == np.float32
            assert res.raw_reward.dtype == np.float32
            assert not np.any(res.terminated & res.truncated)
            assert sorted(res.final_obs) == [e.lane for e in res.episodes]
            for o in res.final_obs.values():
                assert obs_space.contains(o)
            ended += len(res.episodes)
            assert len(res.infos) == n_envs
        frames = venv.render()
    assert len(frames) == n_envs
    for frame in frames:
        assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3
        if info.render_shape is not None:
            assert tuple(frame.shape) == info.render_shape
    if provider == "gradlab" and env_id not in ("Lives-v0", "KeyDoor-v0"):
        assert ended > 0  # the tiny envs all finish within 40 steps


def test_vizdoom_basic_never_shooting_times_out_as_truncation_with_a_real_frame():
    spec = EnvironmentSpec.model_validate({
        "provider": "vizdoom", "env_id": "basic", "n_envs": 1, "vectorization": "sync",
        "preprocessing": {"frame_skip": 4, "resize": None, "frame_stack": 1},
        "task": {"termination": {"native_terminated": "success"}},
    })
    with make_vector_env(spec, seed=0) as venv:
        obs = venv.reset()
        prev = obs
        for _ in range(200):
            res = venv.step(np.array([0]))  # NOOP: never shoots, never moves
            if res.episodes:
                break
            prev = res.obs
    assert res.truncated.tolist() == [True] and res.terminated.tolist() == [False]
    ep = res.episodes[0]
    # 300-tic timeout / frame skip 4 = 75 steps, -1 per tic.
    assert (ep.outcome, ep.reason, ep.length, ep.raw_return) == ("timeout", "native_time_limit", 75, -300.0)
    final = res.final_obs[0]
    assert final.shape == (1, 120, 160)
    assert final.std() > 5.0  # a rendered room, not a blank frame
    assert np.abs(final.astype(int) - prev.astype(int)).mean() < 10  # the same scene as the frame before


def test_ale_lives_signal_and_seeded_resets():
    task = {"signals": {"lives": {"source": "info", "key": "lives"}},
            "events": {"life_lost": {"signal": "lives", "op": "decrease"}},
            "termination": {"failure": ["life_lost"]}, "progress": ["lives"]}
    spec = EnvironmentSpec.model_validate({"provider": "ale", "env_id": "Breakout", "n_envs": 2,
                                           "preprocessing": {"repeat_action_probability": 0.0}, "task": task})
    firsts = []
    for _ in range(2):
        with make_vector_env(spec, seed=5) as venv:
            firsts.append(venv.reset())
            rng = np.random.default_rng(1)
            for _ in range(2000):
                res = venv.step(rng.integers(0, 4, 2))
                if res.episodes:
                    break
    assert np.array_equal(firsts[0], firsts[1])
    ep = res.episodes[0]
    assert (ep.outcome, ep.reason, ep.progress) == ("failure", "life_lost", {"lives": 4.0})


def test_retro_missing_rom_says_how_to_import(tmp_path, monkeypatch):
    from gradlab.errors import ConfigError

    monkeypatch.setenv("GRADLAB_HOME", str(tmp_path))
    spec = EnvironmentSpec(provider="retro", env_id="SonicTheHedgehog-Genesis-v0")
    with pytest.raises(ConfigError, match="gradlab rom import PATH"):
        make_vector_env(spec, seed=0)


def test_unknown_ids_are_not_found_with_hints():
    from gradlab.errors import NotFound

    with pytest.raises(NotFound, match="did you mean CartPole-v1"):
        describe("gymnasium:CartPole-v2")
    with pytest.raises(NotFound, match="ms_pacmen|MsPacman"):
        describe("ale:MsPacmen")
    with pytest.raises(NotFound, match="unknown environment provider 'gym'"):
        describe("gym:CartPole-v1")
