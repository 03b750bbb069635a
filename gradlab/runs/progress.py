"""What a person watching a run wants to see, read from the outbox without touching the run.

:class:`RunProgress` folds outbox events into a snapshot (steps, steps/s, recent return and a
bounded history of it, the latest update losses, checkpoints ready/published/evaluated/accepted,
one :class:`EvaluationRow` per evaluation, evaluations left and their mean time, ETA). The CLI
renders it with rich (``gradlab train``'s live screen, :mod:`gradlab.cli.run_screen`) and in
``gradlab experiment status``. Memory is bounded: histories are fixed-size deques.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

RETURN_METRIC = "train/episode/return/shaped/mean"
#: Recent returns kept for the sparkline, and evaluations kept for the table (oldest dropped).
RETURN_HISTORY = 64
EVALUATION_HISTORY = 32
#: The update metrics shown as losses: ``train/algorithm/<algorithm>/<suffix>`` → short label.
#: Both learners write these names (gradlab.ppo and SB3's PPO; METRICS.md).
LOSS_METRICS = {"update/loss": "loss", "update/policy_gradient_loss": "policy", "update/value_loss": "value",
                "policy/entropy": "entropy", "update/approx_kl": "kl"}
#: z for a two-sided 95% normal interval.
_Z95 = 1.959963984540054


@dataclass(frozen=True)
class EvaluationRow:
    """One evaluation's result as the supervisor wrote it (``supervisor_metrics`` with
    ``eval/checkpoint_step``).

    ``return_ci95`` is the half-width of a normal 95% interval of the mean return,
    1.96 · std / sqrt(completed episodes) (std is the population std of the aggregates); the
    success interval is the evaluation's own Wilson 95% interval. ``verdict`` is ``accepted`` or
    ``rejected`` (``eval/acceptance/pass``), None when the event carried no aggregates.
    """

    checkpoint_step: int
    return_mean: float | None
    return_ci95: float | None
    success_rate: float | None
    success_low: float | None
    success_high: float | None
    verdict: str | None
    seconds: float | None

    @classmethod
    def of(cls, metrics: dict) -> EvaluationRow:
        def num(name: str) -> float | None:
            value = metrics.get(name)
            return float(value) if isinstance(value, int | float) else None

        std, n = num("eval/episode/return/std"), num("eval/acceptance/episodes/completed")
        passed = num("eval/acceptance/pass")
        return cls(checkpoint_step=int(metrics["eval/checkpoint_step"]), return_mean=num("eval/episode/return/mean"),
                   return_ci95=_Z95 * std / math.sqrt(n) if std is not None and n else None,
                   success_rate=num("eval/outcome/success/rate"), success_low=num("eval/outcome/success/rate_ci95_low"),
                   success_high=num("eval/outcome/success/rate_ci95_high"),
                   verdict=None if passed is None else ("accepted" if passed >= 1.0 else "rejected"),
                   seconds=num("orchestration/eval/seconds"))


def _parse_time(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


@dataclass
class RunProgress:
    outbox_path: Path
    timesteps: int
    step: int = 0
    recent_return: float | None = None
    checkpoints: int = 0
    published: int = 0
    evaluated: int = 0
    accepted: int = 0
    stop: str | None = None
    finished: bool = False
    #: The learner has written ``learner_started`` (its first step is under way).
    started: bool = False
    #: An attempt's supervisor loop is watching the outbox (``Outbox.supervised``).
    supervised: bool = False
    after_seq: int = 0
    #: Steps of the checkpoints announced, evaluated, and accepted (from the supervisor's metrics).
    ready_steps: set[int] = field(default_factory=set)
    evaluated_steps: set[int] = field(default_factory=set)
    accepted_steps: set[int] = field(default_factory=set)
    #: Seconds each evaluation took, submit to result (``orchestration/eval/seconds``).
    eval_seconds: list[float] = field(default_factory=list)
    #: False for a run that publishes but never evaluates (``--no-eval``): read from the run
    #: folder's ``spec.json`` at the first refresh (True when it cannot be read).
    evaluating: bool | None = None
    #: The last :data:`RETURN_HISTORY` recent returns, oldest first (the sparkline).
    returns: deque[float] = field(default_factory=lambda: deque(maxlen=RETURN_HISTORY))
    #: The latest value of each of :data:`LOSS_METRICS`, by short label.
    losses: dict[str, float] = field(default_factory=dict)
    #: The last :data:`EVALUATION_HISTORY` evaluations, in the order their results came.
    evaluations: deque[EvaluationRow] = field(default_factory=lambda: deque(maxlen=EVALUATION_HISTORY))
    _rate_window: list[tuple[float, int]] = field(default_factory=list)
    #: (event time, step) of the learner's first metrics event (the mean rate once it is done).
    _first_event: tuple[datetime, int] | None = None
    #: (event time, step) of recent metrics events: the rate as the learner wrote it.
    _event_window: list[tuple[datetime, int]] = field(default_factory=list)

    def refresh(self) -> RunProgress:
        """Read events since the last refresh (no-op while the outbox does not exist yet)."""
        if not self.outbox_path.exists():
            return self
        if self.evaluating is None:
            try:
                self.evaluating = json.loads((self.outbox_path.parent / "spec.json").read_text()).get("evaluate") is not False
            except (OSError, ValueError, AttributeError):
                self.evaluating = True
        from gradlab.outbox import Outbox

        outbox = Outbox(self.outbox_path, readonly=True)
        try:
            for event in outbox.read(self.after_seq, 10_000):
                self.after_seq = event.event_seq
                metrics = event.payload.get("metrics", {}) if isinstance(event.payload, dict) else {}
                if event.kind == "metrics":
                    self.step = max(self.step, event.step)
                    if RETURN_METRIC in metrics:
                        self.recent_return = float(metrics[RETURN_METRIC])
                        self.returns.append(self.recent_return)
                    self._fold_losses(metrics)
                    self._event_window.append((_parse_time(event.created_at), event.step))
                    self._first_event = self._first_event or self._event_window[-1]
                elif event.kind == "checkpoint_ready":
                    self.checkpoints += 1
                    self.ready_steps.add(int(event.payload.get("step", event.step)))
                elif event.kind == "supervisor_metrics":
                    self.published = int(metrics.get("orchestration/checkpoints/published", self.published))
                    accepted = int(metrics.get("orchestration/checkpoints/accepted", self.accepted))
                    if "eval/checkpoint_step" in metrics:
                        step = int(metrics["eval/checkpoint_step"])
                        self.evaluated_steps.add(step)
                        if accepted > self.accepted:
                            self.accepted_steps.add(step)
                        self.evaluations.append(EvaluationRow.of(metrics))
                    if "orchestration/eval/seconds" in metrics:
                        self.eval_seconds.append(float(metrics["orchestration/eval/seconds"]))
                    self.evaluated = int(metrics.get("orchestration/checkpoints/evaluated", self.evaluated))
                    self.accepted = accepted
                elif event.kind == "learner_started":  # a new attempt's learner: the last one's end is past
                    self.stop, self.finished, self.started = None, False, True
                    self._first_event = None
                elif event.kind == "stop_observed":
                    self.stop = str(event.payload.get("reason"))
                elif event.kind == "learner_finished":
                    self.finished = True
                    self.step = max(self.step, int(event.payload.get("final_step", self.step)))
            self.supervised = self.supervised or outbox.supervised() is not None
        finally:
            outbox.close()
        now = time.monotonic()
        if len(self._rate_window) == 1 and self._rate_window[0][1] == self.step:
            # Not moved since the only reading (the learner not stepping yet: a server or supervisor
            # still starting): the rate counts from the last reading before it moves, not the wait.
            self._rate_window.clear()
        self._rate_window.append((now, self.step))
        self._rate_window = [(t, s) for t, s in self._rate_window if now - t <= 10.0]
        if self._event_window:
            newest = self._event_window[-1][0]
            self._event_window = [(t, s) for t, s in self._event_window if (newest - t).total_seconds() <= 10.0]
        return self

    def _fold_losses(self, metrics: dict) -> None:
        for name, value in metrics.items():
            if name.startswith("train/algorithm/") and isinstance(value, int | float):
                label = LOSS_METRICS.get(name.split("/", 3)[-1])
                if label is not None:
                    self.losses[label] = float(value)

    @property
    def mean_steps_per_s(self) -> float | None:
        """Env steps per second from the learner's first metrics event to its last, from the events'
        own times (what a finished learner averaged); None before two events."""
        if self._first_event is None or not self._event_window:
            return None
        (t0, s0), (t1, s1) = self._first_event, self._event_window[-1]
        seconds = (t1 - t0).total_seconds()
        return (s1 - s0) / seconds if seconds > 0 and s1 > s0 else None

    @property
    def evaluations_left(self) -> int:
        """Announced checkpoints not evaluated yet that still will be: none above the lowest accepted
        step (the supervisor defers those; promotion takes the lowest accepted one)."""
        if self.evaluating is False:
            return 0
        lowest = min(self.accepted_steps, default=None)
        return sum(1 for s in self.ready_steps - self.evaluated_steps if lowest is None or s < lowest)

    @property
    def eval_seconds_mean(self) -> float | None:
        """Mean seconds of the evaluations so far (None before the first)."""
        return sum(self.eval_seconds) / len(self.eval_seconds) if self.eval_seconds else None

    @property
    def milestones(self) -> tuple:
        """What a reader waits for (checkpoints, publications, evaluations, stop, the learner's end):
        a progress line off a terminal is printed at once when these change."""
        return (self.checkpoints, self.published, self.evaluated, self.accepted, self.stop, self.finished)

    @property
    def learner_steps_per_s(self) -> float | None:
        """Env steps per second over the learner's last 10 s of metrics, from the events' own times
        (one reading is enough: ``experiment status``); None when fewer than two events or done."""
        if self.finished or len(self._event_window) < 2:
            return None
        (t0, s0), (t1, s1) = self._event_window[0], self._event_window[-1]
        seconds = (t1 - t0).total_seconds()
        return (s1 - s0) / seconds if seconds > 0 and s1 > s0 else None

    @property
    def steps_per_s(self) -> float | None:
        """Env steps per second over the last 10 s; None before two readings and once the learner is done."""
        if len(self._rate_window) < 2 or self.finished:
            return None
        (t0, s0), (t1, s1) = self._rate_window[0], self._rate_window[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None

    @property
    def eta_s(self) -> float | None:
        rate = self.steps_per_s
        if not rate or self.finished:
            return None
        return max(0.0, (self.timesteps - self.step) / rate)
