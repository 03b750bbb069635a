"""The signal-free fast path (``TaskRunner.step_native``) gives exactly what the general path gives.

Two levels: the task runner fed the same random flags and rewards through ``step`` and
``step_native``; and whole vector envs (CartPole, Corridor, Breakout) stepped side by side on the
same seeds and actions, one through the fast path and one forced through the general path, with
every field of every ``StepResult`` compared.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.contracts.task import TaskProgram
from gradlab.envs import make_vector_env
from gradlab.envs.task import TaskRunner
from gradlab.errors import ContractViolation

PROGRAMS = [
    {},
    {"termination": {"max_episode_steps": 3, "native_terminated": "failure"}},
    {"termination": {"max_episode_steps": 4, "native_terminated": "success"},
     "reward": {"reward_scale": 2.0, "reward_clip": True}},
    {"reward": {"reward_scale": 0.5, "reward_clip": [-2, 3]}},
    {"reward": {"reward_clip": [-0.5, 0.25]}},
    {"reward": {"source": "events"}, "termination": {"max_episode_steps": 2}},
]


@pytest.mark.parametrize("program", PROGRAMS)
def test_step_native_equals_step_on_random_flags(program):
    prog = TaskProgram.model_validate(program)
    general, fast = TaskRunner(prog, 4), TaskRunner(prog, 4)
    assert fast.simple
    rng = np.random.default_rng(3)
    for runner in (general, fast):
        runner.reset_lanes([0, 1, 2, 3], [10, 11, None, 13])
    n_episodes = 0
    for _ in range(300):
        raw = rng.normal(0.0, 3.0, size=4)
        nterm = rng.random(4) < 0.1
        ntrunc = rng.random(4) < 0.1  # includes steps that are both terminal and truncated
        a = general.step(raw, nterm, ntrunc, {})
        reward, terminated, truncated, episodes = fast.step_native(raw, nterm, ntrunc)
        assert reward.dtype == a.reward.dtype == np.float32
        assert reward.tobytes() == a.reward.tobytes()
        assert terminated.tolist() == a.terminated.tolist() and truncated.tolist() == a.truncated.tolist()
        assert not (terminated & truncated).any()
        assert episodes == a.episodes
        n_episodes += len(episodes)
        ended = [ep.lane for ep in episodes]
        for runner in (general, fast):
            runner.reset_lanes(ended, [None] * len(ended))
    assert n_episodes > 100
    assert general.returns.tobytes() == fast.returns.tobytes()


def test_step_native_hand_computed_values():
    # 7 / 2 clipped to [-1, 1] is 1.0; the third step hits max_episode_steps (truncated),
    # lane 1 is terminated natively on step 2 and truncated too: terminal wins.
    prog = TaskProgram.model_validate({"termination": {"max_episode_steps": 3},
                                       "reward": {"reward_scale": 2.0, "reward_clip": True}})
    runner = TaskRunner(prog, 2)
    runner.reset_lanes([0, 1], [5, 6])
    f = np.zeros(2, dtype=bool)
    reward, term, trunc, eps = runner.step_native(np.array([7.0, -1.0]), f, f)
    assert reward.tolist() == [1.0, -0.5] and not eps
    reward, term, trunc, eps = runner.step_native(np.array([7.0, 1.0]), np.array([False, True]),
                                                  np.array([False, True]))
    assert term.tolist() == [False, True] and trunc.tolist() == [False, False]
    assert [(e.lane, e.outcome, e.reason, e.length, e.return_, e.raw_return) for e in eps] == [
        (1, "ended", "native_terminated", 2, 0.0, 0.0)]
    runner.reset_lanes([1], [None])
    reward, term, trunc, eps = runner.step_native(np.array([7.0, 1.0]), f, f)
    assert trunc.tolist() == [True, False]
    assert [(e.lane, e.outcome, e.reason, e.length, e.return_, e.raw_return, e.seed) for e in eps] == [
        (0, "timeout", "max_episode_steps", 3, 3.0, 21.0, 5)]


def test_step_native_refuses_a_program_with_signals():
    prog = TaskProgram.model_validate({"signals": {"s": {"source": "info", "key": "s"}}})
    runner = TaskRunner(prog, 1)
    assert not runner.simple
    with pytest.raises(ContractViolation, match="reads signals"):
        runner.step_native(np.zeros(1), np.zeros(1, dtype=bool), np.zeros(1, dtype=bool))


def _same_results(a, b) -> None:
    assert a.obs.dtype == b.obs.dtype and a.obs.tobytes() == b.obs.tobytes()
    for name in ("reward", "raw_reward", "terminated", "truncated"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), name
    assert sorted(a.final_obs) == sorted(b.final_obs)
    for lane in a.final_obs:
        assert a.final_obs[lane].tobytes() == b.final_obs[lane].tobytes()
    assert a.episodes == b.episodes
    assert a.infos == b.infos
    assert a.signals == b.signals == {}


def _side_by_side(spec: EnvironmentSpec, n_actions: int, steps: int) -> int:
    fast = make_vector_env(spec, seed=3)
    general = make_vector_env(spec, seed=3)
    general._simple = False  # force the general TaskRunner.step path
    try:
        assert fast._simple
        assert fast.reset().tobytes() == general.reset().tobytes()
        actions = np.random.default_rng(0).integers(0, n_actions, size=(steps, spec.n_envs))
        episodes = 0
        for t in range(steps):
            a, b = fast.step(actions[t]), general.step(actions[t])
            _same_results(a, b)
            episodes += len(a.episodes)
        return episodes
    finally:
        fast.close()
        general.close()


@pytest.mark.parametrize("task", [
    {},
    {"termination": {"max_episode_steps": 17, "native_terminated": "failure"},
     "reward": {"reward_scale": 2.0, "reward_clip": [-0.2, 0.3]}},
])
@pytest.mark.parametrize("n", [1, 8])
def test_cartpole_fast_path_equals_general_path(task, n):
    spec = EnvironmentSpec.model_validate({"provider": "gymnasium", "env_id": "CartPole-v1", "n_envs": n,
                                           "vectorization": "sync", "task": task})
    episodes = _side_by_side(spec, 2, 400)
    assert episodes >= 8 * n  # random CartPole episodes last ~22 steps


def test_corridor_fast_path_equals_general_path_with_both_flags():
    spec = EnvironmentSpec.model_validate({
        "provider": "gradlab", "env_id": "Corridor-v0", "n_envs": 3,
        "provider_args": {"length": [2, 3, 5], "end": "both", "reward": 2.5},
        "task": {"termination": {"max_episode_steps": 4}, "reward": {"reward_scale": 2.0}},
    })
    # Lanes end every 2, 3 and 4 (max_episode_steps) steps: 30 steps -> 15 + 10 + 7 episodes.
    assert _side_by_side(spec, 2, 30) == 32


def test_breakout_fast_path_equals_general_path():
    spec = EnvironmentSpec.model_validate({"provider": "ale", "env_id": "Breakout", "n_envs": 2,
                                           "task": {"termination": {"max_episode_steps": 60},
                                                    "reward": {"reward_clip": True}}})
    assert _side_by_side(spec, 4, 150) >= 4
