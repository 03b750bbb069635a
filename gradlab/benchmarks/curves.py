"""``gradlab benchmark curves``: training learning curves of several sides on one goal, and whether they agree.

Issue 14's two curve checks (benchmarks, not CI): Breakout's curve over the first 1M steps on
``gradlab.ppo`` within seed noise of ``sb3.ppo``'s, and ``gradlab.ppo`` in bf16 on a CPU matching
fp32 over the first 200k steps.

A *side* is ``BACKEND[:PRECISION]`` (``sb3.ppo``, ``gradlab.ppo``, ``gradlab.ppo:bf16``). Each
side and seed is one *run*: the goal's recipe for that backend (``ppo-sb3`` for ``sb3.ppo`` when
the goal has one, else ``ppo``; ``ppo`` for ``gradlab.ppo``; ``train.backend.id`` set to the side's
backend either way, so the hyperparameters are the recipe's), trained for ``--steps`` env steps
(by default the first ``--steps`` of the recipe's own run: its schedules keep the recipe's
``train.timesteps`` horizon and the learner stops at ``--steps``; ``--schedule-horizon steps``
anneals them over ``--steps`` instead) by gradlab's own learner (:func:`gradlab.learn.learner.run_learner`: outbox, metric checks,
early-stop monitor, one final checkpoint, device cpu, ``--threads`` torch threads) in a fresh
process, ``--jobs`` processes at a time. The learner's vector env is wrapped by
:class:`EpisodeLog`, which records each training episode's env step (lane steps so far, as the
learner's ``num_timesteps``) and raw return (the provider's native score summed over the episode,
before the task program's reward clipping: the game score). At the end of a run the recorded
episodes are checked against the learner's own outbox: the mean of the last 100 recorded raw
returns must equal the last ``train/episode/return/raw/mean`` metric (``outbox_check`` in the JSON).

Outputs in ``--out`` (default ``$GRADLAB_HOME/benchmarks/curves-<goal>-<UTC time>``):

* ``curves.json``: the settings, the machine, and per run ``side, seed, status, steps,
  episode_steps, returns, seconds, cpu_seconds, stalled_s, steps_per_s, stop_reason,
  schedule_timesteps, outbox_check``, plus ``summary`` (the comparisons of :mod:`gradlab.benchmarks.curve_stats`).
  Rewritten after every run that ends and every ``--flush-s`` seconds (a run cut short still
  leaves its partial curve); each worker also keeps ``runs/<side>-s<seed>.json`` current every
  10 s.
* ``curves.png``: the rolling mean of the last 100 episodes' raw return against env steps, one
  thin line per run, and per side with >= 2 seeds the mean over seeds with a band from the lowest
  to the highest seed (with one seed: a band of +/- one standard error of the window's mean).
* A rich table at each milestone every run has passed (every ``--milestone`` env steps; default a
  tenth of the budget), and at the end, and a verdict line per side against the first side. Runs
  still queued count as at step 0, so with ``--jobs`` below the number of runs the early tables wait
  for the last runs to pass them; milestones passed between two polls print as one table. Each
  run's progress bar shows its own wall time since it started ("run time", pauses included).

Pauses: the command and its workers may be stopped and continued (SIGSTOP/SIGCONT) at any time;
nothing times out. ``seconds`` is wall time including pauses; ``stalled_s`` is the time a worker's
heartbeat thread (ticking every 0.5 s) saw itself not run for more than 2 s at a stretch (stopped,
or not scheduled), and ``steps_per_s = steps / (seconds - stalled_s)``. Interrupting (Ctrl-C or
SIGTERM to the command, or SIGINT to its process group) stops every worker at its next update
boundary (the command forwards SIGTERM to each, again every :data:`TERM_EVERY_S` until it ends),
starts no queued run (status ``not run``), and writes the JSON (``complete`` false, each run's
``status``, ``judged_at``: the step every started run reached, where the summary judges) and the
plot (its title says so); it prints the interruption and that step, and exits 130. A second
interrupt kills the runs in flight (status ``killed``; their curves end at their last record, at
most :data:`WORKER_FLUSH_S` old). ``complete`` is true only when every run
trained its budget (status ``done``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gradlab.benchmarks.curve_stats import WINDOW, Curve, compare_area, compare_at, verdict
from gradlab.errors import ConfigError

BACKENDS = ("sb3.ppo", "gradlab.ppo")
PRECISIONS = ("fp32", "bf16")
RECIPES = {"sb3.ppo": ("ppo-sb3", "ppo"), "gradlab.ppo": ("ppo",)}
"""Per backend, the goal's recipes to train, the first the goal has."""
WORKER_FLUSH_S = 10.0
STALL_S = 2.0
TICK_S = 0.5
TERM_EVERY_S = 2.0
"""Seconds between the SIGTERMs an interrupted command sends each run still in flight."""


