"""Provider state snapshots: capture a lane, step on, restore, replay the same actions.

Every provider that declares state capture must give identical observations and rewards after a
restore (docs/ARCHITECTURE.md section 12a); one that cannot (ViZDoom, ale-py's native vector env)
refuses with a StateUnsupported naming the provider.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.envs import make_vector_env
from gradlab.envs.preflight import random_actions
from gradlab.envs.snapshot import StateUnsupported
from gradlab.errors import IntegrityError

CASES = [
    ("gradlab", "KeyDoor-v0", {}, {}, "sync", 2),
    ("gradlab", "Bandit-v0", {"n_arms": 3}, {}, "sync", 2),
    ("gradlab", "Lives-v0", {"lives": 9}, {}, "sync", 2),
    ("gymnasium", "CartPole-v1", {}, {}, "sync", 2),
    ("gymnasium", "Acrobot-v1", {}, {}, "sync", 2),
    ("ale", "MontezumaRevenge", {"single_lanes": True}, {}, "sync", 1),
    ("retro", "Airstriker-Genesis-v0", {}, {}, "auto", 1),
]


def _spec(provider, env_id, args, pre, vec, n):
    return EnvironmentSpec.model_validate({"provider": provider, "env_id": env_id, "n_envs": n, "vectorization": vec,
                                           "provider_args": args, "preprocessing": pre})


def _replay(venv, actions):
    out = []
    for a in actions:
        res = venv.step(a)
        out.append((res.obs[0].copy(), float(res.reward[0]), float(res.raw_reward[0]), bool(res.terminated[0]),
                    bool(res.truncated[0])))
    return out


@pytest.mark.parametrize(("provider", "env_id", "args", "pre", "vec", "n"), CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_restore_then_same_actions_gives_the_same_transitions(provider, env_id, args, pre, vec, n):
    rng = np.random.default_rng(0)
    with make_vector_env(_spec(provider, env_id, args, pre, vec, n), seed=3) as venv:
        venv.reset()
        for _ in range(6):
            venv.step(random_actions(venv.single_action_space, n, rng))
        steps_before = int(venv.task.steps[0])
        blob = venv.capture_lane(0)
        if provider != "retro":  # stable-retro's own serialised state differs between two calls
            assert venv.capture_lane(0) == blob  # canonical: the same state gives the same bytes
        actions = [random_actions(venv.single_action_space, n, rng) for _ in range(30)]
        first = _replay(venv, actions)
        obs = venv.restore_lane(0, blob)
        assert int(venv.task.steps[0]) == steps_before
        assert obs.shape == venv.single_observation_space.shape
        second = _replay(venv, actions)
    assert any(not np.array_equal(first[0][0], f[0]) for f in first[1:]) or provider == "gradlab"
    for k, (a, b) in enumerate(zip(first, second, strict=True)):
        assert np.array_equal(a[0], b[0]), f"step {k}: observations differ after restore"
        assert a[1:] == b[1:], f"step {k}: reward/flags differ after restore"


@pytest.mark.slow
def test_a_state_captured_in_one_process_restores_in_another():
    """Async lanes: captured in one worker process, restored into a lane of a fresh env (another process)."""
    spec = _spec("gradlab", "KeyDoor-v0", {}, {}, "async", 1)
    path = [1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2, 2]
    with make_vector_env(spec, seed=0) as venv:
        venv.reset()
        for a in path:
            venv.step(np.array([a]))
        blob = venv.capture_lane(0)
        expected = _replay(venv, [np.array([1])] * 5)
    with make_vector_env(spec, seed=1) as fresh:
        fresh.reset()
        fresh.restore_lane(0, blob)
        again = _replay(fresh, [np.array([1])] * 5)
    assert [(o.tolist(), *rest) for o, *rest in again] == [(o.tolist(), *rest) for o, *rest in expected]
    assert expected[-1][0][0] > expected[0][0][0]  # the agent moved right: the replay is not trivial


def test_unsupported_providers_refuse_naming_themselves():
    with make_vector_env(_spec("ale", "Breakout", {}, {}, "sync", 1), seed=0) as venv:
        venv.reset()
        with pytest.raises(StateUnsupported, match="single_lanes"):
            venv.capture_lane(0)
    with make_vector_env(_spec("gymnasium", "Pendulum-v1", {}, {"frame_stack": 2}, "sync", 1), seed=0) as venv:
        venv.reset()
        with pytest.raises(StateUnsupported, match="frame_stack"):
            venv.capture_lane(0)


def test_vizdoom_declares_state_unsupported():
    with make_vector_env(_spec("vizdoom", "basic", {}, {}, "sync", 1), seed=0) as venv:
        venv.reset()
        assert "vizdoom" in (venv.backend.state_problem() or "")
        with pytest.raises(StateUnsupported, match="vizdoom"):
            venv.capture_lane(0)


def test_a_snapshot_of_another_environment_is_refused():
    with make_vector_env(_spec("gradlab", "Lives-v0", {}, {}, "sync", 1), seed=0) as lives:
        lives.reset()
        blob = lives.capture_lane(0)
    with make_vector_env(_spec("gradlab", "KeyDoor-v0", {}, {}, "sync", 1), seed=0) as maze:
        maze.reset()
        with pytest.raises(IntegrityError, match="gradlab:Lives-v0"):
            maze.restore_lane(0, blob)
        with pytest.raises(IntegrityError, match="GLSTATE1"):
            maze.restore_lane(0, b"not a snapshot")
