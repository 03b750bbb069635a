"""Training statistics every backend reports: rolling episode windows and per-rollout rewards.

:class:`EpisodeStats` keeps the last :data:`WINDOW` finished training episodes (saved in a
checkpoint's ``resume/state.json`` so a resumed run's curves continue); :class:`RolloutStats`
accumulates one rollout's rewards and env time. Both give registered metric names
(``train/episode/...``, ``train/outcome/...``, ``train/reward/shaped/...``, METRICS.md).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

WINDOW = 100
"""Episodes in the rolling windows of the training episode metrics."""


@dataclass
class EpisodeStats:
    """Rolling training-episode statistics (saved in resume state so curves continue)."""

    count: int = 0
    returns: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    raw_returns: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    lengths: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    successes: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    outcomes: dict[str, int] = field(default_factory=lambda: {"success": 0, "failure": 0, "timeout": 0, "ended": 0})
    reasons: dict[str, int] = field(default_factory=dict)
    #: start name -> [episodes, successes] of episodes that began from a named start state.
    starts: dict[str, list[int]] = field(default_factory=dict)

    def add(self, record: dict[str, Any]) -> None:
        """Count one finished episode: ``record`` has ``return`` and ``length``, optionally
        ``raw_return`` (default: ``return``), ``outcome`` (default ``ended``) and ``reason``
        (default: the outcome) and ``start`` (absent or empty: the default start), as
        :meth:`gradlab.envs.records.EpisodeRecord.as_json` gives."""
        self.count += 1
        self.returns.append(float(record["return"]))
        self.raw_returns.append(float(record.get("raw_return", record["return"])))
        self.lengths.append(int(record["length"]))
        outcome = str(record.get("outcome", "ended"))
        self.successes.append(outcome == "success")
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        reason = str(record.get("reason") or outcome)
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        start = record.get("start")
        if start:
            counts = self.starts.setdefault(str(start), [0, 0])
            counts[0] += 1
            counts[1] += outcome == "success"

    def as_json(self) -> dict[str, Any]:
        """The windows and counts as JSON data (``state.json``'s ``episodes``)."""
        return {"count": self.count, "returns": list(self.returns), "raw_returns": list(self.raw_returns),
                "lengths": list(self.lengths), "successes": list(self.successes), "outcomes": dict(self.outcomes),
                "reasons": dict(self.reasons), "starts": {k: list(v) for k, v in self.starts.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpisodeStats:
        """The statistics :meth:`as_json` wrote.

        Raises:
            KeyError: a field is missing.
        """
        s = cls(count=int(data["count"]), outcomes=dict(data["outcomes"]), reasons=dict(data["reasons"]),
                starts={str(k): [int(v[0]), int(v[1])] for k, v in data.get("starts", {}).items()})
        s.returns.extend(data["returns"])
        s.raw_returns.extend(data["raw_returns"])
        s.lengths.extend(data["lengths"])
        s.successes.extend(data["successes"])
        return s

    def metrics(self) -> dict[str, float]:
        """``train/episode/count``, the window means (``train/episode/return/{shaped,raw}/mean``,
        ``train/episode/length/mean``, ``train/outcome/success/window_100/rate``, once an episode
        ended), the cumulative outcome and reason counts, and per named start its episode and
        success counts (``train/start/{start}/...``)."""
        out: dict[str, float] = {"train/episode/count": float(self.count)}
        if self.returns:
            out["train/episode/return/shaped/mean"] = float(np.mean(self.returns))
            out["train/episode/return/raw/mean"] = float(np.mean(self.raw_returns))
            out["train/episode/length/mean"] = float(np.mean(self.lengths))
            out["train/outcome/success/window_100/rate"] = float(np.mean(self.successes))
        for outcome, n in self.outcomes.items():
            out[f"train/outcome/{outcome}/count"] = float(n)
        for reason, n in self.reasons.items():
            out[f"train/episode/reason/{_segment(reason)}/count"] = float(n)
        for start, (n, wins) in self.starts.items():
            out[f"train/start/{_segment(start)}/episode/count"] = float(n)
            out[f"train/start/{_segment(start)}/success/count"] = float(wins)
        return out


def _segment(text: str) -> str:
    """A reason as one metric path segment (``/`` and spaces replaced)."""
    return "".join(c if (c.isalnum() or c in "_.-:") else "_" for c in text) or "unknown"


@dataclass
class RolloutStats:
    """Per-rollout accumulators filled by the step callback.

    The step callback only keeps each step's reward array (one float64 copy, ``(n_envs,)``); the
    reward statistics are computed once per rollout in :meth:`metrics` (four array reductions per
    env step cost more than the rest of the callback).
    """

    steps: int = 0
    env_seconds: float = 0.0
    chunks: list = field(default_factory=list)

    def add_rewards(self, r: np.ndarray) -> None:
        """Record one env step's rewards, (n_envs,) float (copied as float64)."""
        r = np.array(r, dtype=np.float64)
        self.steps += r.size
        self.chunks.append(r)

    def metrics(self) -> dict[str, float]:
        """``train/reward/shaped/{mean,std,min,max}`` over the rollout's rewards (population std)."""
        if not self.steps:
            return {}
        r = np.concatenate(self.chunks).ravel()
        mean = float(r.sum()) / self.steps
        var = max(float(np.dot(r, r)) / self.steps - mean * mean, 0.0)
        return {"train/reward/shaped/mean": mean, "train/reward/shaped/std": float(np.sqrt(var)),
                "train/reward/shaped/min": float(r.min()), "train/reward/shaped/max": float(r.max())}
