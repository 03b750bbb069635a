"""Vectorization per provider: ViZDoom and stable-retro pick in-process lanes for one lane.

stable-retro allows one emulator per process: ``auto`` runs a single lane in this process when the
process holds no emulator, and in a worker process otherwise; ``sync`` where that is impossible is
a clear :class:`EmulatorInUse` error. In-process and worker lanes give identical steps.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.envs import make_vector_env
from gradlab.envs.lanes import AsyncLanes, SyncLanes
from gradlab.envs.providers.retro import EmulatorInUse, emulator_in_process
from gradlab.errors import ConfigError

GAME = "Airstriker-Genesis-v0"


def _retro(n_envs: int = 1, vectorization: str = "auto") -> EnvironmentSpec:
    return EnvironmentSpec.model_validate({"provider": "retro", "env_id": GAME, "n_envs": n_envs,
                                           "vectorization": vectorization,
                                           "task": {"termination": {"max_episode_steps": 6}}})


def _rollout(venv, actions: list[int]) -> tuple[list[np.ndarray], list[float], list[tuple[bool, bool]]]:
    obs = [venv.reset()]
    rewards, flags = [], []
    for a in actions:
        res = venv.step(np.array([a] * venv.num_envs))
        obs.append(res.obs.copy())
        rewards.append(float(res.raw_reward[0]))
        flags.append((bool(res.terminated[0]), bool(res.truncated[0])))
        if res.episodes:
            obs.append(res.final_obs[0][None].copy())
    return obs, rewards, flags


def test_retro_auto_one_lane_runs_in_process_and_a_second_falls_back_to_a_worker():
    actions = [0, 5, 17, 33, 60, 90, 125, 3]
    assert not emulator_in_process()
    with make_vector_env(_retro(), seed=0) as local:
        assert isinstance(local.backend, SyncLanes) and emulator_in_process()
        with make_vector_env(_retro(), seed=0) as remote:  # the emulator is taken: a worker process
            assert isinstance(remote.backend, AsyncLanes)
            a, b = _rollout(local, actions), _rollout(remote, actions)
        with pytest.raises(EmulatorInUse, match=r"retro:Airstriker-Genesis-v0: stable-retro allows one emulator "
                                                 r"per process .*a gradlab retro lane of this process is still open"):
            make_vector_env(_retro(vectorization="sync"), seed=0)
    assert not emulator_in_process()
    # Same emulator, same actions: identical observations, rewards and flags in both backends;
    # max_episode_steps 6 truncates at step 6 (8 steps: 9 observations + 1 final observation).
    assert len(a[0]) == len(b[0]) == 10
    assert all(x.shape == (1, 4, 84, 84) and x.tobytes() == y.tobytes() for x, y in zip(a[0], b[0], strict=True))
    assert a[1] == b[1]
    assert a[2] == b[2] == [(False, False)] * 5 + [(False, True)] + [(False, False)] * 2
    # After closing, a new in-process lane can take the emulator again.
    with make_vector_env(_retro(vectorization="sync"), seed=0) as again:
        assert isinstance(again.backend, SyncLanes)


def test_retro_sync_with_several_lanes_is_a_config_error():
    with pytest.raises(ConfigError, match=r"vectorization: sync steps every lane in this process.*"
                                          r"expected n_envs 1 or vectorization auto/async, found n_envs 2"):
        make_vector_env(_retro(n_envs=2, vectorization="sync"), seed=0)
    assert not emulator_in_process()


def test_retro_callers_own_emulator_auto_uses_a_worker_and_sync_is_refused():
    import stable_retro as retro

    own = retro.make(GAME, render_mode=None)
    try:
        with pytest.raises(EmulatorInUse, match="stable-retro said: Cannot create multiple emulator instances"):
            make_vector_env(_retro(vectorization="sync"), seed=0)
        with make_vector_env(_retro(), seed=0) as venv:
            assert isinstance(venv.backend, AsyncLanes)
            assert venv.reset().shape == (1, 4, 84, 84)
    finally:
        own.close()
    assert not emulator_in_process()


def _doom(n_envs: int, vectorization: str = "auto") -> EnvironmentSpec:
    return EnvironmentSpec.model_validate({"provider": "vizdoom", "env_id": "basic", "n_envs": n_envs,
                                           "vectorization": vectorization,
                                           "task": {"termination": {"native_terminated": "success"}}})


def test_vizdoom_auto_one_lane_in_process_several_in_workers():
    with make_vector_env(_doom(1), seed=0) as one:
        assert isinstance(one.backend, SyncLanes)
    with make_vector_env(_doom(2), seed=0) as two:
        assert isinstance(two.backend, AsyncLanes)


def test_vizdoom_step_values_info_and_frames():
    from PIL import Image

    # basic: -1 per tic (4 tics a step); a missed shot costs 5 more and one bullet (AMMO2 50 -> 49),
    # registered on the step after ATTACK (action 3 = buttons MOVE_LEFT, MOVE_RIGHT, ATTACK).
    with make_vector_env(_doom(1, "sync"), seed=0, render_mode="rgb_array") as venv:
        venv.reset()
        got = []
        for a in (0, 3, 0):
            res = venv.step(np.array([a]))
            got.append((float(res.raw_reward[0]), res.infos[0]["ammo2"], res.infos[0]["dead"]))
        screen = venv.render()[0][:, :, 0]  # GRAY8 rendered as 3 equal channels
        stacked = res.obs[0]
    assert got == [(-4.0, 50.0, False), (-4.0, 50.0, False), (-9.0, 49.0, False)]
    # The newest stacked frame is the screen resized exactly as a hand-written PIL loop does it.
    expected = np.asarray(Image.fromarray(np.ascontiguousarray(screen)).resize((84, 84), Image.BILINEAR))
    assert stacked.shape == (4, 84, 84) and np.array_equal(stacked[-1], expected)
