"""Manifest, Wilson interval, aggregates and acceptance: hand-computed values."""

from __future__ import annotations

import math

import pytest

from gradlab.contracts.goal import AcceptanceRule
from gradlab.contracts.seeds import EVAL_SEED_OFFSET, MAX_RUN_SEED
from gradlab.errors import ContractViolation
from gradlab.evaluation import (
    EpisodeRow,
    build_manifest,
    compute_aggregates,
    requires_perfect_success,
    wilson_interval,
)
from gradlab.evaluation.stats import summarize
from tests.evaluation.helpers import make_goal


def test_manifest_quotas_lanes_and_seeds():
    m = build_manifest(make_goal(episodes=10, n_envs=4, seed=3))
    assert m.planned == 10
    assert [e.lane for e in m.episodes] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert [len(q) for q in m.lane_queues()] == [3, 3, 2, 2]
    assert [e.index for e in m.lane_queues()[1]] == [1, 5, 9]
    assert m.episodes[0].seed == 2**31 + 3 * 2**16
    assert m.episodes[9].seed == 2**31 + 3 * 2**16 + 9
    assert all(e.start is None for e in m.episodes)


def test_manifest_eval_seeds_never_overlap_training_seeds():
    # Training lane seeds are run_seed * 1024 + lane with run_seed <= MAX_RUN_SEED and lane < 1024.
    largest_training_seed = MAX_RUN_SEED * 1024 + 1023
    assert largest_training_seed < EVAL_SEED_OFFSET
    for base in (0, 1, 2**30 - 1):
        m = build_manifest(make_goal(episodes=100, n_envs=8, seed=base))
        seeds = [e.seed for e in m.episodes]
        assert min(seeds) >= EVAL_SEED_OFFSET and max(seeds) < 2**32
        assert len(set(seeds)) == 100


def test_manifest_is_deterministic_and_seed_changes_hash():
    a = build_manifest(make_goal(seed=0))
    b = build_manifest(make_goal(seed=0))
    c = build_manifest(make_goal(seed=1))
    assert a.sha256 == b.sha256 and len(a.sha256) == 64
    assert a.sha256 != c.sha256
    assert build_manifest(make_goal(seed=0), episodes=11).sha256 != a.sha256


def test_manifest_fewer_episodes_than_lanes_and_starts():
    m = build_manifest(make_goal(episodes=3, n_envs=8, starts=["a", "b"]))
    assert m.n_lanes == 3
    assert [(e.lane, e.start) for e in m.episodes] == [(0, "a"), (1, "b"), (2, "a")]
    with pytest.raises(ContractViolation, match="episodes must be >= 1"):
        build_manifest(make_goal(), episodes=0)


def test_wilson_95_of_100():
    low, high = wilson_interval(95, 100)
    assert (round(low, 3), round(high, 3)) == (0.888, 0.978)


def test_wilson_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(10, 10)
    assert high == pytest.approx(1.0) and round(low, 4) == 0.7225  # 10 / (10 + z^2) = 0.72247
    low, high = wilson_interval(0, 10)
    assert low == pytest.approx(0.0, abs=1e-12) and round(high, 4) == 0.2775
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_summarize_hand_values():
    s = summarize([1.0, 2.0, 3.0, 10.0])
    assert s == {"mean": 4.0, "std": math.sqrt(((3**2) + 2**2 + 1 + 36) / 4), "median": 2.5, "min": 1.0, "max": 10.0}


def _row(i, ret, length, outcome="timeout", reason="native_time_limit", start=None, lane=0):
    return EpisodeRow(index=i, lane=lane, seed=EVAL_SEED_OFFSET + i, start=start, **{"return": ret},
                      raw_return=ret, length=length, outcome=outcome, reason=reason)


