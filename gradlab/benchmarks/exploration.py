"""``gradlab benchmark exploration``: agent steps a Go-Explore run needs to a score, against random actions.

Issue 24's Montezuma's Revenge check (a benchmark, not CI): how many agent steps Go-Explore
(``gradlab.go_explore``, docs/ARCHITECTURE.md section 12a) takes until its best retained trajectory
scores at least ``--score`` (100: the first key), and what random exploration scores in the same
number of steps.

Per seed, one worker process (``python -m gradlab.benchmarks.exploration '{json}'``, ``--jobs`` at
a time) does two phases:

1. **search**: the goal's search recipe (``--recipe``, default ``go-explore``) through gradlab's own
   learner (:func:`gradlab.learn.learner.run_learner`: outbox, metric checks, device cpu) for at
   most ``--steps`` agent steps (default: the recipe's ``train.timesteps``). A watcher thread reads
   the learner's outbox as it is written: every rollout's ``train/algorithm/go_explore/best/return``
   (the shaped return of the best retained trajectory from reset; the task program's reward, which
   for Montezuma's Revenge, unclipped, is the game score) and ``.../archive/cell_count``. At the first
   rollout whose best return reaches ``--score`` it records that rollout's step (``reached_step``:
   resolution one rollout, ``n_steps`` x lanes agent steps) and asks the learner to stop through the
   outbox's stop request (the supervisor's own mechanism); the learner obeys at the update after it
   reads it (the watcher reads every :data:`WATCH_S`, so a run of short rollouts may go on a few
   rollouts past ``reached_step``; ``final_step`` says where it ended). The budget is whole
   rollouts: ``--steps`` rounded up to the next multiple of ``n_steps`` x lanes.
2. **random**: the same goal's training lanes (the same provider, preprocessing, sticky actions and
   seed) stepped from reset with uniformly random actions (numpy's PCG64 seeded by the seed) for
   ``reached_step`` agent steps, or the search's whole budget when it never reached the score.
   Per lane the running shaped return of its episode (reset at each episode end); the phase
   records the best running return seen, the step it was first reached, the first step any episode
   reached ``--score`` (``None``: never), and the episodes finished.

Agent steps are lane steps (one action; 4 emulator frames under ALE v5's frame skip).

Outputs in ``--out`` (default ``$GRADLAB_HOME/benchmarks/exploration-<goal>-<UTC time>``):
``exploration.json`` (the settings, the machine and load average, and per seed both phases:
status, steps, seconds, ``reached_step``, the best-return series ``[[step, best], ...]`` per
phase, cells), rewritten every :data:`FLUSH_S` seconds while the runs go on and at the end (a
worker that died is marked ``killed`` with its exit code); ``exploration.png``: best score against agent steps per
seed and phase, with the ``--score`` line; ``runs/s<seed>.json`` and ``.log`` per worker. A table
at the end. Ctrl-C stops the workers (the learner at its next update) and writes what was recorded.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gradlab.benchmarks.curve_worker import write_json
from gradlab.errors import ConfigError

POLL_S = 1.0
"""Seconds between the command's polls of its workers' records."""
WATCH_S = 0.25
"""Seconds between the watcher's reads of the learner's outbox."""
FLUSH_S = 5.0
"""Seconds between a worker's rewrites of its record."""


def metric_names(backend_id: str) -> tuple[str, str]:
    """The best-return and cell-count metrics of search backend ``backend_id`` (METRICS.md).

    Raises:
        ConfigError: not a search backend this benchmark knows (``gradlab.go_explore``, ``gradlab.jerk``).
    """
    if backend_id == "gradlab.go_explore":
        return "train/algorithm/go_explore/best/return", "train/algorithm/go_explore/archive/cell_count"
    if backend_id == "gradlab.jerk":
        return "train/algorithm/jerk/best/return_mean", "train/algorithm/jerk/retained/count"
    raise ConfigError(f"--recipe: expected a search recipe (train.backend.id gradlab.go_explore or gradlab.jerk), "
                      f"found {backend_id!r}")


