"""The runner over real gradlab and gymnasium environments with scripted policies."""

from __future__ import annotations

import json
import statistics

import pytest

from gradlab.contracts.hashing import canonical_json
from gradlab.errors import ContractViolation
from gradlab.evaluation import build_manifest, validate_result
from gradlab.evaluation.runner import evaluate_policy
from tests.evaluation.helpers import (
    ConstantPolicy,
    RandomPolicy,
    corridor_env,
    fail_on_env,
    goal_hashes,
    make_goal,
)

CKPT = "ab" * 32


def _evaluate(goal, policy=None, **kw):
    return evaluate_policy(policy or ConstantPolicy(0), goal=goal, environment=goal.train.environment,
                           hashes=goal_hashes(goal), checkpoint_sha256=CKPT, checkpoint_step=1000, **kw)


def test_unbiased_quotas_lanes_10_20_30_40():
    goal = make_goal(episodes=8, n_envs=4, env=corridor_env([10, 20, 30, 40]),
                     acceptance=[{"metric": "eval/episode/length/mean", "operator": ">=", "threshold": 25.0}])
    result = _evaluate(goal)
    assert [r.lane for r in result.episodes] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [r.length for r in result.episodes] == [10, 20, 30, 40, 10, 20, 30, 40]
    assert result.aggregates["eval/episode/length/mean"] == 25.0  # first-8-to-finish would give 18.75
    assert result.aggregates["eval/episode/return/mean"] == 25.0  # reward 1.0 per step
    assert result.aggregates["eval/outcome/timeout/rate"] == 1.0
    assert {r.reason for r in result.episodes} == {"native_time_limit"}
    assert result.verdict == "accepted" and (result.planned, result.completed) == (8, 8)
    manifest = build_manifest(goal)
    assert [r.seed for r in result.episodes] == [e.seed for e in manifest.episodes]
    assert result.hashes["episode_manifest_sha256"] == manifest.sha256
    validate_result(result.as_json(), expected={"checkpoint_sha256": CKPT, **goal_hashes(goal)}, goal=goal)


def test_fail_fast_stops_at_third_episode():
    seeds = [e.seed for e in build_manifest(make_goal(episodes=10, n_envs=1)).episodes]
    goal = make_goal(episodes=10, n_envs=1, env=fail_on_env(fail_seeds=[seeds[2]]),
                     acceptance=[{"metric": "eval/outcome/success/rate", "operator": ">=", "threshold": 1.0}])
    result = _evaluate(goal)
    assert (result.planned, result.completed) == (10, 3)
    assert [r.outcome for r in result.episodes] == ["success", "success", "failure"]
    assert result.verdict == "rejected" and result.fail_fast
    assert result.aggregates["eval/acceptance/episodes/completed"] == 3.0
    assert result.aggregates["eval/acceptance/episodes/planned"] == 10.0
    assert result.aggregates["eval/acceptance/pass"] == 0.0
    assert result.aggregates["eval/outcome/failure/miss/rate"] == pytest.approx(1 / 3)
    validate_result(result, expected={}, goal=goal)


def test_fail_fast_with_lanes_keeps_earlier_lanes_of_the_same_step():
    seeds = [e.seed for e in build_manifest(make_goal(episodes=8, n_envs=4)).episodes]
    goal = make_goal(episodes=8, n_envs=4, env=fail_on_env(fail_seeds=[seeds[2]]),
                     acceptance=[{"metric": "eval/outcome/success/rate", "operator": ">=", "threshold": 1.0}])
    result = _evaluate(goal)
    assert [r.index for r in result.episodes] == [0, 1, 2] and result.completed == 3


def test_without_fail_fast_all_episodes_run():
    seeds = [e.seed for e in build_manifest(make_goal(episodes=6, n_envs=2)).episodes]
    goal = make_goal(episodes=6, n_envs=2, env=fail_on_env(fail_seeds=[seeds[1], seeds[4]]),
                     acceptance=[{"metric": "eval/outcome/success/rate", "operator": ">=", "threshold": 0.5}])
    result = _evaluate(goal)
    assert result.completed == 6
    assert [r.outcome for r in result.episodes] == ["success", "failure", "success", "success", "failure", "success"]
    assert result.aggregates["eval/outcome/success/rate"] == pytest.approx(4 / 6)
    assert result.verdict == "accepted"


