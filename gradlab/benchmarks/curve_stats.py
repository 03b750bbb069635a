"""Learning curves from training episodes, and whether two sides' curves differ beyond noise.

Used by ``gradlab benchmark curves`` (:mod:`gradlab.benchmarks.curves`); pure numpy, no torch.

A *run* here is one side (backend and precision) on one seed: the env step at which each training
episode ended (``steps``, int, non-decreasing) and its raw return (``returns``, float: the
provider's native score, before the task program's clipping or shaping). Its *curve* at env step
``s`` is the mean raw return of the last ``window`` (default 100, as ``train/episode/return/raw/mean``
in METRICS.md) episodes that ended at or before ``s``.

How "within noise" is judged (issue 14: "Breakout's curve ... lies within seed noise of
sb3.ppo's"; "learning curves matching fp32"), each other side against the first (reference) side:

* **Seed noise** (every compared side has >= 2 seeds): one figure per run (its curve at the step,
  or its area statistic below), the difference of the two sides' means over seeds, and the noise
  figure ``2 * s_p * sqrt(1/n_a + 1/n_b)``, ``s_p`` the pooled standard deviation between seeds
  of the same side (ddof 1): twice the standard error of a difference of means under seed
  variation alone. The sides are *within seed noise* when ``|difference| <= noise``.
* **Episode noise only** (a side with one seed): seed noise is *not estimated*. The difference of
  the last-window means gets a 95% percentile bootstrap interval (:data:`BOOTSTRAP` resamples of
  each side's last-window episodes, fixed generator seed); *within episode noise* when the
  interval contains 0. Seeds differ by more than episodes do, so this is a weaker check.
* The whole curve: the *area statistic* of a run is the mean of its curve over the milestones
  (every ``milestone`` env steps up to the budget): the curve's normalised area. With seed noise
  the overall verdict holds when both the final curve value and the area statistic are within
  noise; with episode noise only the final window is judged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

WINDOW = 100
"""Episodes in the rolling window (as ``train/episode/return/raw/mean``)."""
BOOTSTRAP = 2000
"""Bootstrap resamples for the episode-noise interval (as :data:`gradlab.results.stats.DEFAULT_REPS`, rliable's
default; :mod:`gradlab.results.stats` bootstraps one sample of seeds, this the difference of two samples)."""
BOOTSTRAP_SEED = 0


def milestones(steps: int, every: int) -> list[int]:
    """The env steps the curves are judged at: every ``every`` steps up to ``steps``, and ``steps`` itself
    (the area statistic's points, and the command's milestone tables)."""
    out = list(range(every, steps + 1, every))
    return out if out and out[-1] == steps else [*out, steps]


@dataclass(frozen=True)
class Curve:
    """One run's episodes: ``steps`` (E,) int env steps at each episode's end, ``returns`` (E,) float."""

    steps: np.ndarray
    returns: np.ndarray

    @classmethod
    def of(cls, steps: Sequence[int], returns: Sequence[float]) -> Curve:
        """Raises: ValueError: lengths differ or steps decrease."""
        s, r = np.asarray(steps, dtype=np.int64), np.asarray(returns, dtype=np.float64)
        if s.shape != r.shape or s.ndim != 1:
            raise ValueError(f"episode steps and returns: expected equal 1-d lengths, found {s.shape} and {r.shape}")
        if s.size and np.any(np.diff(s) < 0):
            raise ValueError("episode steps: expected non-decreasing env steps")
        return cls(s, r)

    def rolling(self, window: int = WINDOW) -> np.ndarray:
        """(E,) float64: after each episode, the mean of the last ``window`` returns (fewer at the start)."""
        if not self.returns.size:
            return np.zeros(0)
        c = np.concatenate([[0.0], np.cumsum(self.returns)])
        i = np.arange(1, self.returns.size + 1)
        lo = np.maximum(i - window, 0)
        return (c[i] - c[lo]) / (i - lo)

    def last_window(self, step: int, window: int = WINDOW) -> np.ndarray:
        """The returns of the last ``window`` episodes ended at or before ``step`` (may be empty)."""
        n = int(np.searchsorted(self.steps, step, side="right"))
        return self.returns[max(0, n - window):n]

    def at(self, step: int, window: int = WINDOW) -> float:
        """The curve at ``step`` (NaN before the first episode)."""
        w = self.last_window(step, window)
        return float(w.mean()) if w.size else math.nan

    def area(self, milestones: Sequence[int], window: int = WINDOW) -> float:
        """Mean of the curve over ``milestones`` that have at least one episode (NaN if none)."""
        vals = [v for v in (self.at(m, window) for m in milestones) if not math.isnan(v)]
        return float(np.mean(vals)) if vals else math.nan


@dataclass(frozen=True)
class Comparison:
    """``other`` against ``ref`` at one point (a step, or ``"area"``).

    Attributes:
        kind: ``seed`` (noise from seeds) or ``episode`` (bootstrap over episodes, seed noise not
            estimated), or ``none`` (not enough data: no episode yet on a side).
        ref_mean, other_mean: the sides' figures (mean over seeds), raw-return units.
        diff: ``other_mean - ref_mean``. noise: the half-width the difference is judged against
            (seed: ``2 SE``; episode: half the 95% bootstrap interval). lo, hi: ``diff -/+ noise``
            (seed) or the bootstrap interval (episode).
        within: ``|diff| <= noise`` (seed) or ``lo <= 0 <= hi`` (episode); None when ``kind`` is none.
        ref_sd, other_sd: between-seed standard deviations (NaN with one seed).
    """

    point: str
    kind: str
    ref_mean: float
    other_mean: float
    diff: float
    noise: float
    lo: float
    hi: float
    within: bool | None
    n_ref: int
    n_other: int
    ref_sd: float = math.nan
    other_sd: float = math.nan

    def as_json(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


def seed_comparison(point: str, ref: Sequence[float], other: Sequence[float]) -> Comparison:
    """Judge two sides' per-seed figures (each side >= 2 finite values) against seed noise.

    Raises:
        ValueError: a side with fewer than 2 finite figures.
    """
    a = np.asarray([x for x in ref if math.isfinite(x)], dtype=np.float64)
    b = np.asarray([x for x in other if math.isfinite(x)], dtype=np.float64)
    if a.size < 2 or b.size < 2:
        raise ValueError(f"seed noise needs >= 2 seeds per side, found {a.size} and {b.size}")
    sa, sb = float(a.std(ddof=1)), float(b.std(ddof=1))
    pooled = math.sqrt(((a.size - 1) * sa**2 + (b.size - 1) * sb**2) / (a.size + b.size - 2))
    noise = 2.0 * pooled * math.sqrt(1.0 / a.size + 1.0 / b.size)
    diff = float(b.mean() - a.mean())
    return Comparison(point, "seed", float(a.mean()), float(b.mean()), diff, noise, diff - noise, diff + noise,
                      abs(diff) <= noise, int(a.size), int(b.size), sa, sb)


def episode_comparison(point: str, ref: np.ndarray, other: np.ndarray, n_ref: int = 1, n_other: int = 1,
                       resamples: int = BOOTSTRAP, seed: int = BOOTSTRAP_SEED) -> Comparison:
    """Judge two sides' last-window episode returns (each non-empty) by a 95% bootstrap interval of
    the difference of means (percentile method, Efron & Tibshirani 1993, ch. 13)."""
    a, b = np.asarray(ref, dtype=np.float64), np.asarray(other, dtype=np.float64)
    rng = np.random.default_rng(seed)
    ma = a[rng.integers(0, a.size, size=(resamples, a.size))].mean(axis=1)
    mb = b[rng.integers(0, b.size, size=(resamples, b.size))].mean(axis=1)
    lo, hi = (float(x) for x in np.percentile(mb - ma, [2.5, 97.5]))
    diff = float(b.mean() - a.mean())
    return Comparison(point, "episode", float(a.mean()), float(b.mean()), diff, (hi - lo) / 2, lo, hi,
                      lo <= 0.0 <= hi, n_ref, n_other)


def _none(point: str, ref: Sequence[float], other: Sequence[float]) -> Comparison:
    def m(x: Sequence[float]) -> float:
        f = [v for v in x if math.isfinite(v)]
        return float(np.mean(f)) if f else math.nan

    nan = math.nan
    return Comparison(point, "none", m(ref), m(other), m(other) - m(ref), nan, nan, nan, None, len(ref), len(other))


def compare_at(step: int, ref: Sequence[Curve], other: Sequence[Curve], window: int = WINDOW) -> Comparison:
    """``other``'s curves against ``ref``'s at env step ``step`` (seed noise when both sides have >= 2
    runs with an episode by then, else episode noise over the runs' last windows pooled per side)."""
    a = [c.at(step, window) for c in ref]
    b = [c.at(step, window) for c in other]
    fa, fb = [x for x in a if math.isfinite(x)], [x for x in b if math.isfinite(x)]
    if not fa or not fb:
        return _none(str(step), a, b)
    if len(ref) >= 2 and len(other) >= 2 and len(fa) >= 2 and len(fb) >= 2:
        return seed_comparison(str(step), fa, fb)
    wa = np.concatenate([c.last_window(step, window) for c in ref])
    wb = np.concatenate([c.last_window(step, window) for c in other])
    return episode_comparison(str(step), wa, wb, len(fa), len(fb))


def compare_area(milestones: Sequence[int], ref: Sequence[Curve], other: Sequence[Curve],
                 window: int = WINDOW) -> Comparison:
    """The area statistic (:meth:`Curve.area`) compared under seed noise; kind ``none`` with fewer than
    2 seeds on a side (episodes within a run are not independent across milestones)."""
    a = [c.area(milestones, window) for c in ref]
    b = [c.area(milestones, window) for c in other]
    if sum(map(math.isfinite, a)) >= 2 and sum(map(math.isfinite, b)) >= 2:
        return seed_comparison("area", a, b)
    return _none("area", a, b)


@dataclass(frozen=True)
class Verdict:
    """The overall judgement of one side against the reference.

    Attributes:
        within: True/False, or None when nothing could be judged yet.
        kind: ``seed`` or ``episode`` (of the final comparison) or ``none``.
        text: one line for people.
    """

    side: str
    ref: str
    within: bool | None
    kind: str
    text: str


def verdict(side: str, ref_side: str, final: Comparison, area: Comparison) -> Verdict:
    """Combine the final-step and area comparisons (module docstring). Sides whose returns do not
    vary at all (every episode of every seed the same return) are not judged: there is no noise to
    be within, and the verdict says so."""
    if final.kind in ("seed", "episode") and final.noise == 0.0 and final.diff == 0.0 and final.lo == final.hi:
        return Verdict(side, ref_side, None, "none",
                       f"{side} vs {ref_side}: not judged (every window return is {final.ref_mean:.2f} on both sides: "
                       f"no spread to judge against; train longer)")
    if final.kind == "seed":
        parts = [final.within] + ([area.within] if area.kind == "seed" else [])
        within = all(bool(p) for p in parts)
        word = "within" if within else "NOT within"
        return Verdict(side, ref_side, within, "seed",
                       f"{side} vs {ref_side}: {word} seed noise (final {final.diff:+.2f} vs +/-{final.noise:.2f}"
                       + (f"; area {area.diff:+.2f} vs +/-{area.noise:.2f}" if area.kind == "seed" else "")
                       + f"; {final.n_ref} and {final.n_other} seeds)")
    if final.kind == "episode":
        word = "inside" if final.within else "OUTSIDE"
        return Verdict(side, ref_side, final.within, "episode",
                       f"{side} vs {ref_side}: final difference {final.diff:+.2f} {word} the 95% bootstrap interval "
                       f"[{final.lo:+.2f}, {final.hi:+.2f}] of episode noise; seed noise NOT estimated "
                       f"(1 seed on a side: rerun with --seeds 0,1,2 to judge 'within seed noise')")
    return Verdict(side, ref_side, None, "none", f"{side} vs {ref_side}: not judged (no finished episode on a side yet)")
