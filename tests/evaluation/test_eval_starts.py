"""Evaluation with ``eval.starts``: every manifest episode runs from its own start state."""

from __future__ import annotations

import pytest

from gradlab.errors import ContractViolation
from gradlab.evaluation import build_manifest, validate_result
from gradlab.evaluation.runner import evaluate_policy
from tests.evaluation.helpers import ConstantPolicy, goal_hashes, make_goal

CKPT = "cd" * 32


def _evaluate(goal):
    return evaluate_policy(ConstantPolicy(0), goal=goal, environment=goal.train.environment,
                           hashes=goal_hashes(goal), checkpoint_sha256=CKPT, checkpoint_step=500)


def _corridor_with_starts():
    # Start "near": 3 steps to the end (native termination = success); start "far": 8 steps, cut
    # at max_episode_steps 5 (timeout). The default length (10) would also hit the limit.
    return {"provider": "gradlab", "env_id": "Corridor-v0", "n_envs": 1,
            "provider_args": {"length": 10, "end": "terminate", "starts": {"near": 3, "far": 8}},
            "task": {"termination": {"native_terminated": "success", "max_episode_steps": 5}}}


def test_each_manifest_episode_runs_from_its_start():
    goal = make_goal(episodes=6, n_envs=3, env=_corridor_with_starts(), starts=["near", "far"],
                     acceptance=[{"metric": "eval/start/near/success/rate", "operator": ">=", "threshold": 1.0},
                                 {"metric": "eval/episode/length/mean", "operator": ">=", "threshold": 4.0}])
    result = _evaluate(goal)
    # Episode i: lane i % 3, start ["near", "far"][i % 2], so every lane alternates its starts.
    assert [(r.index, r.lane, r.start) for r in result.episodes] == [
        (0, 0, "near"), (1, 1, "far"), (2, 2, "near"), (3, 0, "far"), (4, 1, "near"), (5, 2, "far")]
    assert [r.length for r in result.episodes] == [3, 5, 3, 5, 3, 5]
    assert [r.outcome for r in result.episodes] == ["success", "timeout"] * 3
    assert [r.reason for r in result.episodes] == ["native_terminated", "max_episode_steps"] * 3
    assert [r.seed for r in result.episodes] == [e.seed for e in build_manifest(goal).episodes]
    agg = result.aggregates
    assert agg["eval/start/near/success/rate"] == 1.0 and agg["eval/start/far/success/rate"] == 0.0
    assert agg["eval/start/near/episodes"] == 3.0 and agg["eval/start/far/episodes"] == 3.0
    # Wilson 95% (z = 1.959964) for 0 of 3: center (z²/6) / (1 + z²/3) = 0.28075, half-width
    # z·sqrt(z²/36) / (1 + z²/3) = 0.28075: [0.0, 0.5615]; for 3 of 3 the mirror image [0.4385, 1.0].
    assert agg["eval/start/near/success/rate_ci95_low"] == pytest.approx(0.4385, abs=1e-4)
    assert agg["eval/start/near/success/rate_ci95_high"] == pytest.approx(1.0)
    assert agg["eval/start/far/success/rate_ci95_low"] == pytest.approx(0.0)
    assert agg["eval/start/far/success/rate_ci95_high"] == pytest.approx(0.5615, abs=1e-4)
    assert agg["eval/outcome/success/rate"] == 0.5
    assert agg["eval/episode/length/mean"] == 4.0 and agg["eval/episode/return/mean"] == 4.0
    assert result.verdict == "accepted"
    validate_result(result.as_json(), expected={"checkpoint_sha256": CKPT, **goal_hashes(goal)}, goal=goal)


def test_provider_without_starts_fails_before_any_episode():
    env = {"provider": "gymnasium", "env_id": "CartPole-v1", "n_envs": 1}
    goal = make_goal(episodes=4, n_envs=2, env=env, starts=["level1", "level2"])
    with pytest.raises(ContractViolation, match="gymnasium:CartPole-v1 has no start states, found start 'level1'"):
        _evaluate(goal)