def test_cartpole_always_left_is_rejected_and_mean_is_mean_of_rows():
    goal = make_goal(episodes=8, n_envs=4)  # CartPole-v1, return mean >= 475
    result = _evaluate(goal, ConstantPolicy(0))
    returns = [r.return_ for r in result.episodes]
    assert result.verdict == "rejected"
    assert result.aggregates["eval/episode/return/mean"] == statistics.fmean(returns)
    assert all(8 <= r <= 12 for r in returns)  # pushing left topples the pole in ~8-11 steps
    assert {r.outcome for r in result.episodes} == {"failure"}
    assert result.aggregates["eval/outcome/failure/native_terminated/rate"] == 1.0
    assert [r.length for r in result.episodes] == [int(r) for r in returns]


def test_same_policy_twice_gives_byte_identical_rows():
    goal = make_goal(episodes=6, n_envs=3, policy="stochastic")
    a = _evaluate(goal, RandomPolicy())
    b = _evaluate(goal, RandomPolicy())
    rows_a = canonical_json([r.as_json() for r in a.episodes])
    assert rows_a == canonical_json([r.as_json() for r in b.episodes])
    assert a.aggregates == b.aggregates and a.hashes == b.hashes
    other = _evaluate(make_goal(episodes=6, n_envs=3, policy="stochastic", seed=1), RandomPolicy())
    assert other.hashes["episode_manifest_sha256"] != a.hashes["episode_manifest_sha256"]


def _result_json():
    goal = make_goal(episodes=4, n_envs=2, env=corridor_env([3, 5]),
                     acceptance=[{"metric": "eval/episode/return/mean", "operator": ">=", "threshold": 4.0}])
    return goal, _evaluate(goal).as_json()


def test_validator_refuses_edited_rows_and_wrong_checkpoint_hash():
    goal, data = _result_json()
    expected = {"checkpoint_sha256": CKPT, **goal_hashes(goal)}
    assert validate_result(data, expected=expected, goal=goal).verdict == "accepted"

    edited = json.loads(json.dumps(data))
    edited["episodes"][0]["return"] = 30.0
    with pytest.raises(ContractViolation, match="episodes_sha256"):
        validate_result(edited, expected=expected, goal=goal)

    # Rows edited and the rows hash recomputed: the aggregates still give it away.
    from gradlab.evaluation.result import EpisodeRow, episodes_sha256

    edited["hashes"]["episodes_sha256"] = episodes_sha256([EpisodeRow.model_validate(r) for r in edited["episodes"]])
    with pytest.raises(ContractViolation, match=r"aggregate eval/episode/return/mean is 4.0, the rows give 10.75"):
        validate_result(edited, expected=expected, goal=goal)

    reseeded = json.loads(json.dumps(data))
    reseeded["episodes"][1]["seed"] += 1
    with pytest.raises(ContractViolation, match="episode 1"):
        validate_result(reseeded, expected=expected, goal=goal)

    with pytest.raises(ContractViolation, match="checkpoint_sha256 is"):
        validate_result(data, expected={**expected, "checkpoint_sha256": "cd" * 32}, goal=goal)

    flipped = json.loads(json.dumps(data))
    flipped["verdict"] = "rejected"
    with pytest.raises(ContractViolation, match="verdict"):
        validate_result(flipped, expected=expected, goal=goal)

    truncated = json.loads(json.dumps(data))
    truncated["episodes"] = truncated["episodes"][:3]
    with pytest.raises(ContractViolation):
        validate_result(truncated, expected=expected, goal=goal)


def test_validator_refuses_other_manifest_or_protocol():
    goal, data = _result_json()
    with pytest.raises(ContractViolation, match="episode_manifest_sha256"):
        validate_result(data, expected={}, goal=make_goal(episodes=4, n_envs=2, seed=7, env=corridor_env([3, 5]),
                                                          acceptance=goal.eval.model_dump()["acceptance"]))
    with pytest.raises(ContractViolation, match="planned 4 episodes"):
        validate_result(data, expected={}, goal=goal.model_copy(update={"eval": goal.eval.model_copy(
            update={"episodes": 5})}))
    with pytest.raises(ContractViolation, match="malformed"):
        validate_result({"verdict": "accepted"}, expected={}, goal=goal)


def test_environment_hash_mismatch_is_refused():
    goal = make_goal(episodes=2, n_envs=1, env=corridor_env([3]))
    hashes = {**goal_hashes(goal), "environment_sha256": "0" * 64}
    with pytest.raises(ContractViolation, match="environment sha256"):
        evaluate_policy(ConstantPolicy(0), goal=goal, environment=goal.train.environment, hashes=hashes,
                        checkpoint_sha256=CKPT, checkpoint_step=0)