def search_spec(goal: str, recipe: str, seed: int, steps: int | None) -> Any:
    """The run spec of the search phase: ``GOAL/RECIPE``, device cpu, at least ``steps`` timesteps
    (default the recipe's), one checkpoint at the end.

    Raises:
        NotFound: an unknown goal or recipe. ConfigError: not a search recipe, or an override it rejects.
    """
    from gradlab.contracts.experiments import Experiments
    from gradlab.contracts.run_spec import RunSpec

    exp = Experiments()
    ref = f"{goal}/{recipe}"
    resolved = exp.resolve(ref, ["train.device=cpu"])
    budget = steps or resolved.recipe.train.timesteps
    resolved = exp.resolve(ref, ["train.device=cpu", f"train.timesteps={max(budget, resolved.recipe.train.timesteps)}",
                                 f"train.checkpoint_freq={budget}"])
    metric_names(resolved.recipe.train.backend.id)
    return RunSpec.from_resolved(resolved, seed=seed)


class _Record:
    """A worker's JSON record (``runs/s<seed>.json``), rewritten at most every :data:`FLUSH_S` seconds."""

    def __init__(self, path: Path, doc: dict):
        self.path, self.doc, self._last, self._lock = path, doc, 0.0, threading.Lock()

    def flush(self, force: bool = False) -> None:
        with self._lock:
            now = time.monotonic()
            if force or now - self._last >= FLUSH_S:
                self._last = now
                write_json(self.path, self.doc)


def _search(spec: Any, score: float, budget: int, record: _Record, parent_pid: int) -> dict:
    """Phase 1 (module docstring): the search run, stopped through its outbox once it reaches ``score``."""
    import tempfile

    from gradlab.learn.learner import OUTBOX_FILE, run_learner
    from gradlab.outbox import Outbox

    best_name, cells_name = metric_names(spec.recipe.train.backend.id)
    phase = record.doc["search"] = {"status": "running", "steps": 0, "series": [], "cells": [], "reached_step": None,
                                    "metric": best_name}
    t0 = time.monotonic()
    finished = threading.Event()

    def drain(outbox: Any, after: int) -> int:
        for event in outbox.read(after, limit=100_000, kind="metrics"):
            after = event.event_seq
            m = event.payload.get("metrics", {})
            if best_name not in m:
                continue
            step, best = int(event.step), float(m[best_name])
            phase["steps"], phase["seconds"] = step, time.monotonic() - t0
            phase["series"].append([step, best])
            if cells_name in m:
                phase["cells"].append([step, float(m[cells_name])])
            if phase["reached_step"] is None and best >= score:
                phase["reached_step"] = step
                outbox.request_stop(f"benchmark exploration: best return {best:g} >= {score:g}")
        return after

    def watch(path: Path) -> None:
        after, outbox = 0, None
        while not finished.is_set():
            if outbox is None and path.exists():
                outbox = Outbox(path)
            if outbox is not None:
                after = drain(outbox, after)
                record.flush()
            finished.wait(WATCH_S)
        # The last read, after the learner ended: it may have written all of a short run between two reads.
        if outbox is None and path.exists():
            outbox = Outbox(path)
        if outbox is not None:
            drain(outbox, after)
            outbox.close()

    with tempfile.TemporaryDirectory(prefix="gradlab-exploration-") as tmp:
        run_dir = Path(tmp) / "run"
        watcher = threading.Thread(target=watch, args=(run_dir / OUTBOX_FILE,), daemon=True, name="exploration-watch")
        watcher.start()
        try:
            result = run_learner(spec, run_dir, stop_at_step=budget, watch_parent=True, parent_pid=parent_pid)
        finally:
            finished.set()
            watcher.join()
    stopped = result.stop_reason in ("sigterm", "supervisor_lost")
    phase.update(status="stopped" if stopped else "done", seconds=time.monotonic() - t0,
                 final_step=result.final_step, stop_reason=result.stop_reason)
    record.flush(force=True)
    return phase


