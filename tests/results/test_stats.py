"""Cohort statistics on fixed score arrays: hand computations, and agreement with rliable."""

from __future__ import annotations

import numpy as np
import pytest

from gradlab.results import stats


def test_iqm_hand_computed() -> None:
    # 8 seeds: floor(8/4) = 2 trimmed from each end -> mean of the sorted middle four (3, 4, 5, 6).
    assert stats.iqm([8, 1, 7, 2, 6, 3, 5, 4]) == pytest.approx(4.5)
    # 5 seeds: floor(5/4) = 1 trimmed each end -> mean(2, 3, 10) = 5.
    assert stats.iqm([100, 2, 3, 10, -50]) == pytest.approx(5.0)
    # 3 seeds: nothing trimmed (floor(3/4) = 0) -> the plain mean.
    assert stats.iqm([1, 2, 6]) == pytest.approx(3.0)


def test_iqm_matches_rliable() -> None:
    from rliable import metrics

    rng = np.random.default_rng(7)
    for n in (3, 4, 5, 10, 17):
        x = rng.normal(size=n)
        assert stats.iqm(x) == pytest.approx(float(metrics.aggregate_iqm(x.reshape(n, 1))))


def test_bootstrap_interval_fixed_seed_and_hand_checks() -> None:
    x = [0.0, 1.0]
    # Two seeds: resamples are (0,0), (0,1), (1,0), (1,1) -> IQM (no trimming) 0, .5, .5, 1; the
    # 2.5% and 97.5% quantiles over many resamples are 0 and 1.
    assert stats.stratified_bootstrap_ci(x, reps=4000, seed=0) == (0.0, 1.0)
    # Constant scores: every resample has the same IQM, the interval collapses onto it.
    assert stats.stratified_bootstrap_ci([3.0, 3.0, 3.0, 3.0]) == (3.0, 3.0)
    # A fixed seed gives a fixed interval; the interval brackets the point estimate.
    scores = [0.91, 0.95, 0.97, 0.99, 1.0]
    a = stats.stratified_bootstrap_ci(scores, seed=3)
    assert a == stats.stratified_bootstrap_ci(scores, seed=3)
    assert a[0] <= stats.iqm(scores) <= a[1]
    assert min(scores) <= a[0] and a[1] <= max(scores)


def test_bootstrap_interval_matches_the_exact_bootstrap_distribution() -> None:
    # rliable's bootstrap (library.get_interval_estimates) does not import here (its `arch`
    # dependency breaks on this pandas), so the interval is checked against the exact bootstrap
    # distribution: for 3 seeds all 27 resamples are equally likely; IQM of 3 = their mean.
    import itertools

    scores = np.array([0.0, 0.3, 1.0])
    exact = np.sort([scores[list(r)].mean() for r in itertools.product(range(3), repeat=3)])
    # 27 equally likely values: P(IQM = 0.0) = 1/27 > 2.5% and P(IQM = 1.0) = 1/27 > 2.5%, so the
    # distribution's 2.5% and 97.5% quantiles are exactly 0.0 and 1.0 and the next values in are 0.1
    # and 0.7667: with many resamples the percentile bounds land on 0.0 and 1.0.
    assert exact[0] == 0.0 and exact[1] == pytest.approx(0.1) and exact[-1] == 1.0
    assert exact[-2] == pytest.approx((0.3 + 1.0 + 1.0) / 3)
    assert stats.stratified_bootstrap_ci(scores, reps=50000, seed=0) == (0.0, 1.0)
    # 5 seeds, 50% coverage, checked against a brute-force quantile of the exact distribution.
    five = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    every = np.array([stats.iqm(five[list(r)]) for r in itertools.product(range(5), repeat=5)])
    low, high = stats.stratified_bootstrap_ci(five, reps=100000, seed=0, confidence=0.5)
    assert low == pytest.approx(np.quantile(every, 0.25), abs=0.15)
    assert high == pytest.approx(np.quantile(every, 0.75), abs=0.15)


def test_one_seed_intervals_are_undefined_never_made_up() -> None:
    e = stats.iqm_estimate([0.7])
    assert (e.value, e.low, e.high, e.n) == (0.7, None, None, 1)
    assert "undefined" in e.note
    m = stats.median_iqr([0.7])
    assert (m.value, m.low, m.high) == (0.7, None, None) and "undefined" in m.note
    p = stats.probability_of_improvement_estimate([1.0], [0.0, 0.5])
    assert p.value == 1.0 and p.low is None and p.high is None and "undefined" in p.note
    assert stats.stratified_bootstrap_ci([5.0]) is None


def test_median_iqr_hand_computed() -> None:
    e = stats.median_iqr([1, 2, 3, 4, 5])
    assert (e.value, e.low, e.high) == (3.0, 2.0, 4.0)


def test_probability_of_improvement_hand_computed() -> None:
    # x = (1, 3), y = (2, 2): pairs 1>2 no (0), 1>2 no (0), 3>2 yes (1), 3>2 yes (1) -> 2/4.
    assert stats.probability_of_improvement([1, 3], [2, 2]) == 0.5
    # x = (2, 3), y = (1, 2): 2>1 1, 2=2 .5, 3>1 1, 3>2 1 -> 3.5/4.
    assert stats.probability_of_improvement([2, 3], [1, 2]) == 0.875
    assert stats.probability_of_improvement([5], [1, 2, 3]) == 1.0
    assert stats.probability_of_improvement([0, 0], [1]) == 0.0


def test_identical_cohorts_give_one_half() -> None:
    x = [0.1, 0.4, 0.4, 0.9, 1.0]
    assert stats.probability_of_improvement(x, x) == 0.5
    e = stats.probability_of_improvement_estimate(x, list(x), seed=1)
    assert e.value == 0.5 and e.low <= 0.5 <= e.high


def test_probability_of_improvement_matches_rliable() -> None:
    from rliable import metrics

    rng = np.random.default_rng(11)
    x, y = rng.normal(0.3, 1, size=9), rng.normal(0.0, 1, size=7)
    theirs = metrics.probability_of_improvement(x.reshape(-1, 1), y.reshape(-1, 1))
    assert stats.probability_of_improvement(x, y) == pytest.approx(float(theirs))


def test_non_finite_scores_are_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        stats.iqm([1.0, float("nan")])