@dataclass(frozen=True)
class Side:
    """One side: a backend and (gradlab.ppo only) a precision; ``label`` is how it was written."""

    backend: str
    precision: str = "fp32"

    @property
    def label(self) -> str:
        return self.backend if self.precision == "fp32" else f"{self.backend}:{self.precision}"

    @classmethod
    def parse(cls, text: str) -> Side:
        """``BACKEND[:PRECISION]``.

        Raises:
            ConfigError: an unknown backend or precision, or a precision on sb3.ppo.
        """
        backend, _, precision = text.partition(":")
        precision = precision or "fp32"
        if backend not in BACKENDS:
            raise ConfigError(f"--side {text!r}: expected a backend of {', '.join(BACKENDS)}, found {backend!r}")
        if precision not in PRECISIONS:
            raise ConfigError(f"--side {text!r}: expected a precision of {', '.join(PRECISIONS)}, found {precision!r}")
        if backend == "sb3.ppo" and precision != "fp32":
            raise ConfigError(f"--side {text!r}: sb3.ppo trains in fp32 only")
        return cls(backend, precision)


def run_key(side: Side, seed: int) -> str:
    return f"{side.label.replace(':', '-')}-s{seed}"


def side_ref(goal: str, side: Side) -> str:
    """``GOAL/RECIPE`` for ``side`` (:data:`RECIPES`).

    Raises:
        NotFound: an unknown goal (as ``gradlab train`` reports it: did-you-mean or the known goals),
            or the goal has none of the backend's recipes.
    """
    from gradlab.contracts.experiments import Experiments
    from gradlab.errors import NotFound

    exp = Experiments()
    exp.goal_path(goal)  # NotFound: unknown goal 'X' (the resolver `gradlab train` goes through)
    names = set(exp.recipe_ids(goal))
    for recipe in RECIPES[side.backend]:
        if recipe in names:
            return f"{goal}/{recipe}"
    raise NotFound(f"{goal}: expected one of the recipes {', '.join(RECIPES[side.backend])} for {side.label}, found none")


HORIZONS = ("recipe", "steps")


def run_spec(goal: str, side: Side, seed: int, steps: int, threads: int, horizon: str = "recipe") -> Any:
    """The run spec of one run: the side's recipe, one final checkpoint, device cpu, ``threads`` torch
    threads, the side's backend and precision.

    ``horizon`` sets ``train.timesteps``, the length the learning-rate, clip-range and entropy
    schedules run over: ``recipe`` keeps the recipe's (the run then stops at ``steps``, so the curve
    is the first ``steps`` of the recipe's own run; at least ``steps``), ``steps`` sets it to
    ``steps`` (the schedules reach their final values at the end of the curve).

    Raises:
        ConfigError: an unknown ``horizon``, or an override the recipe rejects. NotFound: no recipe.
    """
    from gradlab.contracts.experiments import Experiments
    from gradlab.contracts.run_spec import RunSpec

    if horizon not in HORIZONS:
        raise ConfigError(f"--schedule-horizon: expected {' or '.join(HORIZONS)}, found {horizon!r}")
    overrides = [f"train.checkpoint_freq={steps}", "train.device=cpu", f"train.torch_threads={threads}",
                 f"train.backend.id={side.backend}"]
    if side.backend == "gradlab.ppo":
        overrides += [f"train.backend.config.threads={threads}", f"train.backend.config.precision={side.precision}"]
    exp, ref = Experiments(), side_ref(goal, side)
    resolved = exp.resolve(ref, overrides)
    if horizon == "steps" or resolved.recipe.train.timesteps < steps:
        resolved = exp.resolve(ref, [f"train.timesteps={steps}", *overrides])
    return RunSpec.from_resolved(resolved, seed=seed)


