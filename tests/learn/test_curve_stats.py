"""The noise verdicts of ``gradlab benchmark curves`` on hand-built curves (gradlab/benchmarks/curve_stats.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradlab.benchmarks.curve_sides import Side, run_key
from gradlab.benchmarks.curve_stats import (
    Curve,
    compare_area,
    compare_at,
    episode_comparison,
    milestones,
    seed_comparison,
    verdict,
)
from gradlab.errors import ConfigError


def _curve(level: float, noise: float = 1.0, episodes: int = 400, every: int = 50, seed: int = 0) -> Curve:
    """Episodes every ``every`` env steps with returns ``level + noise * N(0, 1)``."""
    rng = np.random.default_rng(seed)
    return Curve.of(np.arange(1, episodes + 1) * every, level + noise * rng.standard_normal(episodes))


def test_rolling_mean_window_and_points_at_a_step() -> None:
    c = Curve.of([10, 10, 20, 30, 40], [1.0, 3.0, 5.0, 7.0, 9.0])
    np.testing.assert_allclose(c.rolling(window=2), [1.0, 2.0, 4.0, 6.0, 8.0])
    np.testing.assert_allclose(c.rolling(window=100), [1.0, 2.0, 3.0, 4.0, 5.0])
    assert math.isnan(c.at(9)) and c.last_window(9).size == 0
    assert c.at(10) == 2.0 and c.at(29, window=2) == 4.0 and c.at(30, window=2) == 6.0  # ended at or before
    # The area statistic is the mean of the curve at the milestones that have an episode.
    assert c.area([5, 20, 40], window=2) == pytest.approx((4.0 + 8.0) / 2)
    with pytest.raises(ValueError, match="non-decreasing"):
        Curve.of([2, 1], [0.0, 0.0])
    with pytest.raises(ValueError, match="equal 1-d lengths"):
        Curve.of([1, 2], [0.0])


def test_seed_noise_is_twice_the_standard_error_from_the_spread_between_seeds() -> None:
    # a: 1, 3 (sd sqrt 2); b: 2, 4 (sd sqrt 2); pooled sqrt 2; 2 * sqrt 2 * sqrt(1/2 + 1/2) = 2.83.
    c = seed_comparison("end", [1.0, 3.0], [2.0, 4.0])
    assert c.kind == "seed" and c.diff == 1.0 and c.noise == pytest.approx(2 * math.sqrt(2))
    assert c.within and c.ref_sd == pytest.approx(math.sqrt(2)) and (c.n_ref, c.n_other) == (2, 2)
    far = seed_comparison("end", [1.0, 3.0], [6.0, 8.0])  # diff 5 > 2.83
    assert far.within is False and far.lo == pytest.approx(5 - 2 * math.sqrt(2))
    # Tight seeds make a small difference significant; identical seeds only an identical figure.
    assert seed_comparison("end", [10.0, 10.1, 9.9], [10.6, 10.5, 10.7]).within is False
    assert seed_comparison("end", [2.0, 2.0], [2.0, 2.0]).within is True
    with pytest.raises(ValueError, match=">= 2 seeds per side"):
        seed_comparison("end", [1.0], [2.0, 3.0])


def test_episode_bootstrap_interval_contains_zero_only_for_the_same_level() -> None:
    same = episode_comparison("end", _curve(5.0, seed=1).returns[-100:], _curve(5.0, seed=2).returns[-100:])
    assert same.kind == "episode" and same.within and same.lo < 0 < same.hi
    assert same.noise == pytest.approx((same.hi - same.lo) / 2)
    # SE of a difference of two 100-episode means with sd 1: 0.14; 95% half-width ~0.28.
    assert 0.2 < same.noise < 0.4
    apart = episode_comparison("end", _curve(5.0, seed=1).returns[-100:], _curve(6.0, seed=2).returns[-100:])
    assert apart.within is False and apart.lo > 0
    again = episode_comparison("end", _curve(5.0, seed=1).returns[-100:], _curve(6.0, seed=2).returns[-100:])
    assert (again.lo, again.hi) == (apart.lo, apart.hi)  # a fixed generator: the same interval every time


def test_compare_at_uses_seed_noise_with_two_seeds_per_side_and_episode_noise_with_one() -> None:
    ref = [_curve(10.0, seed=s) for s in range(3)]
    same = [_curve(10.0, seed=10 + s) for s in range(3)]
    better = [_curve(14.0, seed=10 + s) for s in range(3)]
    at = compare_at(20_000, ref, same)
    assert at.kind == "seed" and at.within and at.point == "20000"
    assert compare_at(20_000, ref, better).within is False
    one = compare_at(20_000, ref[:1], same[:1])
    assert one.kind == "episode" and one.within and (one.n_ref, one.n_other) == (1, 1)
    # Before any episode on a side: not judged.
    late = [Curve.of([30_000], [1.0])]
    assert compare_at(20_000, ref, late).kind == "none" and compare_at(20_000, ref, late).within is None


def test_verdict_needs_the_final_point_and_the_area_within_seed_noise() -> None:
    marks = milestones(20_000, 5_000)
    assert marks == [5_000, 10_000, 15_000, 20_000] and milestones(10, 3) == [3, 6, 9, 10]
    ref = [_curve(10.0, seed=s) for s in range(3)]
    same = [_curve(10.0, seed=10 + s) for s in range(3)]
    v = verdict("gradlab.ppo", "sb3.ppo", compare_at(20_000, ref, same), compare_area(marks, ref, same))
    assert v.within is True and v.kind == "seed" and "within seed noise" in v.text and "3 and 3 seeds" in v.text
    # Same end, a different start: the final point agrees but the area does not.
    slow_start = [Curve.of(c.steps, np.where(c.steps <= 15_000, c.returns - 8.0, c.returns)) for c in same]
    final = compare_at(20_000, ref, slow_start)
    area = compare_area(marks, ref, slow_start)
    assert final.within and area.within is False
    v = verdict("gradlab.ppo", "sb3.ppo", final, area)
    assert v.within is False and "NOT within seed noise" in v.text
    # One seed: episode noise only, and it says that seed noise was not estimated.
    one = verdict("gradlab.ppo:bf16", "gradlab.ppo", compare_at(20_000, ref[:1], same[:1]),
                  compare_area(marks, ref[:1], same[:1]))
    assert one.kind == "episode" and one.within is True and "seed noise NOT estimated" in one.text
    assert compare_area(marks, ref[:1], same[:1]).kind == "none"


def test_side_syntax() -> None:
    assert Side.parse("gradlab.ppo:bf16") == Side("gradlab.ppo", "bf16")
    assert Side.parse("sb3.ppo").label == "sb3.ppo" and Side.parse("gradlab.ppo:fp32").label == "gradlab.ppo"
    # A recipe of the goal on a side: the label keeps it, a run's file name has no '@' or ':'.
    variant = Side.parse("gradlab.ppo:bf16@ppo-archive-curriculum")
    assert variant == Side("gradlab.ppo", "bf16", "ppo-archive-curriculum")
    assert variant.label == "gradlab.ppo:bf16@ppo-archive-curriculum"
    assert run_key(variant, 2) == "gradlab.ppo-bf16-ppo-archive-curriculum-s2"
    for bad, message in (("sb3.a2c", "expected a backend"), ("gradlab.ppo:fp8", "expected a precision"),
                         ("sb3.ppo:bf16", "fp32 only"), ("gradlab.ppo@", "expected a recipe name")):
        with pytest.raises(ConfigError, match=message):
            Side.parse(bad)


def test_sides_whose_returns_never_vary_are_not_judged_within_noise() -> None:
    """Every episode 0 on both sides (the maze before either side finds the goal): no noise to be within."""
    flat = [Curve.of([100 * (i + 1) for i in range(50)], [0.0] * 50) for _ in range(2)]
    marks = [2_500, 5_000]
    for ref, other in ((flat, flat), (flat[:1], flat[:1])):
        v = verdict("b", "a", compare_at(5_000, ref, other), compare_area(marks, ref, other))
        assert v.within is None and v.kind == "none" and "no spread to judge against" in v.text
