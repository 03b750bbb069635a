"""Cohort statistics on fixed score arrays: hand computations, and agreement with rliable.

rliable (Agarwal et al. 2021's reference implementation) is imported itself: ``rliable.metrics``
for the point estimates and ``rliable.library.get_interval_estimates`` for the stratified
bootstrap, on one task (a cohort) and on several.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from rliable import library, metrics

from gradlab.results import stats


def _tasks(seed: int, n_runs: int, scales: tuple[float, ...]) -> np.ndarray:
    """(n_runs, n_tasks) fixed scores, task t around ``scales[t]`` (a return, a rate, a normalised score)."""
    rng = np.random.default_rng(seed)
    return np.stack([scale * (1.0 + 0.3 * rng.standard_normal(n_runs)) for scale in scales], axis=1)


def _assert_same_bootstrap_quantiles(theirs: np.ndarray, their_reps: int, ours, z: float = 5.0) -> None:
    """rliable's 95% percentile interval from ``their_reps`` resamples is gradlab's, up to Monte Carlo error.

    The two resample with different generators, so they cannot agree to the bit. A distribution-free
    bound: the share of rliable's resamples below the true p-quantile is Binomial(R, p) / R, so its
    p-quantile estimate lies between the true (p - h)- and (p + h)-quantiles, h = z sqrt(p(1-p)/R),
    but with probability ~6e-7 for z = 5 (h = 0.0175 for p = 0.025 and R = 2000); likewise at
    1 - p. gradlab's bootstrap gives those quantiles with many more resamples (its own error on
    them, under 0.001 in p from 50000 resamples, is small beside h): ``ours(c)`` is its interval of coverage c.
    """
    p = 0.025
    h = z * np.sqrt(p * (1 - p) / their_reps)
    outer, inner = ours(1 - 2 * (p - h)), ours(1 - 2 * (p + h))  # (q_{p-h}, q_{1-p+h}), (q_{p+h}, q_{1-p-h})
    ok = outer[0] <= theirs[0] <= inner[0] and inner[1] <= theirs[1] <= outer[1]
    assert ok, (f"rliable's interval {theirs.tolist()} outside gradlab's bands: low in [{outer[0]}, {inner[0]}], "
                f"high in [{inner[1]}, {outer[1]}]")


@contextmanager
def _numpy_global_seed(seed: int) -> Iterator[None]:
    # rliable's StratifiedBootstrap.update_indices draws run indices with np.random.choice, numpy's
    # global stream (get_interval_estimates' random_state goes to arch, whose indices rliable
    # replaces): seed it for a reproducible test and put the stream back afterwards.
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def test_iqm_hand_computed() -> None:
    # 8 seeds: floor(8/4) = 2 trimmed from each end -> mean of the sorted middle four (3, 4, 5, 6).
    assert stats.iqm([8, 1, 7, 2, 6, 3, 5, 4]) == pytest.approx(4.5)
    # 5 seeds: floor(5/4) = 1 trimmed each end -> mean(2, 3, 10) = 5.
    assert stats.iqm([100, 2, 3, 10, -50]) == pytest.approx(5.0)
    # 3 seeds: nothing trimmed (floor(3/4) = 0) -> the plain mean.
    assert stats.iqm([1, 2, 6]) == pytest.approx(3.0)


def test_iqm_matches_rliable() -> None:
    rng = np.random.default_rng(7)
    for n in (3, 4, 5, 10, 17):
        x = rng.normal(size=n)
        assert stats.iqm(x) == pytest.approx(float(metrics.aggregate_iqm(x.reshape(n, 1))))


def test_iqm_of_several_tasks_pools_every_run_as_rliable_does() -> None:
    for seed, n_runs, scales in ((0, 5, (1.0, 200.0)), (1, 10, (0.9, 30.0, 400.0)), (2, 3, (1.0,) * 7)):
        x = _tasks(seed, n_runs, scales)
        assert stats.iqm(x) == pytest.approx(float(metrics.aggregate_iqm(x)), rel=1e-12)


@pytest.mark.parametrize("n_runs, scales", [(12, (1.0,)), (10, (0.9, 30.0, 400.0))], ids=["one-task", "three-tasks"])
def test_stratified_bootstrap_interval_matches_rliables_get_interval_estimates(n_runs: int, scales: tuple) -> None:
    x = _tasks(3, n_runs, scales)
    rliable_reps, gradlab_reps = 2000, 200_000
    with _numpy_global_seed(0):
        point, interval = library.get_interval_estimates(
            {"x": x}, lambda s: np.array([metrics.aggregate_iqm(s)]), reps=rliable_reps)
    theirs = interval["x"][:, 0]
    assert float(point["x"][0]) == pytest.approx(stats.iqm(x), rel=1e-12)
    ours = x[:, 0] if len(scales) == 1 else x
    _assert_same_bootstrap_quantiles(theirs, rliable_reps,
                                     lambda c: stats.stratified_bootstrap_ci(ours, reps=gradlab_reps, seed=0, confidence=c))
    if len(scales) > 1:
        # Not stratified (every run of every task in one pool): rliable's endpoints fall far outside.
        with pytest.raises(AssertionError, match="outside"):
            _assert_same_bootstrap_quantiles(theirs, rliable_reps, lambda c: stats.stratified_bootstrap_ci(
                x.reshape(-1), reps=gradlab_reps, seed=0, confidence=c))


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
    # The exact bootstrap distribution, enumerated: for 3 seeds all 27 resamples are equally likely;
    # IQM of 3 = their mean.
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
    rng = np.random.default_rng(11)
    x, y = rng.normal(0.3, 1, size=9), rng.normal(0.0, 1, size=7)
    theirs = metrics.probability_of_improvement(x.reshape(-1, 1), y.reshape(-1, 1))
    assert stats.probability_of_improvement(x, y) == pytest.approx(float(theirs))


def test_probability_of_improvement_over_several_tasks_is_rliables_mean_over_tasks() -> None:
    x, y = _tasks(4, 9, (1.0, 50.0, 300.0)), _tasks(5, 7, (0.9, 55.0, 300.0))
    x[:3, 0] = y[:3, 0] = 1.0  # ties count one half, as in scipy's Mann-Whitney U
    assert stats.probability_of_improvement(x, y) == pytest.approx(float(metrics.probability_of_improvement(x, y)))
    assert stats.probability_of_improvement(x, x) == 0.5 == metrics.probability_of_improvement(x, x)
    with pytest.raises(ValueError, match="expected the same tasks in x and y, found 3 and 2 columns"):
        stats.probability_of_improvement(x, y[:, :2])


@pytest.mark.slow  # rliable's bootstrap calls scipy's mannwhitneyu per task per resample: ~8 ms a resample
def test_probability_of_improvement_interval_matches_rliables_independent_bootstrap() -> None:
    x, y = _tasks(6, 8, (1.0, 50.0, 300.0)), _tasks(7, 7, (0.95, 52.0, 290.0))
    with _numpy_global_seed(1):
        _, interval = library.get_interval_estimates(
            {"x,y": [x, y]}, lambda a, b: np.array([metrics.probability_of_improvement(a, b)]), reps=2000)
    ours = stats.probability_of_improvement_estimate
    _assert_same_bootstrap_quantiles(interval["x,y"][:, 0], 2000, lambda c: (
        (e := ours(x, y, reps=50_000, seed=0, confidence=c)).low, e.high))


def test_non_finite_scores_are_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        stats.iqm([1.0, float("nan")])
