"""What a person watching a run wants to see, read from the outbox without touching the run.

:class:`RunProgress` folds outbox events into a snapshot (steps, steps/s, recent return,
checkpoints ready/published/evaluated/accepted, ETA). The CLI renders it with rich.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

RETURN_METRIC = "train/episode/return/shaped/mean"


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
    after_seq: int = 0
    _rate_window: list[tuple[float, int]] = field(default_factory=list)

    def refresh(self) -> RunProgress:
        """Read events since the last refresh (no-op while the outbox does not exist yet)."""
        if not self.outbox_path.exists():
            return self
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
                elif event.kind == "checkpoint_ready":
                    self.checkpoints += 1
                elif event.kind == "supervisor_metrics":
                    self.published = int(metrics.get("orchestration/checkpoints/published", self.published))
                    self.evaluated = int(metrics.get("orchestration/checkpoints/evaluated", self.evaluated))
                    self.accepted = int(metrics.get("orchestration/checkpoints/accepted", self.accepted))
                elif event.kind == "stop_observed":
                    self.stop = str(event.payload.get("reason"))
                elif event.kind == "learner_finished":
                    self.finished = True
                    self.step = max(self.step, int(event.payload.get("final_step", self.step)))
        finally:
            outbox.close()
        now = time.monotonic()
        self._rate_window.append((now, self.step))
        self._rate_window = [(t, s) for t, s in self._rate_window if now - t <= 10.0]
        return self

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