# -- the worker: one run in its own process ---------------------------------------------------
class EpisodeLog:
    """A gradlab ``VectorEnv`` that records every finished episode's env step and raw return.

    Every attribute but :meth:`step` is the wrapped env's. ``steps`` counts lane steps (``num_envs``
    per :meth:`step`); ``episode_steps[i]`` (int) is ``steps`` after the step that ended episode i,
    ``returns[i]`` (float) its ``EpisodeRecord.raw_return``. ``on_step`` (optional) is called after
    each step.
    """

    def __init__(self, venv: Any, on_step: Any = None):
        self._venv = venv
        self._on_step = on_step
        self.steps = 0
        self.episode_steps: list[int] = []
        self.returns: list[float] = []
        # Lane groups (gradlab.envs.groups): gradlab.ppo's rollout steps each group on its own, so
        # every group's step_wait is where episodes are recorded (LaneGroups.step goes through them).
        self._groups = list(getattr(venv, "groups", None) or [])
        for group in self._groups:
            group.step_wait = functools.partial(self._group_wait, group, group.step_wait)

    def _record(self, res: Any, lanes: int) -> None:
        self.steps += lanes
        for ep in res.episodes:
            self.episode_steps.append(self.steps)
            self.returns.append(float(ep.raw_return))
        if self._on_step is not None:
            self._on_step()

    def _group_wait(self, group: Any, wait: Any) -> Any:
        res = wait()
        self._record(res, group.num_envs)
        return res

    def step(self, actions: Any) -> Any:
        res = self._venv.step(actions)
        if not self._groups:
            self._record(res, self._venv.num_envs)
        return res

    def __getattr__(self, name: str) -> Any:
        if name == "venv":  # gradlab.ppo unwraps an SB3VecEnv through .venv: this is no adapter
            raise AttributeError(name)
        return getattr(self._venv, name)


class _Heartbeat(threading.Thread):
    """Adds to ``stalled_s`` every stretch longer than :data:`STALL_S` in which this process did not run."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="curves-heartbeat")
        self.stalled_s = 0.0

    def run(self) -> None:
        last = time.monotonic()
        while True:
            time.sleep(TICK_S)
            now = time.monotonic()
            if now - last > STALL_S:
                self.stalled_s += now - last - TICK_S
            last = now


def _cpu_seconds() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _write_json(path: Path, doc: dict) -> None:
    """Atomically (:func:`gradlab.fsync.write_atomic`): a reader never sees half a file."""
    from gradlab.fsync import write_atomic

    write_atomic(path, json.dumps(doc).encode())


def _outbox_check(outbox_path: Path, returns: list[float]) -> dict:
    """The learner's last ``train/episode/return/raw/mean`` against the mean of the last 100 recorded."""
    from gradlab.outbox import Outbox

    outbox = Outbox(outbox_path, readonly=True)
    try:
        last = None
        for event in outbox.read(0, limit=10_000_000, kind="metrics"):
            value = event.payload.get("metrics", {}).get("train/episode/return/raw/mean")
            if value is not None:
                last = float(value)
    finally:
        outbox.close()
    recorded = sum(returns[-WINDOW:]) / len(returns[-WINDOW:]) if returns else None
    match = (last is None and recorded is None) or (
        last is not None and recorded is not None and math.isclose(last, recorded, rel_tol=1e-9, abs_tol=1e-9))
    return {"outbox_raw_mean": last, "recorded_raw_mean": recorded, "match": match}


