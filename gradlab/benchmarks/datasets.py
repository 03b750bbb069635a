"""``gradlab benchmark datasets``: recording throughput against the bare evaluation of the same episodes.

Both sides run the same episodes (a goal's evaluation manifest for N episodes, one chunk, the
random policy, frames off) in this process, each timed from building the chunk's manifest on (so
the manifest, the environment's validation and the env construction are in both; imports in neither):
the bare side is :func:`gradlab.evaluation.runner.run_episodes` without an observer; the
recording side is :func:`gradlab.datasets.record.record_chunk` (the same loop with the recorder,
plus writing the chunk's one step shard, hashing it, and its ``chunk.json``). The fastest of ``rounds`` counts; the goal
of issue 23 is a ratio (recording episodes/s over bare episodes/s) of at least 0.8.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

TARGET_RATIO = 0.8


def bare(plan) -> float:
    """Seconds to run the plan's one chunk without recording."""
    from gradlab.contracts.environment import EnvironmentSpec
    from gradlab.datasets.plan import make_policy
    from gradlab.datasets.record import chunk_manifest
    from gradlab.envs import make_vector_env
    from gradlab.evaluation.runner import policy_rng, run_episodes

    # Timed from the same point as record_chunk: the evaluation builds its manifest and validates its
    # environment too.
    start = time.perf_counter()
    manifest = chunk_manifest(plan, 0)
    environment = EnvironmentSpec.model_validate(plan.environment)
    venv = make_vector_env(environment.model_copy(update={"n_envs": manifest.n_lanes}), seed=plan.base_seed,
                           lane_seeds=[q[0].seed for q in manifest.lane_queues()])
    try:
        run_episodes(venv, manifest, make_policy(plan, venv.single_action_space), deterministic=True,
                     rng=policy_rng(manifest))
    finally:
        venv.close()
    return time.perf_counter() - start


def recorded(plan) -> float:
    from gradlab.datasets.record import record_chunk

    start = time.perf_counter()
    record_chunk(plan, 0)
    return time.perf_counter() - start


def run(goal: str, episodes: int, rounds: int) -> dict:
    from gradlab.datasets.plan import plan_recording

    with tempfile.TemporaryDirectory(prefix="gradlab-bench-datasets-") as tmp:
        times: dict[str, list[float]] = {"bare evaluation": [], "recording": []}
        for r in range(rounds):
            plan = plan_recording(f"bench-{r}", goal_id=goal, policy="random", episodes=episodes, frames=False,
                                  chunk_episodes=episodes)
            plan = plan.model_copy(update={"staging_dir": str(Path(tmp) / plan.recording_id)})
            for side, fn in ((("bare evaluation", bare), ("recording", recorded)) if r % 2 == 0
                             else (("recording", recorded), ("bare evaluation", bare))):
                times[side].append(fn(plan))
    best = {k: min(v) for k, v in times.items()}
    return {"goal": goal, "episodes": episodes, "rounds": rounds, "seconds": best,
            "episodes_per_s": {k: episodes / v for k, v in best.items()},
            "ratio": best["bare evaluation"] / best["recording"], "target": TARGET_RATIO}


def main(goals: tuple[str, ...], episodes: int, rounds: int, as_json: bool) -> None:
    import os

    load_before = os.getloadavg()[0]
    rows = [run(g, episodes, rounds) for g in goals]
    load_after = os.getloadavg()[0]
    for row in rows:
        row["load_average_1m"] = {"before": load_before, "after": load_after}
    if as_json:
        print(json.dumps(rows))
        return
    from rich.table import Table

    from gradlab.console import console

    table = Table("goal", "episodes", "bare eps/s", "recording eps/s", "ratio", f">= {TARGET_RATIO}",
                  title=f"dataset recording vs bare evaluation (fastest of {rounds}, frames off, random policy)")
    for row in rows:
        eps = row["episodes_per_s"]
        table.add_row(row["goal"], str(row["episodes"]), f"{eps['bare evaluation']:.1f}", f"{eps['recording']:.1f}",
                      f"{row['ratio']:.2f}", "yes" if row["ratio"] >= TARGET_RATIO else "no")
    console.print(table)
    console.print(f"1-minute load average: {load_before:.2f} before, {load_after:.2f} after, on {os.cpu_count()} cores "
                  "(other processes' load lowers both sides; rerun on a quiet machine)", highlight=False)