def _random(spec: Any, steps: int, score: float, record: _Record, stop: threading.Event) -> dict:
    """Phase 2 (module docstring): uniformly random actions on the goal's training lanes for ``steps`` agent steps."""
    import numpy as np

    from gradlab.envs import make_vector_env

    phase = record.doc["random"] = {"status": "running", "steps": 0, "series": [], "best": None, "best_step": None,
                                    "reached_step": None, "episodes": 0, "budget": steps}
    rng = np.random.Generator(np.random.PCG64(spec.seed))
    venv = make_vector_env(spec.environment, seed=spec.seed)
    t0 = time.monotonic()
    try:
        venv.reset()
        n = venv.num_envs
        space = venv.single_action_space
        running = np.zeros(n, dtype=np.float64)
        best, done = float("-inf"), 0
        while done < steps and not stop.is_set():
            res = venv.step(rng.integers(0, space.n, size=n))
            done += n
            running += np.asarray(res.reward, dtype=np.float64)
            top = float(running.max())
            if top > best:
                best = top
                phase.update(best=best, best_step=done)
                phase["series"].append([done, best])
            if phase["reached_step"] is None and top >= score:
                phase["reached_step"] = done
            ended = np.asarray(res.terminated) | np.asarray(res.truncated)
            phase["episodes"] += int(ended.sum())
            running[ended] = 0.0
            phase["steps"], phase["seconds"] = done, time.monotonic() - t0
            record.flush()
    finally:
        venv.close()
    phase["series"].append([phase["steps"], phase["best"]])
    phase.update(status="done" if phase["steps"] >= steps else "stopped", seconds=time.monotonic() - t0)
    record.flush(force=True)
    return phase


_EARLY_STOP = threading.Event()
"""Set by the worker's SIGTERM/SIGINT handler outside the learner (before it starts, and in the random phase)."""


def worker(goal: str, recipe: str, seed: int, steps: int | None, score: float, out: Path, parent_pid: int) -> dict:
    """Both phases for one seed, keeping ``out`` (its JSON record) current; returns the record."""
    spec = search_spec(goal, recipe, seed, steps)
    budget = steps or spec.recipe.train.timesteps
    record = _Record(out, {"seed": seed, "goal": goal, "recipe": recipe, "budget": budget, "score": score,
                           "backend": spec.recipe.train.backend.id, "lanes": spec.environment.n_envs,
                           "pid": os.getpid()})
    record.flush(force=True)
    if _EARLY_STOP.is_set():  # SIGTERM/SIGINT before the learner's own handler was in place
        record.doc["status"] = "stopped"
        record.flush(force=True)
        return record.doc
    search = _search(spec, score, budget, record, parent_pid)
    signal.signal(signal.SIGTERM, lambda *_: _EARLY_STOP.set())
    signal.signal(signal.SIGINT, lambda *_: _EARLY_STOP.set())
    if search["status"] == "stopped" or _EARLY_STOP.is_set():
        record.doc["status"] = "stopped"
        record.flush(force=True)
        return record.doc
    stop = _EARLY_STOP
    _random(spec, search["reached_step"] or search["final_step"], score, record, stop)
    record.doc["status"] = "stopped" if stop.is_set() else "done"
    record.flush(force=True)
    return record.doc


# -- the command -------------------------------------------------------------------------------

def default_out(goal: str) -> Path:
    from gradlab.settings import load_settings

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return load_settings().home / "benchmarks" / f"exploration-{goal.replace('/', '+')}-{stamp}"