_EARLY_STOP = [False]
"""Set by :func:`_early_stop`, the worker process's SIGTERM/SIGINT handler until the learner installs its own."""


def _early_stop(signum: int, frame: Any) -> None:
    _EARLY_STOP[0] = True


def _ignore_stops() -> None:
    """Trained: later SIGTERMs (the command repeats them) must not kill the process while it writes its
    record or exits (Python puts its own handlers back to the default at exit; an ignored signal stays so)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def worker(goal: str, side: Side, seed: int, steps: int, threads: int, out: Path, parent_pid: int,
           horizon: str = "recipe") -> dict:
    """Train one run for ``steps`` env steps (:func:`run_spec`), keeping ``out`` (its JSON record)
    current; returns the final record (``status`` ``done`` once ``steps`` were trained).

    Raises:
        ContractViolation / ConfigError / NotFound: as :func:`run_learner` and :func:`run_spec`.
    """
    import tempfile

    from gradlab.envs import make_vector_env
    from gradlab.learn.learner import OUTBOX_FILE, run_learner

    spec = run_spec(goal, side, seed, steps, threads, horizon)
    heartbeat = _Heartbeat()
    record: dict[str, Any] = {"side": side.label, "backend": side.backend, "precision": side.precision, "seed": seed,
                              "ref": f"{spec.goal_id}/{spec.recipe_id}", "threads": threads, "budget": steps,
                              "schedule_timesteps": spec.recipe.train.timesteps,
                              "status": "running", "pid": os.getpid()}
    c0, t0 = _cpu_seconds(), time.monotonic()
    last_flush = [t0]

    def snapshot(status: str) -> dict:
        seconds = time.monotonic() - t0
        active = max(seconds - heartbeat.stalled_s, 1e-9)
        record.update(status=status, steps=log.steps, episode_steps=log.episode_steps, returns=log.returns,
                      seconds=seconds, cpu_seconds=_cpu_seconds() - c0, stalled_s=heartbeat.stalled_s,
                      steps_per_s=log.steps / active)
        return record

    def on_step() -> None:
        now = time.monotonic()
        if now - last_flush[0] >= WORKER_FLUSH_S:
            last_flush[0] = now
            _write_json(out, snapshot("running"))

    # Each side's own vector env: gradlab.ppo's is two lane groups on ale-py (its pipelined rollout).
    if side.backend == "gradlab.ppo":
        from gradlab.learn.ppo import PPOBackend

        venv = PPOBackend.make_env(spec)
    else:
        venv = make_vector_env(spec.environment, seed=spec.seed)
    log = EpisodeLog(venv, on_step)
    heartbeat.start()
    _write_json(out, snapshot("running"))
    if side.backend == "sb3.ppo":
        from gradlab.envs.sb3 import SB3VecEnv

        env: Any = SB3VecEnv(log)  # type: ignore[arg-type]  # an EpisodeLog is a VectorEnv by delegation
    else:
        env = log
    if _EARLY_STOP[0]:  # SIGTERM/SIGINT before the learner's own handler was in place: train nothing
        _ignore_stops()
        record.update(stop_reason="sigterm", final_step=0)
        final = snapshot("stopped")
        _write_json(out, final)
        return final
    with tempfile.TemporaryDirectory(prefix="gradlab-curves-") as tmp:
        result = run_learner(spec, Path(tmp) / "run", env=env, stop_at_step=steps, watch_parent=True,
                             parent_pid=parent_pid)
        _ignore_stops()
        record["stop_reason"] = result.stop_reason
        record["final_step"] = result.final_step
        record["outbox_check"] = _outbox_check(Path(tmp) / "run" / OUTBOX_FILE, log.returns)
    done = result.final_step >= steps and result.stop_reason in ("budget", "stop_requested")
    final = snapshot("done" if done else "stopped")
    _write_json(out, final)
    return final


# -- the command: runs as processes, progress, milestones, JSON, plot -------------------------
@dataclass
class _Run:
    side: Side
    seed: int
    path: Path
    log: Path
    proc: subprocess.Popen | None = None
    record: dict | None = None
    mtime: float = 0.0
    status: str = "pending"
    killed: bool = False

    @property
    def key(self) -> str:
        return run_key(self.side, self.seed)

    def curve(self) -> Curve:
        r = self.record or {}
        return Curve.of(r.get("episode_steps", []), r.get("returns", []))

    def steps(self) -> int:
        return int((self.record or {}).get("steps", 0))

    def refresh(self) -> None:
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime != self.mtime:
            try:
                self.record = json.loads(self.path.read_text())
                self.mtime = mtime
            except (json.JSONDecodeError, OSError):  # pragma: no cover - replaced atomically; retried next poll
                pass


def default_out(goal: str) -> Path:
    from gradlab.settings import load_settings

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return load_settings().home / "benchmarks" / f"curves-{goal}-{stamp}"


def milestones(steps: int, every: int) -> list[int]:
    out = list(range(every, steps + 1, every))
    return out if out and out[-1] == steps else [*out, steps]


def summarize(runs: list[_Run], sides: list[Side], marks: list[int], window: int = WINDOW,
              upto: int | None = None) -> dict:
    """Per milestone (up to ``upto``, and at ``upto`` itself) and side the mean curve; per other side
    against the first the comparisons at each milestone, of the area statistic, and the verdict
    (:mod:`curve_stats`) at the last point."""
    ref = sides[0]
    curves = {s.label: [r.curve() for r in runs if r.side == s and r.record] for s in sides}
    marks = [m for m in marks if upto is None or m <= upto]
    if upto and (not marks or marks[-1] != upto):  # a partial run: judged at the step every run has reached
        marks.append(upto)
    rows = []
    for m in marks:
        row: dict[str, Any] = {"step": m, "mean": {}, "compare": {}}
        for s in sides:
            vals = [c.at(m, window) for c in curves[s.label]]
            finite = [v for v in vals if math.isfinite(v)]
            row["mean"][s.label] = sum(finite) / len(finite) if finite else None
        for s in sides[1:]:
            row["compare"][s.label] = compare_at(m, curves[ref.label], curves[s.label], window).as_json()
        rows.append(row)
    verdicts = {}
    end = marks[-1] if marks else 0
    for s in sides[1:]:
        final = compare_at(end, curves[ref.label], curves[s.label], window)
        area = compare_area(marks, curves[ref.label], curves[s.label], window)
        v = verdict(s.label, ref.label, final, area)
        verdicts[s.label] = {"within": v.within, "kind": v.kind, "text": v.text, "final": final.as_json(),
                             "area": area.as_json()}
    return {"reference": ref.label, "window": window, "milestones": rows, "verdicts": verdicts}


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def render_table(summary: dict, sides: list[Side], title: str) -> Any:
    from rich.table import Table

    table = Table(title=title, caption=f"per side: the raw return of the last {summary['window']} training episodes, "
                  "mean over seeds; noise: 2 SE from the spread between seeds (seeds), or half the 95% bootstrap "
                  "interval over the window's episodes (episodes: seed noise not estimated)")
    table.add_column("env steps", justify="right")
    for s in sides:
        table.add_column(s.label, justify="right")
    for s in sides[1:]:
        table.add_column(f"{s.label} - {sides[0].label}", justify="right")
        table.add_column("noise +/-", justify="right")
        table.add_column("within", justify="center")
    for row in summary["milestones"]:
        cells = [f"{row['step']:,}"] + [_fmt(row["mean"][s.label]) for s in sides]
        for s in sides[1:]:
            c = row["compare"][s.label]
            within = {True: "yes", False: "[red]no[/]", None: "-"}[c["within"]]
            kind = {"seed": " seeds", "episode": " episodes"}.get(c["kind"], "")
            cells += [_fmt(c["diff"], "+.2f"), _fmt(c["noise"]) + kind, within]
        table.add_row(*cells)
    return table


def plot(runs: list[_Run], sides: list[Side], path: Path, title: str, window: int = WINDOW) -> None:
    """Write the curves' PNG (module docstring). Headless (matplotlib's Agg)."""
    import numpy as np
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 6), dpi=100, layout="constrained")  # no pyplot: headless, Agg canvas
    ax = fig.subplots()
    for i, s in enumerate(sides):
        color = f"C{i % 10}"
        mine = [r for r in runs if r.side == s and r.record and r.record.get("returns")]
        for r in mine:
            c = r.curve()
            ax.plot(c.steps, c.rolling(window), color=color, lw=0.8, alpha=0.6 if len(mine) > 1 else 1.0,
                    label=f"{s.label} seed {r.seed}")
        if len(mine) >= 2:
            top = min(int(r.curve().steps[-1]) for r in mine)
            first = max(int(r.curve().steps[0]) for r in mine)
            if top > first:
                grid = np.linspace(first, top, 200)
                ys = np.stack([np.interp(grid, r.curve().steps, r.curve().rolling(window)) for r in mine])
                ax.fill_between(grid, ys.min(0), ys.max(0), color=color, alpha=0.2, label=f"{s.label} seed spread")
                ax.plot(grid, ys.mean(0), color=color, lw=2.0, label=f"{s.label} mean of {len(mine)} seeds")
        elif mine:
            c = mine[0].curve()
            roll = c.rolling(window)
            sq = np.concatenate([[0.0], np.cumsum(c.returns ** 2)])
            idx = np.arange(1, c.returns.size + 1)
            n = idx - np.maximum(idx - window, 0)
            var = np.maximum((sq[idx] - sq[idx - n]) / n - roll ** 2, 0.0)
            se = np.sqrt(var / n)
            ax.fill_between(c.steps, roll - se, roll + se, color=color, alpha=0.2,
                            label=f"{s.label} +/- 1 SE (episode noise)")
    ax.set_xlabel("env steps")
    ax.set_ylabel(f"raw return, mean of the last {window} training episodes")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial.png")
    fig.savefig(tmp)
    os.replace(tmp, path)


def _machine() -> dict:
    import platform

    return {"host": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "processor": platform.processor(), "load_average_1m": os.getloadavg()[0]}


def run(goal: str, sides: list[Side], seeds: list[int], steps: int, threads: int = 1, jobs: int = 1,
        out: Path | None = None, milestone: int | None = None, flush_s: float = 120.0, window: int = WINDOW,
        horizon: str = "recipe", console: Any = None) -> dict:
    """Train every side on every seed, print milestone tables, write ``curves.json`` and ``curves.png``.

    Returns:
        The final JSON document (also in ``out/curves.json``).

    Raises:
        ConfigError: bad arguments (no side, a repeated side, fewer than 1 step or job).
        NotFound: the goal lacks a side's recipe (checked before anything starts).
        RuntimeError: a run's process failed (after every other run ended and the files were written).
        KeyboardInterrupt: after SIGINT or SIGTERM, once the runs ended and the files were written.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not sides:
        raise ConfigError("--side: expected at least one side")
    if len({s.label for s in sides}) != len(sides):
        raise ConfigError(f"--side: each side once, found {', '.join(s.label for s in sides)}")
    if steps < 1 or jobs < 1 or threads < 1 or not seeds:
        raise ConfigError("--steps, --jobs, --threads: expected >= 1; --seeds: at least one")
    for s in sides:  # fail before any process starts
        run_spec(goal, s, seeds[0], steps, threads, horizon)
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    out = Path(out) if out is not None else default_out(goal)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    every = milestone or max(steps // 10, 1)
    marks = milestones(steps, every)
    order = [(s, seed) for i, seed in enumerate(seeds) for s in (sides if i % 2 == 0 else sides[::-1])]
    runs = [_Run(s, seed, out / "runs" / f"{run_key(s, seed)}.json", out / "runs" / f"{run_key(s, seed)}.log")
            for s, seed in order]
    title = f"{goal}: {' vs '.join(s.label for s in sides)}, {steps:,} env steps, seeds {', '.join(map(str, seeds))}"
    header = {"benchmark": "curves", "goal": goal, "sides": [s.label for s in sides], "seeds": seeds, "steps": steps,
              "threads": threads, "jobs": jobs, "window": window, "schedule_horizon": horizon, "milestone": every,
              "device": "cpu",
              "started_at": datetime.now(UTC).isoformat(), "machine": _machine()}

    def document(complete: bool) -> dict:
        for r in runs:
            r.refresh()
        reached = min((r.steps() for r in runs if r.record), default=0)  # runs never started do not hold it back
        return {**header, "updated_at": datetime.now(UTC).isoformat(), "complete": complete,
                "judged_at": steps if complete else reached,
                "load_average_1m_now": os.getloadavg()[0],
                "runs": [{**(r.record or {"side": r.side.label, "seed": r.seed, "steps": 0, "episode_steps": [],
                                          "returns": []}), "status": r.status} for r in runs],
                "summary": summarize(runs, sides, marks, window, upto=None if complete else reached)}

    def flush(complete: bool = False) -> dict:
        doc = document(complete)
        _write_json(out / "curves.json", doc)
        if any(r.record and r.record.get("returns") for r in runs):
            plot(runs, sides, out / "curves.png", title, window)
        return doc

    # SIGINT (Ctrl-C, to this process or its group) and SIGTERM only count here; the loop acts on them
    # at its next poll (no exception mid-launch). Installed whatever this process inherited (a shell
    # without job control starts background commands with SIGINT ignored).
    signals = [0]

    def on_signal(signum: int, frame: Any) -> None:
        signals[0] += 1

    old_handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    shown: set[int] = set()
    handled = 0
    last_term = 0.0
    console.print(f"[bold]{title}[/]: {len(runs)} runs, {jobs} at a time, {threads} torch thread(s) each; "
                  f"writing {out}/curves.json; a table every {every:,} env steps once every run has passed it")
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                   TextColumn("run time"), TimeElapsedColumn(), console=console)
    tasks = {r.key: bar.add_task(r.key, total=steps, info="pending", start=False) for r in runs}
    last_flush = time.monotonic()
    try:
        with bar:
            pending = list(runs)
            while True:
                if signals[0] > handled:
                    if handled == 0:
                        console.print("[yellow]interrupted: stopping every run at its next update, starting no "
                                      "queued run (Ctrl-C again to kill the runs)[/]")
                        for r in pending:
                            r.status = "not run"
                            bar.update(tasks[r.key], info="not run")
                        pending.clear()
                    if signals[0] >= 2:
                        for r in runs:
                            if r.status == "running" and r.proc is not None:
                                r.proc.kill()
                                r.killed = True
                    handled = signals[0]
                if handled and time.monotonic() - last_term >= TERM_EVERY_S:
                    # Again every few seconds: a worker still importing when the first came had no handler yet.
                    last_term = time.monotonic()
                    for r in runs:
                        if r.status == "running" and r.proc is not None and r.proc.poll() is None:
                            r.proc.send_signal(signal.SIGTERM)
                while pending and sum(r.status == "running" for r in runs) < jobs:
                    r = pending.pop(0)
                    args = json.dumps({"goal": goal, "side": r.side.label, "seed": r.seed, "steps": steps,
                                       "threads": threads, "out": str(r.path), "parent_pid": os.getpid(),
                                       "horizon": horizon})
                    with open(r.log, "w") as logf:
                        r.proc = subprocess.Popen([sys.executable, "-m", "gradlab.benchmarks.curves", args],
                                                  stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                  env={**os.environ, "PYTHONWARNINGS": "ignore"})
                    r.status = "running"
                    bar.start_task(tasks[r.key])
                for r in runs:
                    if r.status != "running":
                        continue
                    r.refresh()
                    code = r.proc.poll() if r.proc is not None else None
                    if code is not None:
                        r.refresh()
                        if r.killed:
                            r.status = "killed"
                        else:
                            r.status = (r.record or {}).get("status", "failed") if code == 0 else "failed"
                        if r.status == "failed":
                            tail = r.log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                            console.print(f"[red]{r.key} failed (exit {code})[/]: {tail[0]} (log: {r.log})")
                        bar.stop_task(tasks[r.key])
                        flush()
                        last_flush = time.monotonic()
                    rec = r.record or {}
                    info = f"{rec.get('steps_per_s', 0):,.0f} steps/s, {len(rec.get('returns', []))} episodes"
                    if rec.get("returns"):
                        info += f", mean {r.curve().at(r.steps(), window):.2f}"
                    bar.update(tasks[r.key], completed=r.steps(), info=info if r.status == "running" else r.status)
                reached = min(r.steps() if r.status in ("running", "pending") else steps for r in runs)
                new = [m for m in marks if m <= reached and m not in shown and m != steps]
                if new and not handled:
                    shown.update(new)
                    console.print(render_table(summarize(runs, sides, marks, window, upto=max(new)), sides,
                                               f"{title}: up to {max(new):,} steps"))
                if all(r.status not in ("running", "pending") for r in runs):
                    break
                if time.monotonic() - last_flush >= flush_s:
                    flush()
                    last_flush = time.monotonic()
                time.sleep(0.5)
    finally:
        for sig, old in old_handlers.items():
            signal.signal(sig, old)
    complete = all(r.status == "done" for r in runs)
    if not complete:
        for r in runs:
            r.refresh()
        judged = min((r.steps() for r in runs if r.record), default=0)
        title += f" ({'interrupted' if handled else 'incomplete'}: judged at {judged:,} env steps)"
    doc = flush(complete=complete)
    console.print(render_table(doc["summary"], sides, f"{title}: final"))
    for r in runs:
        rec = r.record or {}
        check = rec.get("outbox_check") or {}
        console.print(f"{r.key}: {r.status}, {r.steps():,} steps, {len(rec.get('returns', []))} episodes, "
                      f"{_fmt(rec.get('seconds'), '.0f')} s ({_fmt(rec.get('stalled_s'), '.0f')} s stalled), "
                      f"{_fmt(rec.get('steps_per_s'), ',.0f')} steps/s"
                      + ("" if check.get("match", True) else " [red]episode log disagrees with the outbox[/]"))
    for v in doc["summary"]["verdicts"].values():
        console.print(v["text"])
    console.print(f"wrote {out / 'curves.json'} and {out / 'curves.png'}")
    if handled:
        counts = {st: sum(r.status == st for r in runs) for st in ("done", "stopped", "killed", "not run")}
        console.print(f"[yellow]interrupted[/]: {', '.join(f'{n} {st}' for st, n in counts.items() if n)}; the "
                      f"comparison is judged at {doc['judged_at']:,} env steps, the step every started run reached")
        raise KeyboardInterrupt
    failed = [r.key for r in runs if r.status == "failed"]
    if failed:
        raise RuntimeError(f"runs failed: {', '.join(failed)} (logs in {out / 'runs'})")
    return doc


if __name__ == "__main__":  # one run: python -m gradlab.benchmarks.curves '{"goal": ..., "side": ..., ...}'
    import logging

    signal.signal(signal.SIGTERM, _early_stop)
    signal.signal(signal.SIGINT, _early_stop)
    logging.basicConfig(level=logging.WARNING)
    _a = json.loads(sys.argv[1])
    worker(_a["goal"], Side.parse(_a["side"]), int(_a["seed"]), int(_a["steps"]), int(_a["threads"]), Path(_a["out"]),
           int(_a["parent_pid"]), _a["horizon"])
