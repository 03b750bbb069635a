"""Lane groups (gradlab.envs.groups): two ale-py vector envs of 4 lanes step exactly as one of 8."""

from __future__ import annotations

import numpy as np

from gradlab.contracts.experiments import Experiments
from gradlab.contracts.run_spec import RunSpec
from gradlab.envs import make_vector_env
from gradlab.envs.groups import LaneGroups, make_lane_groups
from gradlab.envs.vector import VectorEnv


def _spec(ref: str, n_envs: int) -> RunSpec:
    return RunSpec.from_resolved(Experiments().resolve(ref, [f"train.environment.n_envs={n_envs}"]), seed=4)


def test_two_groups_play_the_lanes_of_one_env() -> None:
    spec = _spec("Breakout-Atari2600-v0/ppo", 8)
    rng = np.random.default_rng(0)
    with make_vector_env(spec.environment, seed=spec.seed) as one, make_lane_groups(spec.environment, seed=spec.seed) as two:
        assert isinstance(two, LaneGroups) and [g.num_envs for g in two.groups] == [4, 4] and two.steps_in_background
        assert two.num_envs == 8 and two.single_observation_space == one.single_observation_space
        np.testing.assert_array_equal(one.reset(), two.reset())
        ended = 0
        for step in range(600):
            actions = rng.integers(0, 4, size=8)
            a = one.step(actions)
            if step % 2:  # the rollout's order: each group started and awaited on its own
                two.groups[0].step_async(actions[:4])
                two.groups[1].step_async(actions[4:])
                parts = [two.groups[0].step_wait(), two.groups[1].step_wait()]
                obs = np.concatenate([p.obs for p in parts])
                reward = np.concatenate([p.reward for p in parts])
                terminated = np.concatenate([p.terminated for p in parts])
                truncated = np.concatenate([p.truncated for p in parts])
                lanes = [ep.lane + off for p, off in zip(parts, two.offsets, strict=True) for ep in p.episodes]
                finals = {lane + off: o for p, off in zip(parts, two.offsets, strict=True) for lane, o in p.final_obs.items()}
                returns = [ep.raw_return for p in parts for ep in p.episodes]
            else:  # LaneGroups.step: both groups as one vector env
                b = two.step(actions)
                obs, reward, terminated, truncated = b.obs, b.reward, b.terminated, b.truncated
                lanes, finals, returns = [ep.lane for ep in b.episodes], b.final_obs, [ep.raw_return for ep in b.episodes]
                assert [info["gradlab_episode"]["lane"] for info in b.infos if "gradlab_episode" in info] == lanes
            np.testing.assert_array_equal(a.obs, obs)
            np.testing.assert_array_equal(a.reward, reward)
            np.testing.assert_array_equal(a.terminated, terminated)
            np.testing.assert_array_equal(a.truncated, truncated)
            assert [ep.lane for ep in a.episodes] == lanes and [ep.raw_return for ep in a.episodes] == returns
            assert sorted(a.final_obs) == sorted(finals)
            for lane, o in a.final_obs.items():
                np.testing.assert_array_equal(o, finals[lane])
            ended += len(a.episodes)
        assert ended >= 1  # the comparison covered episode ends and same-step resets


def test_lanes_that_step_in_the_foreground_stay_one_env() -> None:
    spec = _spec("CartPole-v1/ppo", 4)
    with make_lane_groups(spec.environment, seed=spec.seed) as venv:
        assert isinstance(venv, VectorEnv) and venv.num_envs == 4 and not venv.steps_in_background
