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
process (:mod:`gradlab.benchmarks.curve_worker`; sides and run specs: :mod:`gradlab.benchmarks.curve_sides`),
``--jobs`` processes at a time. The learner's vector env is wrapped by
:class:`~gradlab.benchmarks.curve_worker.EpisodeLog`, which records each training episode's env step
(lane steps so far, as the learner's ``num_timesteps``) and raw return (the provider's native score
summed over the episode, before the task program's reward clipping: the game score). At the end of a run the recorded
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
most :data:`~gradlab.benchmarks.curve_worker.WORKER_FLUSH_S` old). ``complete`` is true only when
every run trained its budget (status ``done``).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gradlab.benchmarks.curve_sides import Side, run_key, run_spec
from gradlab.benchmarks.curve_stats import WINDOW, Curve, compare_area, compare_at, milestones, verdict
from gradlab.benchmarks.curve_worker import write_json
from gradlab.errors import ConfigError

TERM_EVERY_S = 2.0
"""Seconds between the SIGTERMs an interrupted command sends each run still in flight."""


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
    return load_settings().home / "benchmarks" / f"curves-{goal.replace('/', '+')}-{stamp}"


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
    trained: dict[tuple[str, str, str], str] = {}
    for s in sides:  # fail before any process starts
        spec = run_spec(goal, s, seeds[0], steps, threads, horizon)
        same = trained.setdefault((f"{spec.goal_id}/{spec.recipe_id}", s.backend, s.precision), s.label)
        if same != s.label:
            raise ConfigError(f"--side: {same} and {s.label} train the same recipe ({spec.goal_id}/{spec.recipe_id}) "
                              f"on the same backend and precision")
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    from gradlab.benchmarks import make_out

    out = make_out(Path(out) if out is not None else default_out(goal))
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
        write_json(out / "curves.json", doc)
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
                        r.proc = subprocess.Popen([sys.executable, "-m", "gradlab.benchmarks.curve_worker", args],
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
        left_out = f" (and {rec['archive_episodes']} begun from archived states, left out)" if rec.get("archive_episodes") else ""
        console.print(f"{r.key}: {r.status}, {r.steps():,} steps, {len(rec.get('returns', []))} episodes{left_out}, "
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
