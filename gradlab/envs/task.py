"""The task program at run time: signals → events → termination → reward, over N lanes at once.

:class:`TaskRunner` is the one implementation used by training, evaluation and playback, so the
three see the same episodes. It is vectorised over lanes with numpy; only lanes whose episode
ends this step go through Python code.

Semantics (the contract is :mod:`gradlab.contracts.task`):

* Signal values are read after every step. Numeric and boolean values become float64 (a missing
  value is NaN, which equals nothing and never increases, decreases or stays unchanged); strings
  stay strings. The values read at reset are the baseline for the first step's ``increase``,
  ``decrease`` and ``unchanged_for``; a signal with no value at reset has no baseline (NaN).
* ``equals``: value == ``value`` this step. ``equals_for`` N: value == ``value`` on each of the
  last N steps of this episode (reset values do not count); it keeps firing while it holds.
  ``increase``/``decrease``: value > / < the previous step's value (the reset value for step 1).
  ``unchanged_for`` N: value == previous value on each of the last N steps.
* Termination: any ``success`` or ``failure`` event, or the provider's own termination, makes the
  step terminal; any ``timeout`` event, reaching ``max_episode_steps``, or the provider's own time
  limit makes it truncated. Terminal wins: ``truncated`` is never True with ``terminated``.
  The outcome is the candidate ranked first by ``outcome_precedence`` among those that fired
  (events in list order, then ``max_episode_steps``, then the provider's); ``ended`` (the
  provider's termination mapped by ``native_terminated: ended``) ranks last. On a terminal step
  the step limits (``max_episode_steps``, the provider's time limit) are not candidates, while
  ``timeout`` events still compete by precedence (the flags stay terminal). The reason is the
  event name, ``max_episode_steps``, ``native_terminated`` or ``native_time_limit``. When the
  reason is a time limit the outcome is ``termination.timeout_is`` (``timeout`` by default;
  ``success`` for survival goals); the step stays truncated, never terminal.
* Reward: ``native`` = the provider's reward; ``events`` = sum of ``reward.events`` weights of the
  events that fired; ``native_plus_events`` = both; ``terms`` = the sum of the named terms, each
  clipped by its own ``clip`` (:class:`~gradlab.contracts.task.RewardTerm`). That task reward is
  divided by ``reward_scale`` (positive), then clipped by ``reward_clip`` (``true`` = [-1, 1]). So 7
  / 2 clipped to [-1, 1] is 1.0, and to [-2, 3] 3.0.
* Reward components: the named parts of the task reward (each term; or ``native`` and each
  rewarded event), in task-reward units, summing to it. :meth:`TaskRunner.take_component_metrics`
  gives ``train/reward/component/{name}/mean`` (per lane-step), ``nonzero_rate`` (fraction of
  lane-steps where it is not 0) and ``share`` (its sum of absolute values over all components')
  since the previous call. A program whose reward is the native reward alone has no components.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gradlab.contracts.task import TaskProgram
from gradlab.envs.records import EpisodeRecord

#: Outcome rank for "ended" (the provider ended the episode without a mapped outcome): below all.
_ENDED_RANK = 99
#: Reasons that are a time limit: their outcome is the goal's ``termination.timeout_is``.
_TIME_LIMITS = ("max_episode_steps", "native_time_limit")


def signal_array(values: Any, n: int) -> np.ndarray:
    """Coerce one signal's per-lane values into an array.

    Args:
        values: sequence of length n (scalars, None for missing) or an (n,) array.
        n: lane count.

    Returns:
        (n,) float64 (bools as 0/1, None as NaN) when every value is numeric; otherwise (n,)
        object array.
    """
    arr = np.asarray(values)
    if arr.dtype.kind in "biuf":
        return arr.astype(np.float64, copy=False).reshape(n)
    out = np.empty(n, dtype=np.float64)
    try:
        for i, v in enumerate(values):
            out[i] = math.nan if v is None else float(v)
        return out
    except (TypeError, ValueError):
        obj = np.empty(n, dtype=object)
        for i, v in enumerate(values):
            obj[i] = v
        return obj


def _equals(arr: np.ndarray, value: Any) -> np.ndarray:
    if arr.dtype == object:
        return np.fromiter((v == value for v in arr), dtype=bool, count=arr.shape[0])
    if isinstance(value, str):
        return np.zeros(arr.shape[0], dtype=bool)
    return arr == float(value)


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype == object or b.dtype == object:
        return np.fromiter((x == y and x is not None for x, y in zip(a, b, strict=True)), dtype=bool,
                           count=a.shape[0])
    return a == b


def _order(a: np.ndarray, b: np.ndarray, sign: int) -> np.ndarray:
    if a.dtype == object or b.dtype == object:
        n = a.shape[0]
        res = np.zeros(n, dtype=bool)
        for i in range(n):
            try:
                res[i] = bool(a[i] > b[i]) if sign > 0 else bool(a[i] < b[i])
            except TypeError:
                res[i] = False
        return res
    return a > b if sign > 0 else a < b


@dataclass
class TaskStep:
    """The task program's verdict for one vector step.

    Attributes:
        reward: (N,) float32 shaped reward.
        terminated, truncated: (N,) bool; never both True in one lane.
        fired: event name -> (N,) bool.
        episodes: records of the episodes that ended this step, in lane order.
    """

    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    fired: dict[str, np.ndarray]
    episodes: list[EpisodeRecord]
    #: reward component name -> (N,) float64 value this step in task-reward units (empty when none).
    components: dict[str, np.ndarray] | None = None


class TaskRunner:
    """Run one :class:`TaskProgram` over ``n_lanes`` lanes.

    Call :meth:`reset_lanes` when lanes start an episode and :meth:`step` after every vector
    step. The runner keeps per-lane step counts, returns and event state.
    """

    def __init__(self, program: TaskProgram, n_lanes: int):
        self.program = program
        self.n = n_lanes
        self.signal_names = list(program.signals)
        self.event_names = list(program.events)
        term = program.termination
        self._rank = {name: i for i, name in enumerate(term.outcome_precedence)}
        self._rank["ended"] = _ENDED_RANK
        self._max_steps = term.max_episode_steps
        self._native_outcome = term.native_terminated
        rew = program.reward
        self._use_native = rew.source in ("native", "native_plus_events")
        self._event_rewards = [(name, float(w)) for name, w in rew.events.items()] if rew.source != "native" else []
        self._terms = dict(rew.terms)
        #: Names of the reward components (see the module docstring), in order.
        self.component_names: list[str] = (list(self._terms) if self._terms else
                                           ((["native"] if self._use_native else []) + [n for n, _ in self._event_rewards]
                                            if self._event_rewards else []))
        self._best: dict[str, np.ndarray] = {t.signal: np.full(n_lanes, np.nan) for t in self._terms.values()
                                             if t.kind == "progress" and t.signal}
        self._comp_sum = np.zeros(len(self.component_names))
        self._comp_abs = np.zeros(len(self.component_names))
        self._comp_nonzero = np.zeros(len(self.component_names), dtype=np.int64)
        self._comp_steps = 0
        self._scale = float(rew.reward_scale)
        if rew.reward_clip is True:
            self._clip: tuple[float, float] | None = (-1.0, 1.0)
        elif rew.reward_clip is False:
            self._clip = None
        else:
            self._clip = (float(rew.reward_clip[0]), float(rew.reward_clip[1]))
        #: True when the program reads no signals (hence has no events, progress fields or event
        #: rewards): only native flags, ``max_episode_steps`` and the reward transform apply, and
        #: :meth:`step_native` gives the same results as :meth:`step` with fewer array operations.
        self.simple = not program.signals and not program.events and not self._terms
        # The shaped reward is the native reward itself (no events, scale 1, no clip).
        self._identity_reward = (self._use_native and not self._event_rewards and self._scale == 1.0
                                 and self._clip is None)
        # Per-lane state.
        self.steps = np.zeros(n_lanes, dtype=np.int64)
        self._zeros = np.zeros(n_lanes, dtype=bool)
        self.returns = np.zeros(n_lanes, dtype=np.float64)
        self.raw_returns = np.zeros(n_lanes, dtype=np.float64)
        self.seeds: list[int | None] = [None] * n_lanes
        self.starts: list[str | None] = [None] * n_lanes
        self._prev: dict[str, np.ndarray] = {s: np.full(n_lanes, np.nan) for s in self.signal_names}
        self._last: dict[str, np.ndarray] = {s: np.full(n_lanes, np.nan) for s in self.signal_names}
        self._count: dict[str, np.ndarray] = {e: np.zeros(n_lanes, dtype=np.int64) for e in self.event_names}

    # -- lifecycle -------------------------------------------------------------------------
    def reset_lanes(self, lanes: np.ndarray | list[int], seeds: list[int | None],
                    signals: dict[str, np.ndarray] | None = None, *,
                    starts: list[str | None] | None = None) -> None:
        """Start new episodes in ``lanes``.

        Args:
            lanes: lane indices, ascending.
            seeds: the seed each lane's reset used (None = continued RNG), same length.
            signals: signal name -> (len(lanes),) values read at reset (the baseline for the first
                step's comparisons); a missing name has no baseline.
            starts: the named start each lane's reset used (None = the default start), same
                length; None = all default. Reported as ``EpisodeRecord.start``.
        """
        idx = np.asarray(lanes, dtype=np.int64)
        self.steps[idx] = 0
        self.returns[idx] = 0.0
        self.raw_returns[idx] = 0.0
        lane_list = idx.tolist()
        for lane, seed in zip(lane_list, seeds, strict=True):
            self.seeds[lane] = seed
        if starts is None:
            for lane in lane_list:
                self.starts[lane] = None
        else:
            for lane, start in zip(lane_list, starts, strict=True):
                self.starts[lane] = start
        for name in self.signal_names:
            values = None if signals is None else signals.get(name)
            self._prev[name] = self._set(self._prev[name], idx, values)
            self._last[name] = self._set(self._last[name], idx, values)
        for name in self.event_names:
            self._count[name][idx] = 0
        for name, best in self._best.items():  # progress starts from the reset value
            best[idx] = self._last[name][idx].astype(np.float64) if self._last[name].dtype != object else np.nan

    def lane_state(self, lane: int) -> dict[str, Any]:
        """Lane ``lane``'s episode state as JSON-able data (step count, returns, seed, start, the
        signals' last values and the events' counters), for a provider state snapshot.

        Non-finite and missing signal values are stored as None."""
        def value(v: Any) -> Any:
            if v is None:
                return None
            if isinstance(v, (np.generic, float, int, bool)):
                f = float(v)
                return f if math.isfinite(f) else None
            return v if isinstance(v, str) else None

        return {"steps": int(self.steps[lane]), "return": float(self.returns[lane]),
                "raw_return": float(self.raw_returns[lane]), "seed": self.seeds[lane], "start": self.starts[lane],
                "prev": {n: value(self._prev[n][lane]) for n in self.signal_names},
                "last": {n: value(self._last[n][lane]) for n in self.signal_names},
                "count": {n: int(self._count[n][lane]) for n in self.event_names}}

    def set_lane_state(self, lane: int, state: dict[str, Any]) -> None:
        """Put lane ``lane`` back into a :meth:`lane_state` (the episode continues from there).

        Raises:
            IntegrityError: the state names other signals or events than this program's.
        """
        from gradlab.errors import IntegrityError

        if sorted(state["prev"]) != sorted(self.signal_names) or sorted(state["count"]) != sorted(self.event_names):
            raise IntegrityError("provider state: the task-program state names other signals or events than this goal's")
        idx = np.array([lane], dtype=np.int64)
        self.steps[lane] = int(state["steps"])
        self.returns[lane] = float(state["return"])
        self.raw_returns[lane] = float(state["raw_return"])
        self.seeds[lane] = state["seed"]
        self.starts[lane] = state["start"]
        for name in self.signal_names:
            for table, key in ((self._prev, "prev"), (self._last, "last")):
                v = state[key][name]
                table[name] = self._set(table[name], idx, None if v is None else np.array([v]))
        for name in self.event_names:
            self._count[name][lane] = int(state["count"][name])

    @staticmethod
    def _set(target: np.ndarray, idx: np.ndarray, values: np.ndarray | None) -> np.ndarray:
        if values is None:
            if target.dtype == object:
                target[idx] = None
            else:
                target[idx] = np.nan
            return target
        values = np.asarray(values)
        if target.dtype != object and values.dtype == object:
            target = target.astype(object)
            target[np.isnan(target.astype(np.float64))] = None
        target[idx] = values
        return target

    # -- stepping --------------------------------------------------------------------------
    def step(self, raw_reward: np.ndarray, native_terminated: np.ndarray, native_truncated: np.ndarray,
             signals: dict[str, np.ndarray]) -> TaskStep:
        """Apply the task program to one vector step.

        Args:
            raw_reward: (N,) native reward.
            native_terminated, native_truncated: (N,) bool, the provider's own flags.
            signals: every program signal -> (N,) values read after this step (see
                :func:`signal_array`).

        Returns:
            The shaped reward, the flags, the events that fired and the finished episodes. The
            caller must then :meth:`reset_lanes` every lane that ended.
        """
        n = self.n
        raw = np.asarray(raw_reward, dtype=np.float64).reshape(n)
        nterm = np.asarray(native_terminated, dtype=bool).reshape(n)
        ntrunc = np.asarray(native_truncated, dtype=bool).reshape(n)
        self.steps += 1

        fired: dict[str, np.ndarray] = {}
        if self.event_names:
            for name, event in self.program.events.items():
                cur = signals[event.signal]
                prev = self._prev[event.signal]
                op = event.op
                if op == "equals":
                    hit = _equals(cur, event.value)
                elif op == "equals_for":
                    eq = _equals(cur, event.value)
                    cnt = self._count[name]
                    cnt[:] = np.where(eq, cnt + 1, 0)
                    hit = cnt >= event.steps
                elif op == "increase":
                    hit = _order(cur, prev, +1)
                elif op == "decrease":
                    hit = _order(cur, prev, -1)
                else:  # unchanged_for
                    same = _same(cur, prev)
                    cnt = self._count[name]
                    cnt[:] = np.where(same, cnt + 1, 0)
                    hit = cnt >= event.steps
                fired[name] = hit
        for name in self.signal_names:
            cur = signals[name]
            if self._prev[name].dtype != cur.dtype and cur.dtype == object:
                self._prev[name] = self._prev[name].astype(object)
                self._last[name] = self._last[name].astype(object)
            self._prev[name] = cur.copy()
            self._last[name] = self._prev[name]

        term = self.program.termination
        zeros = self._zeros
        max_hit = self.steps >= self._max_steps if self._max_steps is not None else zeros
        if fired:
            terminated = self._any(term.success, fired, zeros) | self._any(term.failure, fired, zeros) | nterm
            truncated = (self._any(term.timeout, fired, zeros) | max_hit | ntrunc) & ~terminated
        else:  # the common case (no events): fewer array operations per step
            terminated = nterm.copy()
            truncated = (max_hit | ntrunc) & ~nterm

        # Reward: native and/or events (or the named terms), then / scale, then clip.
        components: dict[str, np.ndarray] = {}
        if self._terms:
            components = self._term_values(raw, signals, fired)
            shaped = np.sum(list(components.values()), axis=0)
        else:
            shaped = raw.copy() if self._use_native else np.zeros(n, dtype=np.float64)
            for name, weight in self._event_rewards:
                shaped += fired[name] * weight
            if self.component_names:
                if self._use_native:
                    components["native"] = raw
                for name, weight in self._event_rewards:
                    components[name] = fired[name] * weight
        if components:
            self._count_components(components)
        if self._scale != 1.0:
            shaped /= self._scale
        if self._clip is not None:
            np.clip(shaped, self._clip[0], self._clip[1], out=shaped)
        self.returns += shaped
        self.raw_returns += raw

        episodes: list[EpisodeRecord] = []
        ended = terminated | truncated
        if np.count_nonzero(ended):  # rare: Python per ended lane only
            for lane in np.flatnonzero(ended).tolist():
                outcome, reason = self._decide(lane, fired, bool(max_hit[lane]), bool(nterm[lane]),
                                               bool(ntrunc[lane]))
                episodes.append(EpisodeRecord(
                    lane=lane, seed=self.seeds[lane], return_=float(self.returns[lane]),
                    raw_return=float(self.raw_returns[lane]), length=int(self.steps[lane]),
                    outcome=outcome, reason=reason, progress=self._progress(lane), start=self.starts[lane],
                ))
        return TaskStep(reward=shaped.astype(np.float32), terminated=terminated, truncated=truncated,
                        fired=fired, episodes=episodes, components=components)

    def _term_values(self, raw: np.ndarray, signals: dict[str, np.ndarray],
                     fired: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Each named term's (N,) float64 value this step, clipped by its own ``clip``."""
        out: dict[str, np.ndarray] = {}
        for name, term in self._terms.items():
            if term.kind == "native":
                value = raw * term.weight
            elif term.kind == "time":
                value = np.full(self.n, term.weight, dtype=np.float64)
            elif term.kind == "event":
                value = fired[term.event].astype(np.float64) * term.weight
            else:  # progress: only a new maximum pays
                cur = signals[term.signal]
                cur = cur.astype(np.float64) if cur.dtype != object else np.full(self.n, np.nan)
                best = self._best[term.signal]
                gain = np.where(np.isfinite(cur) & np.isfinite(best), np.maximum(cur - best, 0.0), 0.0)
                self._best[term.signal] = np.fmax(best, cur)
                value = gain * term.weight
            if term.clip is not None:
                value = np.clip(value, term.clip[0], term.clip[1])
            out[name] = value
        return out

    def _count_components(self, components: dict[str, np.ndarray]) -> None:
        for i, name in enumerate(self.component_names):
            v = components[name]
            self._comp_sum[i] += float(v.sum())
            self._comp_abs[i] += float(np.abs(v).sum())
            self._comp_nonzero[i] += int(np.count_nonzero(v))
        self._comp_steps += self.n

    def take_component_metrics(self) -> dict[str, float]:
        """``train/reward/component/{name}/{mean,nonzero_rate,share}`` since the last call (then reset).

        ``mean`` is per lane-step in task-reward units (before ``reward_scale`` and ``reward_clip``),
        ``nonzero_rate`` the fraction of lane-steps where the component was not 0, ``share`` its
        sum of absolute values over that of every component (0 when all were 0). Empty when the
        program has no components or no step was taken.
        """
        return component_metrics([self])

    def _take_component_totals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        totals = (self._comp_sum.copy(), self._comp_abs.copy(), self._comp_nonzero.copy(), self._comp_steps)
        self._comp_sum[:] = 0.0
        self._comp_abs[:] = 0.0
        self._comp_nonzero[:] = 0
        self._comp_steps = 0
        return totals


    def step_native(self, raw_reward: np.ndarray, native_terminated: np.ndarray,
                    native_truncated: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[EpisodeRecord]]:
        """:meth:`step` for a program without signals (``self.simple``): same results, less work.

        Only the provider's flags, ``max_episode_steps`` and the reward transform apply, so the
        flags are two boolean array operations (``a > b`` is ``a & ~b`` on booleans) and, when the
        transform is the identity, the native reward is the shaped one. ``tests/envs/test_fast_path.py``
        checks it against :meth:`step` step by step.

        Args:
            raw_reward: (N,) float64 native reward (not converted or reshaped here).
            native_terminated, native_truncated: (N,) bool, the provider's own flags (not
                converted or reshaped here).

        Returns:
            ``(reward (N,) float32 shaped, terminated (N,) bool, truncated (N,) bool, episodes)``,
            equal to :meth:`step`'s ``TaskStep`` fields. The caller must then :meth:`reset_lanes`
            every lane that ended.

        Raises:
            ContractViolation: the program reads signals (use :meth:`step`).
        """
        if not self.simple:
            from gradlab.errors import ContractViolation

            raise ContractViolation("TaskRunner.step_native: the task program reads signals; use step()")
        steps = self.steps
        steps += 1
        max_steps = self._max_steps
        if max_steps is None:
            truncated = native_truncated > native_terminated
            ended = native_terminated | native_truncated
        else:
            limited = steps >= max_steps
            limited |= native_truncated
            truncated = limited > native_terminated
            ended = limited | native_terminated
        terminated = native_terminated.copy()
        if self._identity_reward:
            shaped = raw_reward
        else:
            shaped = raw_reward.copy() if self._use_native else np.zeros(self.n, dtype=np.float64)
            if self._scale != 1.0:
                shaped /= self._scale
            if self._clip is not None:
                np.clip(shaped, self._clip[0], self._clip[1], out=shaped)
        self.returns += shaped
        self.raw_returns += raw_reward
        episodes: list[EpisodeRecord] = []
        if np.count_nonzero(ended):  # rare: Python per ended lane only
            for lane in np.flatnonzero(ended).tolist():
                max_hit = max_steps is not None and bool(steps[lane] >= max_steps)
                outcome, reason = self._decide(lane, {}, max_hit, bool(native_terminated[lane]),
                                               bool(native_truncated[lane]))
                episodes.append(EpisodeRecord(
                    lane=lane, seed=self.seeds[lane], return_=float(self.returns[lane]),
                    raw_return=float(self.raw_returns[lane]), length=int(steps[lane]),
                    outcome=outcome, reason=reason, progress={}, start=self.starts[lane],
                ))
        return shaped.astype(np.float32), terminated, truncated, episodes

    @staticmethod
    def _any(names: list[str], fired: dict[str, np.ndarray], zeros: np.ndarray) -> np.ndarray:
        out = zeros
        for name in names:
            out = out | fired[name]
        return out

    def _decide(self, lane: int, fired: dict[str, np.ndarray], max_hit: bool, nterm: bool,
                ntrunc: bool) -> tuple[str, str]:
        term = self.program.termination
        candidates: list[tuple[str, str]] = []
        for kind in ("success", "failure", "timeout"):
            for name in getattr(term, kind):
                if fired[name][lane]:
                    candidates.append((kind, name))
        terminal = nterm or any(kind != "timeout" for kind, _ in candidates)
        if max_hit and not terminal:
            candidates.append(("timeout", "max_episode_steps"))
        if nterm:
            candidates.append((self._native_outcome, "native_terminated"))
        if ntrunc and not terminal:
            candidates.append(("timeout", "native_time_limit"))
        # min() keeps the first of equal rank: events in list order, then limits, then native.
        outcome, reason = min(candidates, key=lambda c: self._rank[c[0]])
        if reason in _TIME_LIMITS:  # a survival goal's time limit is its success (the flags stay truncated)
            outcome = term.timeout_is
        return outcome, reason

    def _progress(self, lane: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for name in self.program.progress:
            value = self._last[name][lane]
            try:
                f = float(value)
            except (TypeError, ValueError):
                continue
            if math.isfinite(f):
                out[name] = f
        return out


def component_metrics(runners: list[TaskRunner]) -> dict[str, float]:
    """:meth:`TaskRunner.take_component_metrics` over several runners of one program (lane groups),
    their lane-steps pooled; every runner's totals are reset."""
    if not runners or not runners[0].component_names:
        return {}
    totals = [r._take_component_totals() for r in runners]
    total_sum = np.sum([t[0] for t in totals], axis=0)
    total_abs = np.sum([t[1] for t in totals], axis=0)
    nonzero = np.sum([t[2] for t in totals], axis=0)
    steps = sum(t[3] for t in totals)
    if not steps:
        return {}
    all_abs = float(total_abs.sum())
    out: dict[str, float] = {}
    for i, name in enumerate(runners[0].component_names):
        base = f"train/reward/component/{name}"
        out[f"{base}/mean"] = float(total_sum[i]) / steps
        out[f"{base}/nonzero_rate"] = float(nonzero[i]) / steps
        out[f"{base}/share"] = float(total_abs[i]) / all_abs if all_abs > 0 else 0.0
    return out