def plot(runs: list[dict], path: Path, title: str, score: float) -> None:
    """Best score against agent steps, per seed: the search's as a solid step line, random's dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, r in enumerate(runs):
        color = f"C{i}"
        for phase, style, name in (("search", "-", r.get("recipe", "search")), ("random", "--", "random actions")):
            series = (r.get(phase) or {}).get("series") or []
            if series:
                xs, ys = zip(*series, strict=True)
                ax.step(xs, ys, style, where="post", color=color, label=f"seed {r['seed']}: {name}")
    ax.axhline(score, color="grey", lw=0.8, ls=":", label=f"score {score:g}")
    ax.set_xlabel("agent steps")
    ax.set_ylabel("best score (shaped return from reset)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:,}" if isinstance(v, int) else f"{v:,.1f}"


def table(runs: list[dict], score: float, recipe: str) -> Any:
    from rich.table import Table

    t = Table("seed", f"{recipe}: steps to score >= {score:g}", "archive then", f"{recipe} best",
              "random: steps", "random best", "random first >= score", "random episodes", "seconds")
    for r in runs:
        s, rnd = r.get("search") or {}, r.get("random") or {}
        at = s.get("reached_step")
        cells = [c for step, c in s.get("cells") or [] if at is None or step <= at]
        best = s["series"][-1][1] if s.get("series") else None
        ran = s.get("final_step", s.get("steps"))
        reached = _fmt(at) if at is not None else f"not in {_fmt(ran)}" if s.get("status") == "done" else \
            f"{s.get('status', r.get('status', '-'))} at {_fmt(ran)}"
        t.add_row(str(r["seed"]), reached,
                  _fmt(int(cells[-1]) if cells else None),
                  _fmt(best), _fmt(rnd.get("steps")), _fmt(rnd.get("best")), _fmt(rnd.get("reached_step")),
                  _fmt(rnd.get("episodes")), _fmt((s.get("seconds") or 0.0) + (rnd.get("seconds") or 0.0)))
    return t


def run(goal: str = "MontezumaRevenge-Atari2600-v0", recipe: str = "go-explore", seeds: list[int] = (0, 1),
        steps: int | None = None, score: float = 100.0, jobs: int = 1, out: Path | None = None,
        console: Any = None) -> dict:
    """Both phases on every seed (module docstring); prints a table, writes ``exploration.json`` and ``.png``.

    Returns:
        The final JSON document.

    Raises:
        ConfigError / NotFound: bad arguments or recipe (before anything starts).
        RuntimeError: a worker failed (after the others ended and the files were written).
        KeyboardInterrupt: after Ctrl-C or SIGTERM, once the workers ended and the files were written.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from gradlab.benchmarks import make_out

    seeds = list(seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds: expected each seed once, at least one, found {seeds}")
    if jobs < 1 or (steps is not None and steps < 1):
        raise ConfigError(f"--jobs, --steps: expected >= 1, found {jobs} and {steps}")
    if not math.isfinite(score):
        raise ConfigError(f"--score: expected a finite number, found {score}")
    spec = search_spec(goal, recipe, seeds[0], steps)  # fails before any process starts
    budget = steps or spec.recipe.train.timesteps
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    out = make_out(Path(out) if out is not None else default_out(goal))
    header = {"benchmark": "exploration", "goal": goal, "recipe": recipe, "backend": spec.recipe.train.backend.id,
              "seeds": seeds, "budget": budget, "score": score, "jobs": jobs, "device": "cpu",
              "started_at": datetime.now(UTC).isoformat(),
              "machine": {"cpus": os.cpu_count(), "load_average_1m": os.getloadavg()[0]}}
    title = f"{goal}/{recipe}: agent steps to score >= {score:g} vs random actions, seeds {', '.join(map(str, seeds))}"
    procs: dict[int, subprocess.Popen] = {}
    paths = {seed: out / "runs" / f"s{seed}.json" for seed in seeds}

    def records() -> list[dict]:
        docs = []
        for seed in seeds:
            try:
                doc = json.loads(paths[seed].read_text())
            except (FileNotFoundError, json.JSONDecodeError):  # not started, or between atomic writes
                doc = {"seed": seed, "status": "not run" if seed not in procs else "starting"}
            code = procs[seed].poll() if seed in procs else None
            if code not in (None, 0):  # the worker died (SIGKILL, a crash): its record says so
                doc = {**doc, "status": "killed" if code < 0 else "failed", "exit_code": code}
            docs.append(doc)
        return docs

    def flush(complete: bool) -> dict:
        docs = records()
        doc = {**header, "updated_at": datetime.now(UTC).isoformat(), "complete": complete,
               "load_average_1m_now": os.getloadavg()[0], "runs": docs}
        write_json(out / "exploration.json", doc)
        plot(docs, out / "exploration.png", title, score)
        return doc

    interrupted = [0]
    old = {sig: signal.signal(sig, lambda *_: interrupted.__setitem__(0, interrupted[0] + 1))
           for sig in (signal.SIGINT, signal.SIGTERM)}
    console.print(f"[bold]{title}[/]: budget {budget:,} agent steps per seed, {jobs} seed(s) at a time; writing {out}")
    failed = []
    last_flush = time.monotonic()
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console) as bar:
            tasks = {seed: bar.add_task(f"seed {seed}", total=budget, info="pending", start=False) for seed in seeds}
            pending = list(seeds)
            while pending or any(p.poll() is None for p in procs.values()):
                if interrupted[0]:
                    pending.clear()
                    for p in procs.values():
                        if p.poll() is None:
                            p.send_signal(signal.SIGTERM if interrupted[0] == 1 else signal.SIGKILL)
                while pending and sum(p.poll() is None for p in procs.values()) < jobs:
                    seed = pending.pop(0)
                    args = json.dumps({"goal": goal, "recipe": recipe, "seed": seed, "steps": steps, "score": score,
                                       "out": str(paths[seed]), "parent_pid": os.getpid()})
                    with open(out / "runs" / f"s{seed}.log", "w") as log:
                        procs[seed] = subprocess.Popen([sys.executable, "-m", "gradlab.benchmarks.exploration", args],
                                                       stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                    bar.start_task(tasks[seed])
                for r in records():
                    s, rnd = r.get("search") or {}, r.get("random") or {}
                    if rnd:
                        bar.update(tasks[r["seed"]], total=max(rnd.get("budget") or 1, 1), completed=rnd.get("steps", 0),
                                   info=f"random actions, best {_fmt(rnd.get('best'))}")
                    elif s:
                        best = s["series"][-1][1] if s.get("series") else None
                        bar.update(tasks[r["seed"]], completed=s.get("steps", 0), info=f"search, best {_fmt(best)}")
                if time.monotonic() - last_flush >= FLUSH_S:
                    last_flush = time.monotonic()
                    flush(complete=False)
                time.sleep(POLL_S)
        for seed, p in procs.items():
            if p.returncode not in (0, None) and not interrupted[0]:
                failed.append(f"seed {seed} exited {p.returncode} (log: {out / 'runs' / f's{seed}.log'})")
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        doc = flush(complete=not interrupted[0] and not failed)
    console.print(table(doc["runs"], score, recipe))
    console.print(f"wrote {out / 'exploration.json'} and {out / 'exploration.png'} "
                  f"(load average now {doc['load_average_1m_now']:.2f})")
    if failed:
        raise RuntimeError("; ".join(failed))
    if interrupted[0]:
        raise KeyboardInterrupt
    return doc


if __name__ == "__main__":  # one seed: python -m gradlab.benchmarks.exploration '{"goal": ..., "seed": ..., ...}'
    import logging

    signal.signal(signal.SIGTERM, lambda *_: _EARLY_STOP.set())
    signal.signal(signal.SIGINT, lambda *_: _EARLY_STOP.set())
    logging.basicConfig(level=logging.WARNING)
    _a = json.loads(sys.argv[1])
    worker(_a["goal"], _a["recipe"], int(_a["seed"]), _a["steps"], float(_a["score"]), Path(_a["out"]),
           int(_a["parent_pid"]))
