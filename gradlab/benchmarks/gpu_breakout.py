"""gradlab.ppo on a GPU: Breakout with 64-256 lanes, bf16 + torch.compile, against the raw ALE vector env.

Ready to run on a machine with CUDA (not run here: no GPU was lent to the task that wrote it)::

    uv run python -m gradlab.benchmarks.gpu_breakout --lanes 64 128 256 --steps 262144

Per lane count it measures, in this process:

* ``raw``: ``ale_py.vector_env.AtariVectorEnv`` with the goal's settings stepped with random actions
  (the ceiling: what the emulators deliver on this machine's cores);
* ``gradlab.ppo``: the Breakout recipe (n_steps 128, 4 epochs, minibatch 256, Nature CNN) through
  gradlab's learner on ``cuda`` with ``precision: bf16`` and ``compile: true``, its steps/s after the
  first rollout (compilation excluded), and the GPU's utilisation sampled every 0.5 s by
  ``nvidia-smi`` while it trains.

The goal (issue 14): gradlab.ppo at >= 80% of the raw env's rate. Prints a rich table and writes the
rows as JSON to ``--out`` (default ``$OUT/gpu_breakout.json`` when ``$OUT`` is set).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np


def raw_ale_rate(n: int, seconds: float = 10.0) -> float:
    """Lane steps/s of ``AtariVectorEnv`` (Breakout, ALE v5, 84x84x4) with random actions."""
    from ale_py.vector_env import AtariVectorEnv

    env = AtariVectorEnv("breakout", n, repeat_action_probability=0.25, reward_clipping=False, use_fire_reset=False)
    env.reset(seed=0)
    acts = np.random.default_rng(0).integers(0, 4, size=(256, n))
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.step(acts[steps % 256])
        steps += 1
    rate = steps * n / (time.perf_counter() - t0)
    env.close()
    return rate


class GpuSampler:
    """``nvidia-smi --query-gpu=utilization.gpu,memory.used`` every ``interval`` seconds in a thread."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5)
                util, mem = out.stdout.strip().splitlines()[0].split(",")
                self.samples.append((float(util), float(mem)))
            except Exception:  # noqa: BLE001 - a missing sample is not a failure
                pass
            self._stop.wait(self.interval)

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def mean_util(self) -> float:
        return float(np.mean([u for u, _ in self.samples])) if self.samples else float("nan")

    def max_mem_mib(self) -> float:
        return float(max(m for _, m in self.samples)) if self.samples else float("nan")


def train_rate(n: int, steps: int, precision: str, compile_: bool) -> dict[str, Any]:
    """gradlab.ppo through the learner on cuda; steps/s after the first rollout (from the outbox)."""
    from gradlab.contracts.experiments import Experiments
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.learn.learner import OUTBOX_FILE, run_learner
    from gradlab.outbox import Outbox

    overrides = [f"train.timesteps={steps}", "train.backend.id=gradlab.ppo", "train.device=cuda",
                 f"train.environment.n_envs={n}", f"train.backend.config.precision={precision}",
                 f"train.backend.config.compile={'true' if compile_ else 'false'}",
                 f"train.checkpoint_freq={steps}"]
    spec = RunSpec.from_resolved(Experiments().resolve("Breakout-Atari2600-v0/ppo", overrides), seed=0)
    with tempfile.TemporaryDirectory(prefix="gradlab-gpu-") as tmp, GpuSampler() as gpu:
        t0 = time.perf_counter()
        run_learner(spec, Path(tmp) / "run", watch_parent=False)
        wall = time.perf_counter() - t0
        ob = Outbox(Path(tmp) / "run" / OUTBOX_FILE)
        rollouts = [e.payload["metrics"] for e in ob.read(kind="metrics", limit=1_000_000)
                    if "train/throughput/loop_fps" in e.payload["metrics"]]
        ob.close()
    later = rollouts[1:] or rollouts
    seconds = sum(m["train/throughput/rollout/seconds"] + m["train/throughput/update/seconds"] for m in later)
    trained = sum(n * spec.recipe.train.backend.config["n_steps"] for _ in later)
    return {"lanes": n, "precision": precision, "compile": compile_, "steps": steps, "wall_s": wall,
            "steps_per_s": trained / seconds if seconds else float("nan"),
            "rollout_s": sum(m["train/throughput/rollout/seconds"] for m in later),
            "update_s": sum(m["train/throughput/update/seconds"] for m in later),
            "gpu_util_pct": gpu.mean_util(), "gpu_mem_mib": gpu.max_mem_mib()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--steps", type=int, default=262144, help="Env steps per training run.")
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16-amp"])
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) / "gpu_breakout.json" if "OUT" in os.environ else None)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpu_breakout: no CUDA device visible to torch")
    rows = []
    for n in args.lanes:
        raw = raw_ale_rate(n)
        row = train_rate(n, args.steps, args.precision, not args.no_compile)
        row.update(raw_steps_per_s=raw, ratio_to_raw=row["steps_per_s"] / raw)
        rows.append(row)
        print(json.dumps(row), flush=True)
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"gradlab.ppo Breakout on {torch.cuda.get_device_name(0)} ({os.cpu_count()} CPUs)")
    for col in ("lanes", "precision", "compile", "steps/s", "raw ALE steps/s", "ratio", "GPU util %", "GPU MiB",
                "rollout s", "update s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["lanes"]), r["precision"], str(r["compile"]), f"{r['steps_per_s']:,.0f}",
                      f"{r['raw_steps_per_s']:,.0f}", f"{r['ratio_to_raw']:.2f}", f"{r['gpu_util_pct']:.0f}",
                      f"{r['gpu_mem_mib']:.0f}", f"{r['rollout_s']:.1f}", f"{r['update_s']:.1f}")
    Console().print(table)
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
