"""Cohort statistics over per-seed scores: IQM with a stratified-bootstrap interval, median and IQR,
probability of improvement.

Source: Agarwal, Schwarzer, Castro, Courville, Bellemare 2021, "Deep Reinforcement Learning at the
Edge of the Statistical Precipice" (NeurIPS), sections 4.1-4.3 and appendix A.4; the ``rliable``
package is its reference implementation and the tests check these functions against it.

A cohort here is the runs of one recipe on one goal (one "task" in the paper's terms), so the
stratified bootstrap resamples seeds with replacement inside that single stratum: scores are
``(n_runs,)``. Several tasks are ``(n_runs, n_tasks)``, rliable's layout: IQM then pools every
run of every task (rliable's ``aggregate_iqm``), the bootstrap resamples runs inside each task
(rliable's ``StratifiedBootstrap``) and the probability of improvement is the mean over tasks. The
resampling uses ``numpy.random.default_rng(seed)``, not rliable's global ``np.random`` stream, so
intervals agree with rliable's up to Monte Carlo error, not to the bit. With fewer than two runs
every interval is undefined: the functions return ``None`` for it and say why in
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
    """(n_runs,) or (n_runs, n_tasks) scores as a float64 (n_runs, n_tasks) matrix."""
    x = np.asarray(scores, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2:
        raise ValueError(f"{what}: expected (n_runs,) or (n_runs, n_tasks) scores, found shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{what}: expected finite numbers, found {x[~np.isfinite(x)][:3].tolist()}")
    return x


def iqm(scores: Sequence[float] | np.ndarray) -> float:
    """Interquartile mean: the mean of the middle 50% of ``scores`` (25% trimmed from each end).

    Args:
        scores: (n,) float, one score per seed, n >= 1; or (n_runs, n_tasks), all n = n_runs * n_tasks
            scores pooled (rliable's ``aggregate_iqm``).

    Returns:
        ``scipy.stats.trim_mean(scores, 0.25, axis=None)``: with k = floor(n/4), the mean of the
        sorted scores ``[k, n-k)`` (for n < 4 nothing is trimmed: the plain mean).
        Source: Agarwal et al. 2021, sec. 4.3.

    Raises:
        ValueError: no scores, or a non-finite one, or more than two dimensions.
    """
    x = np.sort(_scores(scores), axis=None)
    if x.size == 0:
        raise ValueError("scores: expected at least one score, found none")
    k = int(0.25 * x.size)
    return float(x[k:x.size - k].mean())


def stratified_bootstrap_ci(
    scores: Sequence[float] | np.ndarray, statistic=iqm, *, reps: int = DEFAULT_REPS, seed: int = 0,
    confidence: float = CONFIDENCE,
) -> tuple[float, float] | None:
    """Percentile stratified-bootstrap interval of ``statistic``: runs resampled inside each task.

    Args:
        scores: (n,) float, one per seed (one stratum: the cohort's goal); or (n_runs, n_tasks).
        statistic: a resample of ``scores``' shape -> float (default :func:`iqm`).
        reps: bootstrap resamples; seed: the resampling generator's seed (``numpy.random.default_rng``).
        confidence: interval coverage in (0, 1).

    Returns:
        ``(low, high)``: the (1-confidence)/2 and (1+confidence)/2 quantiles (numpy's linear
        interpolation, as rliable's ``get_interval_estimates(method="percentile")``) of the
        statistic over ``reps`` resamples, each drawing n_runs runs with replacement in every task
        independently; None when n_runs < 2 (undefined).
        Source: Agarwal et al. 2021, sec. 4.1 and A.4 (stratified bootstrap, percentile interval).

    Raises:
        ValueError: as :func:`iqm`.
    """
    one_task = np.ndim(scores) == 1
    x = _scores(scores)
    n, tasks = x.shape
    if n < 2:
        return None
    rng = np.random.default_rng(seed)
    # (reps, n, tasks) run indices: one task draws the same stream as (reps, n), as before tasks existed.
    draws_x = x[rng.integers(0, n, size=(reps, n, tasks)), np.arange(tasks)]
    if statistic is iqm:  # vectorised: sort each resample, mean of the middle values
        k = int(0.25 * n * tasks)
        draws = np.sort(draws_x.reshape(reps, n * tasks), axis=1)[:, k:n * tasks - k].mean(axis=1)
    else:
        draws = np.array([statistic(row[:, 0] if one_task else row) for row in draws_x])
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(draws, [alpha, 1.0 - alpha])
    return float(low), float(high)


def iqm_estimate(scores: Sequence[float] | np.ndarray, *, reps: int = DEFAULT_REPS, seed: int = 0) -> Estimate:
    """IQM of ``scores`` with its stratified-bootstrap 95% interval (None for one seed, with a note)."""
    x = _scores(scores)
    if x.size == 0:
        return Estimate(None, None, None, 0, "no scores")
    ci = stratified_bootstrap_ci(x, reps=reps, seed=seed)
    return Estimate(iqm(x), *(ci or (None, None)), n=int(x.shape[0]), note=None if ci else UNDEFINED_ONE_SEED)


def median_iqr(scores: Sequence[float] | np.ndarray) -> Estimate:
    """Median with the interquartile range as ``(low, high)`` = (25th, 75th percentile, linear).

    With one seed the median is that score and the range is undefined (None, with a note).
    Scores of several tasks are pooled.
    """
    x = _scores(scores).reshape(-1)
    if x.size == 0:
        return Estimate(None, None, None, 0, "no scores")
    if x.size < 2:
        return Estimate(float(x[0]), None, None, 1, UNDEFINED_ONE_SEED)
    q25, q50, q75 = np.percentile(x, [25, 50, 75])
    return Estimate(float(q50), float(q25), float(q75), int(x.size))


def probability_of_improvement(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """P(X > Y): the probability that a random seed of cohort X scores above a random seed of Y.

    Args:
        x: (n,) float, y: (m,) float; one score per seed each, n, m >= 1. Or (n, n_tasks) and
            (m, n_tasks): the per-task probabilities averaged over tasks.

    Returns:
        (1 / (n m)) * sum_i sum_j S(x_i, y_j) with S = 1 if x_i > y_j, 1/2 if equal, 0 otherwise
        (the Mann-Whitney U statistic over n m), per task, then the mean over tasks (rliable's
        ``metrics.probability_of_improvement``). Identical cohorts give exactly 0.5.
        Source: Agarwal et al. 2021, sec. 4.3 ("probability of improvement").

    Raises:
        ValueError: an empty cohort, non-finite scores, or cohorts with different task counts.
    """
    a, b = _scores(x, "x"), _scores(y, "y")
    if a.size == 0 or b.size == 0:
        raise ValueError("probability of improvement: both cohorts need at least one score")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"probability of improvement: expected the same tasks in x and y, "
                         f"found {a.shape[1]} and {b.shape[1]} columns")
    return float(_improvement(a[None], b[None])[0])


def _improvement(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(R, n, T) and (R, m, T) scores -> (R,) P(X > Y) averaged over the T tasks."""
    diff = a[:, :, None, :] - b[:, None, :, :]
    per_task = ((diff > 0).sum(axis=(1, 2)) + 0.5 * (diff == 0).sum(axis=(1, 2))) / (a.shape[1] * b.shape[1])
    return per_task.mean(axis=1)


def probability_of_improvement_estimate(
    x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, *, reps: int = DEFAULT_REPS, seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Estimate:
    """P(X > Y) with a stratified-bootstrap 95% interval (each cohort resampled on its own).

    Args:
        x, y: as :func:`probability_of_improvement`.
        reps, seed, confidence: as :func:`stratified_bootstrap_ci`.

    Returns:
        The estimate; its interval is the percentile interval over ``reps`` resamples in which
        each cohort's runs are drawn with replacement inside every task, independently of the
        other cohort (rliable's ``StratifiedIndependentBootstrap``). ``n`` is the smaller run
        count; the interval is None (with a note) when either cohort has one run.

    Raises:
        ValueError: as :func:`probability_of_improvement`.
    """
    a, b = _scores(x, "x"), _scores(y, "y")
    value = probability_of_improvement(a, b)
    n = int(min(a.shape[0], b.shape[0]))
    if n < 2:
        return Estimate(value, None, None, n, UNDEFINED_ONE_SEED)
    rng = np.random.default_rng(seed)
    tasks = np.arange(a.shape[1])
    ra = a[rng.integers(0, a.shape[0], size=(reps, a.shape[0], tasks.size)), tasks]
    rb = b[rng.integers(0, b.shape[0], size=(reps, b.shape[0], tasks.size)), tasks]
    draws = _improvement(ra, rb)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(draws, [alpha, 1.0 - alpha])
    return Estimate(value, float(low), float(high), n)

