"""Named start states: ``VectorEnv.set_next_start`` on Corridor-v0 (sync and async lanes) and stable-retro."""

from __future__ import annotations

import numpy as np
import pytest

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.envs import make_vector_env
from gradlab.errors import ContractViolation


def _corridor(n_envs=2, vectorization="sync", **provider_args) -> EnvironmentSpec:
    args = {"length": 5, "end": "truncate", "starts": {"short": 2, "long": 7}, **provider_args}
    return EnvironmentSpec.model_validate({"provider": "gradlab", "env_id": "Corridor-v0", "n_envs": n_envs,
                                           "vectorization": vectorization, "provider_args": args})


def _episodes(venv, steps):
    out = []
    for t in range(1, steps + 1):
        res = venv.step(np.zeros(venv.num_envs, dtype=np.int64))
        out += [(t, ep.lane, ep.length, ep.start, res.infos[ep.lane]["gradlab_episode"].get("start"))
                for ep in res.episodes]
    return out


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_corridor_starts_set_each_lanes_next_episode_length(vectorization):
    with make_vector_env(_corridor(vectorization=vectorization), seed=0) as venv:
        assert venv.starts == ("short", "long")
        venv.set_next_start(0, "short")
        venv.set_next_start(1, "long")
        venv.reset()
        venv.set_next_start(0, "long")  # lane 0's second episode
        eps = _episodes(venv, 10)
    # Lane 0: short (2 steps), then long (7 steps, ends at t=9); lane 1: long (ends at t=7), then
    # the default length 5 (one-shot starts), unfinished at t=10.
    assert eps == [(2, 0, 2, "short", "short"), (7, 1, 7, "long", "long"), (9, 0, 7, "long", "long")]


def test_default_start_episodes_have_no_start_key():
    with make_vector_env(_corridor(n_envs=1), seed=0) as venv:
        venv.reset()
        res = None
        for _ in range(5):
            res = venv.step(np.zeros(1, dtype=np.int64))
    assert res.episodes[0].start is None and res.episodes[0].length == 5
    assert "start" not in res.infos[0]["gradlab_episode"]


def test_set_next_start_none_clears_a_pending_start():
    with make_vector_env(_corridor(n_envs=1), seed=0) as venv:
        venv.set_next_start(0, "long")
        venv.set_next_start(0, None)
        venv.reset()
        eps = _episodes(venv, 5)
    assert eps == [(5, 0, 5, None, None)]


def test_unknown_start_and_bad_lane_are_refused():
    with make_vector_env(_corridor(), seed=0) as venv:
        with pytest.raises(ContractViolation, match=r"gradlab:Corridor-v0: start: expected one of \['short', 'long'\], "
                                                    r"found 'middle'"):
            venv.set_next_start(0, "middle")
        with pytest.raises(ContractViolation, match="lane: expected 0..1, found 2"):
            venv.set_next_start(2, "short")


@pytest.mark.parametrize(("spec", "where"), [
    ({"provider": "gymnasium", "env_id": "CartPole-v1"}, "gymnasium:CartPole-v1"),
    ({"provider": "gradlab", "env_id": "Corridor-v0"}, "gradlab:Corridor-v0"),  # no provider_args.starts
    ({"provider": "gradlab", "env_id": "Bandit-v0"}, "gradlab:Bandit-v0"),
])
def test_providers_without_starts_name_provider_and_env(spec, where):
    with make_vector_env(EnvironmentSpec.model_validate(spec), seed=0) as venv:
        assert venv.starts is None
        with pytest.raises(ContractViolation, match=f"{where} has no start states, found start 'level2'"):
            venv.set_next_start(0, "level2")


def test_ale_has_no_starts():
    spec = EnvironmentSpec.model_validate({"provider": "ale", "env_id": "Breakout", "n_envs": 1})
    with make_vector_env(spec, seed=0) as venv:
        with pytest.raises(ContractViolation, match="ale:Breakout has no start states"):
            venv.set_next_start(0, "level2")


def test_retro_start_is_a_save_state():
    spec = EnvironmentSpec.model_validate({"provider": "retro", "env_id": "Airstriker-Genesis-v0", "n_envs": 1,
                                           "task": {"termination": {"max_episode_steps": 3}}})
    with make_vector_env(spec, seed=0) as venv:
        assert venv.starts == ("Level1",)
        with pytest.raises(ContractViolation, match=r"start: expected one of \['Level1'\], found 'Level9'"):
            venv.set_next_start(0, "Level9")
        default_obs = venv.reset()
        venv.set_next_start(0, "Level1")
        eps = _episodes(venv, 6)  # the reset at step 3 loads Level1; the one at step 6 the default
        venv.set_next_start(0, "Level1")
        level1_obs = venv.reset()
    assert eps == [(3, 0, 3, None, None), (6, 0, 3, "Level1", "Level1")]
    # Airstriker's default state *is* Level1 (its metadata.json), so both starts show the same frame.
    assert level1_obs.tobytes() == default_obs.tobytes()
