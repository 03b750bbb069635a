"""Vector envs over the built-in deterministic envs: truncation, termination, same-step autoreset."""

from __future__ import annotations

import numpy as np
import pytest

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.envs import make_vector_env, training_lane_seeds
from gradlab.errors import ConfigError, ContractViolation, NotFound


def _spec(env_id="Corridor-v0", n_envs=1, task=None, **provider_args) -> EnvironmentSpec:
    return EnvironmentSpec.model_validate({"provider": "gradlab", "env_id": env_id, "n_envs": n_envs,
                                           "provider_args": provider_args, "task": task or {}})


def _noop(n):
    return np.zeros(n, dtype=np.int64)


def _step_until_end(venv, max_steps=100):
    for t in range(1, max_steps + 1):
        res = venv.step(_noop(venv.num_envs))
        if res.episodes:
            return t, res
    raise AssertionError("no episode ended")


def test_corridor_truncating_at_5_is_truncated_with_real_final_obs():
    with make_vector_env(_spec(length=5, end="truncate"), seed=0) as venv:
        assert venv.reset().tolist() == [[0.0]]
        t, res = _step_until_end(venv)
    assert t == 5
    assert res.truncated.tolist() == [True] and res.terminated.tolist() == [False]
    assert res.final_obs[0].tolist() == [5.0]  # the true final observation
    assert res.obs.tolist() == [[0.0]]  # already the next episode's first observation
    ep = res.episodes[0]
    assert (ep.outcome, ep.reason, ep.length, ep.return_) == ("timeout", "native_time_limit", 5, 5.0)


def test_task_max_episode_steps_truncates_a_corridor_that_never_ends():
    spec = _spec(length=1000, end="none", task={"termination": {"max_episode_steps": 5}})
    with make_vector_env(spec, seed=0) as venv:
        venv.reset()
        t, res = _step_until_end(venv)
    assert t == 5
    assert res.truncated.tolist() == [True] and res.terminated.tolist() == [False]
    assert res.final_obs[0].tolist() == [5.0]
    assert res.episodes[0].reason == "max_episode_steps"


def test_corridor_terminating_at_5_is_terminated():
    spec = _spec(length=5, end="terminate", task={"termination": {"native_terminated": "success"}})
    with make_vector_env(spec, seed=0) as venv:
        venv.reset()
        t, res = _step_until_end(venv)
    assert t == 5
    assert res.terminated.tolist() == [True] and res.truncated.tolist() == [False]
    assert res.final_obs[0].tolist() == [5.0]
    assert (res.episodes[0].outcome, res.episodes[0].reason) == ("success", "native_terminated")


def test_a_step_both_terminal_and_truncated_is_terminal():
    with make_vector_env(_spec(length=5, end="both"), seed=0) as venv:
        venv.reset()
        _, res = _step_until_end(venv)
    assert res.terminated.tolist() == [True] and res.truncated.tolist() == [False]
    # Also when the task program's limit coincides with the provider's termination.
    spec = _spec(length=5, end="terminate", task={"termination": {"max_episode_steps": 5}})
    with make_vector_env(spec, seed=0) as venv:
        venv.reset()
        _, res = _step_until_end(venv)
    assert res.terminated.tolist() == [True] and res.truncated.tolist() == [False]
    assert res.episodes[0].reason == "native_terminated"


def _collect(venv, n_steps):
    """Transitions (obs, next_obs, reward, terminated, truncated) a learner would store."""
    obs = venv.reset()
    transitions, episodes = [], []
    for _ in range(n_steps):
        res = venv.step(_noop(venv.num_envs))
        for lane in range(venv.num_envs):
            nxt = res.final_obs.get(lane, res.obs[lane])
            transitions.append((obs[lane].copy(), nxt.copy(), float(res.reward[lane]),
                                bool(res.terminated[lane]), bool(res.truncated[lane])))
        episodes += res.episodes
        obs = res.obs
    return transitions, episodes


def test_autoreset_two_lanes_truncating_at_3():
    # 6 vector steps x 2 lanes = 12 real transitions: 4 episodes (2 per lane) of 3 steps, return 3.0.
    with make_vector_env(_spec(n_envs=2, length=3), seed=0) as venv:
        transitions, episodes = _collect(venv, 6)
    assert len(transitions) == 12
    assert [(e.lane, e.length, e.return_) for e in episodes] == [(0, 3, 3.0), (1, 3, 3.0)] * 2
    # Every transition moves one step along the corridor: none pairs a final obs (3) with a reset obs (0).
    assert all(nxt[0] - obs[0] == 1.0 for obs, nxt, *_ in transitions)
    assert sum(tr for *_, tr in transitions) == 4
    assert sum(te for *_, te, _tr in transitions) == 0


def test_autoreset_eight_steps_has_no_dead_transition():
    # Same-step autoreset: 8 vector steps give 16 real transitions (gymnasium's next-step
    # autoreset would give 12 real + 4 dead reset steps); 4 finished episodes, 2 lanes mid-episode.
    with make_vector_env(_spec(n_envs=2, length=3), seed=0) as venv:
        transitions, episodes = _collect(venv, 8)
    assert len(transitions) == 16
    assert len(episodes) == 4 and {(e.length, e.return_) for e in episodes} == {(3, 3.0)}
    assert all(nxt[0] - obs[0] == 1.0 for obs, nxt, *_ in transitions)
    assert [t[1][0] for t in transitions[-2:]] == [2.0, 2.0]


def test_lanes_with_different_episode_lengths():
    with make_vector_env(_spec(n_envs=4, length=[10, 20, 30, 40]), seed=0) as venv:
        venv.reset()
        episodes = []
        for _ in range(40):
            episodes += venv.step(_noop(4)).episodes
    by_lane = {lane: [e.length for e in episodes if e.lane == lane] for lane in range(4)}
    assert by_lane == {0: [10, 10, 10, 10], 1: [20, 20], 2: [30], 3: [40]}