def test_aggregates_and_verdict():
    rows = [
        _row(0, 10.0, 10, "success", "goal", start="s1"),
        _row(1, 20.0, 20, "failure", "fell", start="s2"),
        _row(2, 30.0, 30, "failure", "fell", start="s1"),
        _row(3, 40.0, 40, "timeout", "native_time_limit", start="s2"),
    ]
    rules = [AcceptanceRule(metric="eval/episode/return/mean", operator=">=", threshold=25.0)]
    agg, verdict = compute_aggregates(rows, planned=4, checkpoint_step=2048, rules=rules)
    assert agg["eval/episode/return/mean"] == 25.0
    assert agg["eval/episode/return/median"] == 25.0
    assert agg["eval/episode/return/min"] == 10.0 and agg["eval/episode/return/max"] == 40.0
    assert agg["eval/episode/return/std"] == pytest.approx(math.sqrt(125.0))
    assert agg["eval/episode/length/mean"] == 25.0
    assert agg["eval/outcome/success/rate"] == 0.25
    assert agg["eval/outcome/failure/rate"] == 0.5
    assert agg["eval/outcome/timeout/rate"] == 0.25
    assert agg["eval/outcome/failure/fell/rate"] == 0.5
    assert agg["eval/start/s1/success/rate"] == 0.5 and agg["eval/start/s2/success/rate"] == 0.0
    assert agg["eval/start/s1/episodes"] == 2.0
    assert (agg["eval/outcome/success/rate_ci95_low"], agg["eval/outcome/success/rate_ci95_high"]) == \
        wilson_interval(1, 4)
    assert agg["eval/acceptance/episodes/planned"] == 4.0
    assert agg["eval/acceptance/episodes/completed"] == 4.0
    assert agg["eval/checkpoint_step"] == 2048.0
    assert verdict == "accepted" and agg["eval/acceptance/pass"] == 1.0
    strict = [AcceptanceRule(metric="eval/episode/return/mean", operator=">", threshold=25.0)]
    assert compute_aggregates(rows, planned=4, checkpoint_step=0, rules=strict)[1] == "rejected"
    # Fewer completed than planned is never accepted.
    agg, verdict = compute_aggregates(rows, planned=5, checkpoint_step=0, rules=rules)
    assert verdict == "rejected" and agg["eval/acceptance/pass"] == 0.0


def test_aggregate_names_are_registered():
    from gradlab.metrics.registry import check_names

    rows = [_row(0, 1.0, 1, "failure", "fell over!", start="level 1")]
    agg, _ = compute_aggregates(rows, planned=1, checkpoint_step=0, rules=[])
    assert "eval/outcome/failure/fell_over_/rate" in agg and "eval/start/level_1/success/rate" in agg
    check_names(agg)


def test_rule_on_absent_failure_reason_reads_zero_and_unknown_metric_is_refused():
    rows = [_row(0, 1.0, 1, "success", "goal")]
    ok = [AcceptanceRule(metric="eval/outcome/failure/fell/rate", operator="<=", threshold=0.0)]
    assert compute_aggregates(rows, planned=1, checkpoint_step=0, rules=ok)[1] == "accepted"
    bad = [AcceptanceRule(metric="eval/episode/retrun/mean", operator=">=", threshold=0.0)]
    with pytest.raises(ContractViolation, match="retrun"):
        compute_aggregates(rows, planned=1, checkpoint_step=0, rules=bad)


def test_requires_perfect_success():
    def rule(metric, op, t):
        return AcceptanceRule(metric=metric, operator=op, threshold=t)

    assert requires_perfect_success([rule("eval/outcome/success/rate", ">=", 1.0)])
    assert requires_perfect_success([rule("eval/outcome/success/rate", "==", 1.0),
                                     rule("eval/start/a/success/rate", ">=", 1.0)])
    assert not requires_perfect_success([rule("eval/outcome/success/rate", ">=", 0.95)])
    assert not requires_perfect_success([rule("eval/outcome/success/rate", ">=", 1.0),
                                         rule("eval/episode/return/mean", ">=", 1.0)])
    assert not requires_perfect_success([])
