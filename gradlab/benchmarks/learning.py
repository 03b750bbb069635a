"""``gradlab benchmark learning``: steps to the goal's acceptance, gradlab.ppo vs sb3.ppo, per seed.

Learning parity (issue 14): on CartPole-v1 with rl-zoo3's hyperparameters, ``gradlab.ppo`` must
reach the goal's acceptance in no more env steps than ``sb3.ppo``, by the median over 5 seeds.

Per seed and backend: train the recipe (``CartPole-v1/ppo`` with ``train.backend.id`` switched,
nothing else changed) through gradlab's learner with a checkpoint every ``checkpoint_freq`` steps,
then evaluate the checkpoints in step order with the goal's own protocol (100 deterministic
episodes, its acceptance rules, :func:`gradlab.evaluation.runner.run_evaluation`) until the first
accepted one. Its step is the seed's figure; a seed that never passes counts as ``inf``. The
checkpoint spacing bounds the resolution (8192 steps by default, against the goal's 16384).
``max_steps`` stops training there (the schedules keep the recipe's horizon) instead of training
the recipe's whole budget, which for the rl-zoo3 classic-control recipes is 1M steps.

Beside the medians it prints P(a gradlab.ppo seed accepts in fewer steps than an sb3.ppo seed), ties
counting half, with a 95% stratified-bootstrap interval (:func:`parity`): on a chaotic goal the
same-seed runs part after some updates, each seed is then a draw, and a median of 5 draws can differ
by a checkpoint interval or two where the two distributions do not. ``jobs`` trains that many
(seed, backend) pairs at a time in spawned processes (:func:`run`).

Both backends draw their random streams alike (``gradlab.learn.ppo``), so with the same seed they
train the same run until floating-point rounding makes one sampled action differ: a seed's two
figures are then equal or differ by that divergence, not by another algorithm.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import queue
import signal
import statistics
import sys
import tempfile
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BACKENDS = ("sb3.ppo", "gradlab.ppo")


@dataclass
class SeedResult:
    backend: str
    seed: int
    steps_to_accept: float
    evaluated: int
    best_return: float
    train_seconds: float


def steps_to_acceptance(ref: str, backend: str, seed: int, checkpoint_freq: int, work: Path,
                        max_steps: int | None = None) -> SeedResult:
    """Train ``ref`` with ``backend`` and ``seed`` (to ``max_steps`` when given); the first accepted
    checkpoint's step (``inf`` if none).

    Raises:
        KeyboardInterrupt: SIGTERM or Ctrl-C during the training (the learner stops at its next
            update and the benchmark with it, instead of going on to the next seed).
    """
    import time

    from gradlab.checkpoints.bundle import verify_checkpoint
    from gradlab.contracts.experiments import Experiments
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.evaluation.result import EvalRequest
    from gradlab.evaluation.runner import run_evaluation
    from gradlab.learn.learner import run_learner

    overrides = [f"train.backend.id={backend}", f"train.checkpoint_freq={checkpoint_freq}", "train.device=cpu"]
    if backend == "gradlab.ppo":
        overrides.append("train.backend.config.threads=1")
    spec = RunSpec.from_resolved(Experiments().resolve(ref, overrides), seed=seed)
    t0 = time.perf_counter()
    result = run_learner(spec, work / f"{backend}-{seed}", watch_parent=False, stop_at_step=max_steps)
    seconds = time.perf_counter() - t0
    if result.stop_reason == "sigterm":  # the learner took the signal for its run: it meant the benchmark
        raise KeyboardInterrupt(f"{backend} seed {seed} stopped by SIGTERM or Ctrl-C at step {result.final_step}")
    best = float("-inf")
    for n, path in enumerate(result.checkpoints, start=1):
        manifest = verify_checkpoint(Path(path))
        res = run_evaluation(EvalRequest(checkpoint_dir=str(path), checkpoint_sha256=manifest.sha256,
                                         checkpoint_step=manifest.step, spec=spec.to_json()))
        best = max(best, float(res.aggregates.get("eval/episode/return/mean", float("-inf"))))
        if res.accepted:
            return SeedResult(backend, seed, float(manifest.step), n, best, seconds)
    return SeedResult(backend, seed, float("inf"), len(result.checkpoints), best, seconds)


def run(ref: str = "CartPole-v1/ppo", seeds: int = 5, checkpoint_freq: int = 8192, progress: Any = None,
        max_steps: int | None = None, first_seed: int = 0, jobs: int = 1) -> list[SeedResult]:
    """Both backends on seeds ``first_seed .. first_seed + seeds - 1``, alternating which goes first.

    With ``jobs`` > 1, that many spawned processes take the (seed, backend) pairs in turn (steps to
    acceptance do not depend on the load; train seconds then do). A worker's learner gets SIGTERM
    when this process ends (``PR_SET_PDEATHSIG``), and on SIGTERM or Ctrl-C here every worker is
    stopped before the work folder is removed.

    Returns:
        One row per (seed, backend), in seed order, sb3.ppo first.

    Raises:
        KeyboardInterrupt: SIGTERM or Ctrl-C (here or in a worker's training).
        RuntimeError: a worker failed (its traceback in the message) or was killed.
        GradlabError: a worker's (bad input), with its message.
    """
    pairs = [(seed, backend) for seed in range(first_seed, first_seed + seeds)
             for backend in (BACKENDS if seed % 2 == 0 else BACKENDS[::-1])]
    previous = signal.signal(signal.SIGTERM, _on_term)  # between trainings too (the learner's is set in one)
    try:
        out = _run_in(pairs, ref, checkpoint_freq, max_steps, jobs, progress)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return sorted(out, key=lambda r: (r.seed, BACKENDS.index(r.backend)))


def _run_in(pairs: list[tuple[int, str]], ref: str, checkpoint_freq: int, max_steps: int | None, jobs: int,
            progress: Any) -> list[SeedResult]:
    """The pairs' rows, trained in a temporary work folder removed afterwards (also on an error)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="gradlab-learning-") as tmp:
        if jobs <= 1:
            for seed, backend in pairs:
                out.append(steps_to_acceptance(ref, backend, seed, checkpoint_freq, Path(tmp), max_steps))
                if progress is not None:
                    progress()
        else:
            out = _run_parallel(pairs, ref, checkpoint_freq, Path(tmp), max_steps, jobs, progress)
    return out


def _on_term(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    """SIGTERM outside a training (the learner takes it during one): an interruption, as Ctrl-C."""
    raise KeyboardInterrupt("stopped by SIGTERM or Ctrl-C")


def _worker(tasks: Any, results: Any, ref: str, checkpoint_freq: int, work: Path, max_steps: int | None,
            parent: int) -> None:  # pragma: no cover - runs in a spawned process
    from gradlab.errors import GradlabError
    from gradlab.learn.watch import die_with_parent

    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it sends SIGTERM
    try:
        die_with_parent(signal.SIGTERM, parent_pid=parent)  # a parent already gone: SIGTERM now
        while (task := tasks.get()) is not None:
            seed, backend = task
            results.put(("row", asdict(steps_to_acceptance(ref, backend, seed, checkpoint_freq, work, max_steps))))
    except KeyboardInterrupt as e:  # SIGTERM during a training
        results.put(("interrupted", str(e)))
    except GradlabError as e:  # bad input: its one line, as in one process
        results.put(("gradlab", str(e)))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        results.put(("error", traceback.format_exc()))


def _run_parallel(pairs: list[tuple[int, str]], ref: str, checkpoint_freq: int, work: Path,
                  max_steps: int | None, jobs: int, progress: Any) -> list[SeedResult]:
    from gradlab.errors import GradlabError

    ctx = mp.get_context("spawn")
    tasks, results = ctx.Queue(), ctx.Queue()
    jobs = min(jobs, len(pairs))
    for pair in pairs:
        tasks.put(pair)
    for _ in range(jobs):
        tasks.put(None)
    procs = [ctx.Process(target=_worker, args=(tasks, results, ref, checkpoint_freq, work, max_steps, os.getpid()),
                         daemon=True) for _ in range(jobs)]
    out: list[SeedResult] = []
    try:
        for p in procs:
            p.start()
        while len(out) < len(pairs):
            try:
                kind, payload = results.get(timeout=1.0)
            except queue.Empty:
                # A worker that ended without its answer (killed): stop now, not after the others' pairs.
                if dead := [p for p in procs if p.exitcode not in (None, 0)]:
                    left = len(pairs) - len(out)
                    raise RuntimeError(f"learning benchmark: worker pid {dead[0].pid} ended with exit code "
                                       f"{dead[0].exitcode} ({left} pair{'s' if left != 1 else ''} left)") from None
                if not any(p.is_alive() for p in procs):
                    raise RuntimeError("learning benchmark: every worker ended before the last pair") from None
                continue
            if kind == "interrupted":
                raise KeyboardInterrupt(payload)
            if kind == "gradlab":  # its one line, as app.main prints any gradlab error
                raise GradlabError(payload)
            if kind == "error":
                raise RuntimeError(f"learning benchmark: a worker failed:\n{payload}")
            out.append(SeedResult(**payload))
            if progress is not None:
                progress()
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()  # SIGTERM: a training stops at its next update
                os.kill(p.pid, signal.SIGCONT)  # a stopped worker takes it too
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
    return out


def parity(rows: list[SeedResult]) -> dict[str, Any]:
    """The parity figures of ``rows`` (both backends, one row per seed each).

    Returns:
        ``median``: {backend: median steps to acceptance (``inf`` when most seeds never passed)};
        ``ratio``: gradlab.ppo's median / sb3.ppo's (None unless both were accepted); ``holds``: the
        goal, gradlab.ppo's median <= sb3.ppo's (None when neither median seed was accepted);
        ``sooner``: {value, low, high, n, note}, P(a gradlab.ppo seed accepts in fewer steps than an
        sb3.ppo seed), ties counting half, with its 95% stratified-bootstrap interval
        (:func:`gradlab.results.stats.probability_of_improvement_estimate`: the Mann-Whitney U
        statistic over n m; Agarwal et al. 2021, sec. 4.3). A seed never accepted ranks after every
        accepted one. ``shown``: "none" when the interval contains 0.5
        (or is undefined: one seed), else the backend that accepts sooner.
    """
    from gradlab.results.stats import probability_of_improvement_estimate

    steps = {b: [r.steps_to_accept for r in rows if r.backend == b] for b in BACKENDS}
    medians = {b: statistics.median(v) for b, v in steps.items()}
    finite = [x for v in steps.values() for x in v if math.isfinite(x)]
    never = 2.0 * max(finite, default=1.0) + 1.0  # ranks after every accepted seed; only order matters
    ranked = {b: [-(x if math.isfinite(x) else never) for x in v] for b, v in steps.items()}  # higher = sooner
    sooner = probability_of_improvement_estimate(ranked["gradlab.ppo"], ranked["sb3.ppo"])
    g, s = medians["gradlab.ppo"], medians["sb3.ppo"]
    ratio = g / s if math.isfinite(g) and math.isfinite(s) and s > 0 else None
    shown = "none"
    if sooner.low is not None and sooner.low > 0.5:
        shown = "gradlab.ppo"
    elif sooner.high is not None and sooner.high < 0.5:
        shown = "sb3.ppo"
    holds = None if not math.isfinite(s) and not math.isfinite(g) else g <= s
    note = {"note": "one seed per side: no interval (--seeds 2 or more)"} if sooner.low is None else {}
    return {"median": medians, "ratio": ratio, "holds": holds, "sooner": {**sooner.as_json(), **note}, "shown": shown}


def render(rows: list[SeedResult], ref: str, as_json: bool, jobs: int = 1) -> None:
    figures = parity(rows)
    medians = figures["median"]
    first_only = all(r.evaluated == 1 and math.isfinite(r.steps_to_accept) for r in rows)
    if as_json:
        def strict(x: Any) -> Any:  # JSON has no infinity: a seed never accepted is null
            return None if isinstance(x, float) and not math.isfinite(x) else x

        print(json.dumps({"ref": ref, "rows": [{k: strict(v) for k, v in asdict(r).items()} for r in rows],
                          **figures, "median": {b: strict(v) for b, v in medians.items()},
                          "first_checkpoint_only": first_only}, allow_nan=False))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 200)
    table = Table(title=f"{ref}: env steps to the goal's acceptance (first accepted checkpoint)")
    for col in ("seed", *BACKENDS, *(f"{b} train s" for b in BACKENDS)):
        table.add_column(col, justify="right")
    by = {(r.backend, r.seed): r for r in rows}
    for seed in sorted({r.seed for r in rows}):
        cells = [by[(b, seed)] for b in BACKENDS]
        table.add_row(str(seed), *(f"{r.steps_to_accept:,.0f}" for r in cells), *(f"{r.train_seconds:.1f}" for r in cells))
    table.add_row("median", *(f"{medians[b]:,.0f}" for b in BACKENDS), "", "")
    console.print(table)
    if jobs > 1:
        console.print(f"train seconds: {jobs} trainings at a time, not a speed measurement")
    n = len(rows) // len(BACKENDS)
    seeds_n = f"{n} seed{'s' if n != 1 else ''}"
    if figures["holds"] is None:
        console.print(f"learning parity, gradlab.ppo's median <= sb3.ppo's over {seeds_n}: undecided (neither side's "
                      "median seed was accepted: train longer or check the goal's acceptance)")
    else:
        met = "met" if figures["holds"] else "not met"
        ratio = "" if figures["ratio"] is None else f"ratio of the medians {figures['ratio']:.2f}; "
        console.print(f"learning parity, gradlab.ppo's median <= sb3.ppo's over {seeds_n}: {met} "
                      f"({ratio}whether that is more than seed noise: below)")
    p = figures["sooner"]
    if p["low"] is None:
        console.print(f"P(a gradlab.ppo seed accepts in fewer steps than an sb3.ppo seed; ties half) = {p['value']:.2f}, "
                      "no interval with one seed per side (--seeds 2 or more): no difference can be shown")
    else:
        shown = {"none": "no difference shown (0.5 is inside the interval)", "gradlab.ppo": "gradlab.ppo accepts sooner",
                 "sb3.ppo": "sb3.ppo accepts sooner"}[figures["shown"]]
        console.print(f"P(a gradlab.ppo seed accepts in fewer steps than an sb3.ppo seed; ties half) = {p['value']:.2f}, "
                      f"95% interval [{p['low']:.2f}, {p['high']:.2f}] (stratified bootstrap over seeds): {shown}")
    if first_only:
        console.print("[yellow]every seed was accepted at its first checkpoint:[/] the figures are the checkpoint "
                      "spacing, not how fast either side learns (use a smaller --checkpoint-freq or a harder goal)")


def main(ref: str, seeds: int, checkpoint_freq: int, as_json: bool, max_steps: int | None = None,
         first_seed: int = 0, jobs: int = 1) -> None:
    from rich.progress import Progress

    from gradlab.contracts.experiments import Experiments
    from gradlab.errors import ConfigError

    resolved = Experiments().resolve(ref, [])  # an unknown goal or recipe: its one-line error before any training
    if (backend := resolved.recipe.train.backend.id) not in BACKENDS:
        raise ConfigError(f"{ref} trains {backend}: benchmark learning compares PPO recipes (backend "
                          f"{' or '.join(BACKENDS)}), whose backend it switches")
    total = seeds * len(BACKENDS)
    try:
        with Progress(transient=True, disable=as_json) as bar:
            task = bar.add_task("training and evaluating", total=total)

            def done() -> None:
                bar.advance(task)
                if not bar.console.is_terminal and not as_json:  # piped or logged: one line per trained pair
                    print(f"trained and evaluated {int(bar.tasks[0].completed)} of {total}", file=sys.stderr,
                          flush=True)

            rows = run(ref, seeds, checkpoint_freq, progress=done, max_steps=max_steps, first_seed=first_seed,
                       jobs=jobs)
    except KeyboardInterrupt as e:
        print(f"interrupted: {str(e) or 'Ctrl-C'}; no figures", file=sys.stderr)
        raise SystemExit(130) from None
    render(rows, ref, as_json, jobs)