def test_lives_signal_decrease_ends_the_episode_as_failure():
    task = {"signals": {"lives": {"source": "info", "key": "lives"}},
            "events": {"life_lost": {"signal": "lives", "op": "decrease"}},
            "termination": {"failure": ["life_lost"]}, "progress": ["lives"]}
    with make_vector_env(_spec("Lives-v0", lives=3, lose_every=4, task=task), seed=0) as venv:
        venv.reset()
        t, res = _step_until_end(venv)
    assert t == 4
    assert res.terminated.tolist() == [True]
    ep = res.episodes[0]
    assert (ep.outcome, ep.reason, ep.progress) == ("failure", "life_lost", {"lives": 2.0})


def test_ram_signal_and_native_game_over():
    task = {"signals": {"lives": {"source": "ram", "address": 0}}, "progress": ["lives"],
            "termination": {"native_terminated": "failure"}}
    with make_vector_env(_spec("Lives-v0", lives=2, lose_every=3, task=task), seed=0) as venv:
        venv.reset()
        t, res = _step_until_end(venv)
    assert t == 6
    assert (res.episodes[0].outcome, res.episodes[0].reason) == ("failure", "native_terminated")
    assert res.episodes[0].progress == {"lives": 0.0}
    assert res.signals["lives"].tolist() == [0.0]


def test_ram_signal_on_a_provider_without_ram_is_a_config_error():
    task = {"signals": {"x": {"source": "ram", "address": 0}}}
    with pytest.raises(ConfigError, match="does not expose RAM"):
        make_vector_env(_spec(task=task), seed=0)


def test_fail_on_episode_index():
    task = {"signals": {"success": {"source": "info", "key": "success"}},
            "events": {"won": {"signal": "success", "op": "equals", "value": True},
                       "lost": {"signal": "success", "op": "equals", "value": False}},
            "termination": {"success": ["won"], "failure": ["lost"]}}
    with make_vector_env(_spec("FailOn-v0", length=2, fail_episodes=[1], task=task), seed=0) as venv:
        venv.reset()
        episodes = []
        for _ in range(6):
            episodes += venv.step(_noop(1)).episodes
    assert [(e.outcome, e.raw_return) for e in episodes] == [("success", 1.0), ("failure", 0.0), ("success", 1.0)]


def test_bandit_rewards_the_observed_arm_and_seeds_are_reproducible():
    spec = _spec("Bandit-v0", n_envs=8, n_arms=4)
    with make_vector_env(spec, seed=3) as a, make_vector_env(spec, seed=3) as b:
        oa, ob = a.reset(), b.reset()
        assert oa.shape == (8, 4) and oa.dtype == np.float32
        assert np.array_equal(oa, ob)
        res = a.step(oa.argmax(axis=1))
        assert res.raw_reward.tolist() == [1.0] * 8
        assert res.terminated.all() and not res.truncated.any()
        assert all(info["correct"] is True for info in res.infos)
        wrong = (res.obs.argmax(axis=1) + 1) % 4
        assert a.step(wrong).raw_reward.tolist() == [0.0] * 8
        assert [e.seed for e in res.episodes] == training_lane_seeds(3, 8)


def test_set_next_seed_reproduces_an_episode_start():
    spec = _spec("Bandit-v0", n_envs=2, n_arms=64)
    with make_vector_env(spec, seed=0, lane_seeds=[100, 200]) as venv:
        first = venv.reset().argmax(axis=1)
        venv.set_next_seed(1, 100)
        res = venv.step(np.zeros(2, dtype=np.int64))
        assert res.obs[1].argmax() == first[0]  # lane 1 restarted with lane 0's first seed
        assert [e.seed for e in res.episodes] == [100, 200]
        res = venv.step(np.zeros(2, dtype=np.int64))
        assert [e.seed for e in res.episodes] == [None, 100]


def test_training_lane_seeds():
    assert training_lane_seeds(3, 2) == [3072, 3073]
    with pytest.raises(ConfigError):
        training_lane_seeds(-1, 2)


def test_wrong_action_shape_and_unknown_env():
    with make_vector_env(_spec(n_envs=2), seed=0) as venv:
        venv.reset()
        with pytest.raises(ContractViolation, match=r"expected shape \(2,\)"):
            venv.step(np.zeros(3, dtype=np.int64))
    with pytest.raises(NotFound, match="no environment 'Nope-v0'"):
        make_vector_env(_spec("Nope-v0"), seed=0)
    with pytest.raises(ConfigError, match="provider_args.lenght"):
        make_vector_env(_spec(lenght=3), seed=0)


def test_render_gives_rgb_frames_per_lane():
    with make_vector_env(_spec(n_envs=2, length=4), seed=0, render_mode="rgb_array") as venv:
        venv.reset()
        venv.step(_noop(2))
        frames = venv.render()
    assert len(frames) == 2 and frames[0].shape == (16, 64, 3) and frames[0].dtype == np.uint8
    assert int((frames[0][0, :, 2] > 0).sum()) == 16  # 1 of 4 steps: a quarter of the width lit


@pytest.mark.slow
def test_async_lanes_match_sync_lanes():
    spec = _spec(n_envs=3, length=[2, 3, 4])
    results = []
    for mode in ("sync", "async"):
        s = spec.model_copy(update={"vectorization": mode})
        with make_vector_env(s, seed=0) as venv:
            venv.reset()
            eps = []
            for _ in range(12):
                eps += [(e.lane, e.length) for e in venv.step(_noop(3)).episodes]
        results.append(eps)
    assert results[0] == results[1]
    assert len(results[0]) == 6 + 4 + 3
