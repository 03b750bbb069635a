"""Cohort statistics over per-seed scores: IQM with a stratified-bootstrap interval, median and IQR,
probability of improvement.

Source: Agarwal, Schwarzer, Castro, Courville, Bellemare 2021, "Deep Reinforcement Learning at the
Edge of the Statistical Precipice" (NeurIPS), sections 4.1-4.3 and appendix A.4; the ``rliable``
package is its reference implementation and the tests check these functions against it.

A cohort here is the runs of one recipe on one goal (one "task" in the paper's terms), so the
stratified bootstrap resamples seeds with replacement inside that single stratum. With fewer than
two seeds every interval is undefined: the functions return ``None`` for it and say why in
:attr:`Estimate.note`; an interval is never made up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Bootstrap resamples (rliable's ``get_interval_estimates`` default is 2000; the paper uses 2000-50000).
DEFAULT_REPS = 2000
#: The interval's coverage (the paper's 95% percentile interval).
CONFIDENCE = 0.95
UNDEFINED_ONE_SEED = "one seed: intervals are undefined (run more seeds: gradlab sweep --seeds N)"


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its interval (``low``/``high`` None when undefined, with ``note`` saying why)."""

    value: float | None
    low: float | None
    high: float | None
    n: int
    note: str | None = None

    def as_json(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n, "note": self.note}


def _scores(scores: Sequence[float] | np.ndarray, what: str = "scores") -> np.ndarray:
    x = np.asarray(scores, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{what}: expected finite numbers, found {x[~np.isfinite(x)][:3].tolist()}")
    return x


def iqm(scores: Sequence[float] | np.ndarray) -> float:
    """Interquartile mean: the mean of the middle 50% of ``scores`` (25% trimmed from each end).

    Args:
        scores: (n,) float, one score per seed, n >= 1.

    Returns:
        ``scipy.stats.trim_mean(scores, 0.25)``: with k = floor(n/4), the mean of the sorted scores
        ``[k, n-k)`` (for n < 4 nothing is trimmed: the plain mean). Source: Agarwal et al. 2021, sec. 4.3.

    Raises:
        ValueError: no scores, or a non-finite one.
    """
    x = np.sort(_scores(scores))
    if x.size == 0:
        raise ValueError("scores: expected at least one score, found none")
    k = int(0.25 * x.size)
    return float(x[k:x.size - k].mean())


def stratified_bootstrap_ci(
    scores: Sequence[float] | np.ndarray, statistic=iqm, *, reps: int = DEFAULT_REPS, seed: int = 0,
    confidence: float = CONFIDENCE,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``statistic`` over seeds (one stratum: the cohort's goal).

    Args:
        scores: (n,) float, one per seed.
        statistic: (n,) -> float (default :func:`iqm`).
        reps: bootstrap resamples; seed: the resampling generator's seed (``numpy.random.default_rng``).
        confidence: interval coverage in (0, 1).

    Returns:
        ``(low, high)``: the (1-confidence)/2 and (1+confidence)/2 quantiles of the statistic over
        ``reps`` resamples of n seeds drawn with replacement; None when n < 2 (undefined).
        Source: Agarwal et al. 2021, sec. 4.1 (stratified bootstrap, percentile interval).
    """
    x = _scores(scores)
    if x.size < 2:
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(reps, x.size))
    if statistic is iqm:  # vectorised: sort each resample, mean of the middle rows
        k = int(0.25 * x.size)
        draws = np.sort(x[idx], axis=1)[:, k:x.size - k].mean(axis=1)
    else:
        draws = np.array([statistic(x[row]) for row in idx])
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(draws, [alpha, 1.0 - alpha])
    return float(low), float(high)


def iqm_estimate(scores: Sequence[float] | np.ndarray, *, reps: int = DEFAULT_REPS, seed: int = 0) -> Estimate:
    """IQM of ``scores`` with its stratified-bootstrap 95% interval (None for one seed, with a note)."""
    x = _scores(scores)
    if x.size == 0:
        return Estimate(None, None, None, 0, "no scores")
    ci = stratified_bootstrap_ci(x, reps=reps, seed=seed)
    return Estimate(iqm(x), *(ci or (None, None)), n=int(x.size), note=None if ci else UNDEFINED_ONE_SEED)


def median_iqr(scores: Sequence[float] | np.ndarray) -> Estimate:
    """Median with the interquartile range as ``(low, high)`` = (25th, 75th percentile, linear).

    With one seed the median is that score and the range is undefined (None, with a note).
    """
    x = _scores(scores)
    if x.size == 0:
        return Estimate(None, None, None, 0, "no scores")
    if x.size < 2:
        return Estimate(float(x[0]), None, None, 1, UNDEFINED_ONE_SEED)
    q25, q50, q75 = np.percentile(x, [25, 50, 75])
    return Estimate(float(q50), float(q25), float(q75), int(x.size))


def probability_of_improvement(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """P(X > Y): the probability that a random seed of cohort X scores above a random seed of Y.

    Args:
        x: (n,) float, y: (m,) float; one score per seed each, n, m >= 1.

    Returns:
        (1 / (n m)) * sum_i sum_j S(x_i, y_j) with S = 1 if x_i > y_j, 1/2 if equal, 0 otherwise
        (the Mann-Whitney U statistic over n m). Identical cohorts give exactly 0.5.
        Source: Agarwal et al. 2021, sec. 4.3 ("probability of improvement"), for one task.
    """
    a, b = _scores(x, "x"), _scores(y, "y")
    if a.size == 0 or b.size == 0:
        raise ValueError("probability of improvement: both cohorts need at least one score")
    diff = a[:, None] - b[None, :]
    return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)


def probability_of_improvement_estimate(
    x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, *, reps: int = DEFAULT_REPS, seed: int = 0,
) -> Estimate:
    """P(X > Y) with a stratified-bootstrap 95% interval (each cohort resampled on its own).

    The interval is None (with a note) when either cohort has one seed.
    """
    a, b = _scores(x, "x"), _scores(y, "y")
    value = probability_of_improvement(a, b)
    n = int(min(a.size, b.size))
    if n < 2:
        return Estimate(value, None, None, n, UNDEFINED_ONE_SEED)
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, a.size, size=(reps, a.size))
    ib = rng.integers(0, b.size, size=(reps, b.size))
    ra, rb = a[ia][:, :, None], b[ib][:, None, :]
    draws = ((ra > rb).sum(axis=(1, 2)) + 0.5 * (ra == rb).sum(axis=(1, 2))) / (a.size * b.size)
    alpha = (1.0 - CONFIDENCE) / 2.0
    low, high = np.quantile(draws, [alpha, 1.0 - alpha])
    return Estimate(value, float(low), float(high), n)

