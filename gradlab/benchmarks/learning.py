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

Both backends draw their random streams alike (``gradlab.learn.ppo``), so with the same seed they
train the same run until floating-point rounding makes one sampled action differ: a seed's two
figures are then equal or differ by that divergence, not by another algorithm.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
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
        max_steps: int | None = None) -> list[SeedResult]:
    """Both backends on seeds 0..seeds-1, alternating which goes first."""
    out = []
    with tempfile.TemporaryDirectory(prefix="gradlab-learning-") as tmp:
        for seed in range(seeds):
            for backend in (BACKENDS if seed % 2 == 0 else BACKENDS[::-1]):
                out.append(steps_to_acceptance(ref, backend, seed, checkpoint_freq, Path(tmp), max_steps))
                if progress is not None:
                    progress()
    return out


def render(rows: list[SeedResult], ref: str, as_json: bool) -> None:
    medians = {b: statistics.median(r.steps_to_accept for r in rows if r.backend == b) for b in BACKENDS}
    if as_json:
        print(json.dumps({"ref": ref, "rows": [asdict(r) for r in rows], "median": medians}))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 200)
    table = Table(title=f"{ref}: env steps to the goal's acceptance (first accepted checkpoint)")
    for col in ("seed", *BACKENDS, "gradlab.ppo train s", "sb3.ppo train s"):
        table.add_column(col, justify="right")
    by = {(r.backend, r.seed): r for r in rows}
    for seed in sorted({r.seed for r in rows}):
        g, s = by[("gradlab.ppo", seed)], by[("sb3.ppo", seed)]
        table.add_row(str(seed), f"{s.steps_to_accept:,.0f}", f"{g.steps_to_accept:,.0f}", f"{g.train_seconds:.1f}",
                      f"{s.train_seconds:.1f}")
    table.add_row("median", f"{medians['sb3.ppo']:,.0f}", f"{medians['gradlab.ppo']:,.0f}", "", "")
    console.print(table)
    verdict = "holds" if medians["gradlab.ppo"] <= medians["sb3.ppo"] else "does not hold"
    console.print(f"learning parity (gradlab.ppo median <= sb3.ppo median): {verdict}")


def main(ref: str, seeds: int, checkpoint_freq: int, as_json: bool, max_steps: int | None = None) -> None:
    from rich.progress import Progress

    try:
        with Progress(transient=True, disable=as_json) as bar:
            task = bar.add_task("training and evaluating", total=seeds * len(BACKENDS))
            rows = run(ref, seeds, checkpoint_freq, progress=lambda: bar.advance(task), max_steps=max_steps)
    except KeyboardInterrupt as e:
        print(f"interrupted: {e or 'Ctrl-C'}; no figures", file=sys.stderr)
        raise SystemExit(130) from None
    render(rows, ref, as_json)
