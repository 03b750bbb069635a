"""Statistics over evaluation episodes: the Wilson score interval and return summaries."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

#: Two-sided 95% normal quantile, Phi^-1(0.975).
Z_95 = 1.959963984540054


def wilson_interval(successes: int, n: int, *, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion.

    Args:
        successes: number of successes k, ``0 <= k <= n``.
        n: number of trials; ``n == 0`` gives the uninformative ``(0.0, 1.0)``.
        z: normal quantile; the default gives a 95% interval.

    Returns:
        ``(low, high)`` in [0, 1]. Example: 95 of 100 gives ``(0.8883, 0.9785)``. The bounds the
        formula makes exact are returned exactly: ``low == 0.0`` when ``successes == 0`` and
        ``high == 1.0`` when ``successes == n`` (in floating point ``centre - half`` leaves a residue
        like ``3.5e-18`` there); every bound is clamped to [0, 1].

    Raises:
        ValueError: ``successes`` outside ``[0, n]``.

    Source: E. B. Wilson (1927), "Probable inference, the law of succession, and statistical
    inference", JASA 22(158): centre ``(p + z²/2n) / (1 + z²/n)``, half-width
    ``z / (1 + z²/n) * sqrt(p(1-p)/n + z²/4n²)``.
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= n, found successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # k = 0: half == centre == (z²/2n)/denom exactly, so low is 0; k = n: centre + half is 1 exactly.
    low = 0.0 if successes == 0 else min(1.0, max(0.0, centre - half))
    high = 1.0 if successes == n else min(1.0, max(0.0, centre + half))
    return low, high


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Mean, population std (ddof=0), median, min and max of a non-empty sequence.

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError("summarize: no values")
    vals = [float(v) for v in values]
    mean = math.fsum(vals) / len(vals)
    var = math.fsum((v - mean) ** 2 for v in vals) / len(vals)
    return {
        "mean": mean,
        "std": math.sqrt(var),
        "median": float(statistics.median(vals)),
        "min": min(vals),
        "max": max(vals),
    }
