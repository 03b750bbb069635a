"""Early stop on training metrics: threshold and plateau conditions, checked once per rollout.

The learner owns one :class:`EarlyStopMonitor` built from ``goal.train.early_stop.conditions`` and
calls :meth:`EarlyStopMonitor.update` after every rollout with the env step and that rollout's
training metrics. It returns a :class:`EarlyStopDecision`: the ``train/early_stop/...`` metrics to
emit, and whether to stop (``stop_reason = "early_stop:<name>"``). Acceptance-driven stops
(``on_acceptance``) are not handled here: they arrive from the supervisor through the outbox.

Semantics (steps are env steps, ``train/global_step``):

* **threshold** (``metric operator threshold``): from ``warmup_steps`` on, the condition *holds* at
  an update when the comparison is true; it *would trigger* once it has held continuously for at
  least ``patience_steps`` (measured from the first update of the current holding streak; with
  ``patience_steps == 0`` the first holding update triggers). ``best`` is the largest value seen for
  ``>``/``>=``, the smallest for ``<``/``<=``, the one closest to the threshold for ``==``.
* **plateau** (``direction``, ``min_delta``): a value *improves* when it beats ``best`` by more than
  ``min_delta`` (the first value always improves). It would trigger when the steps since the last
  improvement, counted from ``warmup_steps`` at the earliest, reach ``patience_steps`` (with
  ``patience_steps == 0``: any update after warmup that does not improve).
* ``patience/progress`` is that count over ``patience_steps`` clipped to [0, 1] (1 when the patience
  is 0 and the condition holds). ``would_trigger`` is 1.0 or 0.0 and is emitted for ``observe``
  conditions too; only ``action: stop`` conditions stop training. Before ``warmup_steps`` nothing
  triggers. Updates that lack a condition's metric leave it untouched and emit nothing for it.

Metric names: :data:`EARLY_STOP_METRIC_NAMES` (registered in :mod:`gradlab.metrics.registry` and
METRICS.md). The learner saves :meth:`EarlyStopMonitor.state_dict` in every checkpoint
(``resume/early_stop.json``), so a resumed run continues its streaks and bests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gradlab.contracts.goal import EarlyStopCondition, compare
from gradlab.errors import ContractViolation

EARLY_STOP_VALUE = "train/early_stop/{condition}/value"
EARLY_STOP_BEST = "train/early_stop/{condition}/best"
EARLY_STOP_PROGRESS = "train/early_stop/{condition}/patience/progress"
EARLY_STOP_WOULD_TRIGGER = "train/early_stop/{condition}/would_trigger"

#: Every name this module emits (templates; ``{condition}`` is the condition's name), in METRICS.md order.
EARLY_STOP_METRIC_NAMES: tuple[str, ...] = (
    EARLY_STOP_VALUE,
    EARLY_STOP_BEST,
    EARLY_STOP_PROGRESS,
    EARLY_STOP_WOULD_TRIGGER,
)


@dataclass(frozen=True)
class EarlyStopDecision:
    """What one update decided: metrics to emit and whether (and why) to stop."""

    stop: bool
    condition: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def stop_reason(self) -> str | None:
        """``early_stop:<name>`` (the learner's ``learner_finished.stop_reason``) or None."""
        return f"early_stop:{self.condition}" if self.stop and self.condition else None


@dataclass
class _State:
    best: float | None = None
    since: int | None = None  # threshold: first step of the holding streak; plateau: last improvement
    triggered: bool = False


class EarlyStopMonitor:
    """Evaluates early-stop conditions over training metrics (see the module docstring).

    Args:
        conditions: ``goal.train.early_stop.conditions``; names must be unique.

    Raises:
        ContractViolation: two conditions share a name.
    """

    def __init__(self, conditions: Sequence[EarlyStopCondition]):
        seen: set[str] = set()
        for c in conditions:
            if c.name in seen:
                raise ContractViolation(f"train.early_stop.conditions: duplicate condition name {c.name!r}")
            seen.add(c.name)
        self.conditions = list(conditions)
        self._state = {c.name: _State() for c in self.conditions}

    def update(self, step: int, metrics: Mapping[str, float]) -> EarlyStopDecision:
        """Feed one rollout's metrics.

        Args:
            step: env steps so far (``train/global_step``), non-decreasing across calls.
            metrics: registered training metric name -> value (non-finite values are ignored).

        Returns:
            The decision: ``stop`` is True when a ``stop`` condition triggered (the first such
            condition in goal order is named); ``metrics`` holds the four ``train/early_stop/{name}/...``
            values for each condition whose metric was present.
        """
        out: dict[str, float] = {}
        stop_by: str | None = None
        for cond in self.conditions:
            raw = metrics.get(cond.metric)
            if raw is None or not math.isfinite(float(raw)):
                continue
            value = float(raw)
            state = self._state[cond.name]
            if cond.kind == "threshold":
                progress, would = self._threshold(cond, state, step, value)
            else:
                progress, would = self._plateau(cond, state, step, value)
            state.triggered = state.triggered or would
            n = cond.name
            out[EARLY_STOP_VALUE.format(condition=n)] = value
            out[EARLY_STOP_BEST.format(condition=n)] = float(state.best) if state.best is not None else value
            out[EARLY_STOP_PROGRESS.format(condition=n)] = progress
            out[EARLY_STOP_WOULD_TRIGGER.format(condition=n)] = 1.0 if would else 0.0
            if would and cond.action == "stop" and stop_by is None:
                stop_by = cond.name
        return EarlyStopDecision(stop=stop_by is not None, condition=stop_by, metrics=out)

    @staticmethod
    def _progress(elapsed: int, patience: int) -> float:
        if patience == 0:
            return 1.0
        return min(1.0, max(0.0, elapsed / patience))

    def _threshold(self, cond: EarlyStopCondition, state: _State, step: int, value: float) -> tuple[float, bool]:
        assert cond.operator is not None and cond.threshold is not None  # guaranteed by the contract
        if state.best is None:
            state.best = value
        elif cond.operator in (">", ">="):
            state.best = max(state.best, value)
        elif cond.operator in ("<", "<="):
            state.best = min(state.best, value)
        elif abs(value - cond.threshold) < abs(state.best - cond.threshold):
            state.best = value
        if step < cond.warmup_steps or not compare(value, cond.operator, cond.threshold):
            state.since = None
            return 0.0, False
        if state.since is None:
            state.since = step
        elapsed = step - state.since
        return self._progress(elapsed, cond.patience_steps), elapsed >= cond.patience_steps

    def _plateau(self, cond: EarlyStopCondition, state: _State, step: int, value: float) -> tuple[float, bool]:
        sign = 1.0 if cond.direction == "maximize" else -1.0
        improved = state.best is None or sign * (value - state.best) > cond.min_delta
        if improved:
            state.best = value
            state.since = step
        if step < cond.warmup_steps:
            return 0.0, False
        if cond.patience_steps == 0:
            return (0.0, False) if improved else (1.0, True)
        assert state.since is not None
        stalled = step - max(state.since, cond.warmup_steps)
        return self._progress(stalled, cond.patience_steps), stalled >= cond.patience_steps

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state, saved in resume state so a resumed run continues streaks and bests."""
        return {name: {"best": s.best, "since": s.since, "triggered": s.triggered} for name, s in self._state.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output; unknown condition names are ignored."""
        for name, s in state.items():
            if name in self._state:
                self._state[name] = _State(best=s.get("best"), since=s.get("since"), triggered=bool(s.get("triggered")))
