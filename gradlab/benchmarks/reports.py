"""``gradlab benchmark reports``: ``reports build`` and ``leaders runs`` over many synthetic runs.

The runs are written through the receipt models and the journal's own API into a temporary
``GRADLAB_HOME`` (file stores): per run a run record, an attempt, checkpoint publications'
inventory in a terminal receipt, evaluation records with results, a promotion for accepted ones,
and a metric journal of ``rollouts`` training events plus one evaluation event per checkpoint, as
a real run writes. Timed in this process (imports and the synthesis excluded), the fastest of
``rounds``: building the whole site, and ranking one goal's cohorts. Budgets (issue 12): the
build <= 10 s and leaders <= 1 s for 100 runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

GOALS = ("gradlab__bandit", "CartPole-v1")
RECIPES = ("ppo", "a2c", "ppo-small", "ppo-large", "ppo-long")
BUDGET_S = {"reports build": 10.0, "leaders runs": 1.0}


def synthesize(home: Path, runs: int = 100, rollouts: int = 200, checkpoints: int = 3, seed: int = 0,
               overrides: dict[int, list[str]] | None = None) -> list[str]:
    """Write ``runs`` sealed synthetic runs under ``home``; returns their run ids.

    Scores are drawn from a fixed ``numpy.random.Generator(seed)``; run i is goal ``GOALS[i % 2]``,
    recipe ``RECIPES[(i // 2) % 5]``, seed ``i // 10``, with the ``--set`` overrides
    ``overrides[i]`` (default none).
    """
    import numpy as np

    from gradlab.contracts.hashing import sha256_json
    from gradlab.metrics.journal import Journal
    from gradlab.receipts.io import dump_model
    from gradlab.receipts.models import (
        Attempt,
        EvaluationRecord,
        LearnerExit,
        Promotion,
        RunRecord,
        TerminalCheckpoint,
        TerminalEvaluation,
        TerminalMetrics,
        TerminalPromotion,
        TerminalReceipt,
        utcnow,
    )
    from gradlab.runs.paths import RunPaths
    from gradlab.settings import load_settings
    from gradlab.stores import keys, open_stores

    os.environ["GRADLAB_HOME"] = str(home)
    settings = load_settings()
    stores = open_stores(settings)
    rng = np.random.default_rng(seed)
    start = utcnow()
    ids = []
    for i in range(runs):
        run_id = f"gradlab-20260101T{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}-{i:08x}"
        goal, recipe, run_seed = GOALS[i % 2], RECIPES[(i // 2) % len(RECIPES)], i // 10
        skill = 0.5 + 0.1 * RECIPES.index(recipe) + 0.05 * rng.standard_normal()
        created = start + timedelta(seconds=i)
        stores.control.put_create_only(keys.run_record(run_id), dump_model(RunRecord(
            run_id=run_id, goal_id=goal, recipe_id=recipe, seed=run_seed, display_name=f"{goal}__{recipe}__s{run_seed}",
            overrides=list((overrides or {}).get(i, [])),
            goal_contract_sha256="0" * 64, recipe_sha256="0" * 64, environment_sha256="0" * 64, spec_sha256="0" * 64,
            created_at=created)))
        outbox = f"outbox-{i:08x}"  # the attempt records its outbox's identity; the journal's lines carry it
        stores.control.put_create_only(keys.attempt(run_id, "attempt-001"), dump_model(Attempt(
            run_id=run_id, attempt_id="attempt-001", number=1, mode="fresh", host="bench", pid=1, started_at=created,
            outbox=outbox)))
        journal = Journal(RunPaths(settings.run_dir(run_id)).journal, outbox=outbox, attempt="attempt-001")
        events, seq = [], 0
        for r in range(1, rollouts + 1):
            seq += 1
            events.append((seq, {"train/global_step": r * 512, "train/episode/return/shaped/mean": skill * r / rollouts,
                                 "train/throughput/loop_fps": 4000.0 + rng.standard_normal(),
                                 "train/throughput/rollout/seconds": 0.1, "train/throughput/update/seconds": 0.02,
                                 "train/algorithm/ppo/update/loss": 1.0 / r}))
        evaluations, ckpts, promotion = [], [], None
        for c in range(1, checkpoints + 1):
            step = c * rollouts * 512 // checkpoints
            sha = f"{i:016x}{c:048x}"
            rate = float(min(1.0, skill * c / checkpoints))
            result = {"aggregates": {"eval/outcome/success/rate": rate, "eval/episode/return/mean": rate,
                                     "eval/episode/return/std": 0.1, "eval/acceptance/episodes/completed": 100}}
            accepted = rate >= 0.95 and promotion is None
            key = f"{c:08x}{i:024x}"
            record = EvaluationRecord(intent_key=key, run_id=run_id, checkpoint_step=step, checkpoint_sha256=sha,
                                      status="accepted" if accepted else "rejected", return_mean=rate, result=result,
                                      result_sha256=sha256_json(result), recorded_at=created)
            stores.eval.put_create_only(keys.evaluation_result(run_id, key), dump_model(record))
            uri = f"{stores.model.base_url}/{keys.checkpoint_prefix(run_id, step, sha)}"
            ckpts.append(TerminalCheckpoint(step=step, sha256=sha, uri=uri))
            evaluations.append(TerminalEvaluation(checkpoint_step=step, status=record.status, return_mean=rate,
                                                  result_uri=stores.eval.url(keys.evaluation_result(run_id, key))))
            if accepted:
                promotion = Promotion(run_id=run_id, attempt_id="attempt-001", checkpoint_step=step, checkpoint_sha256=sha,
                                      uri=uri, evaluation_key=key, result_uri=evaluations[-1].result_uri, return_mean=rate,
                                      promoted_at=created + timedelta(seconds=step / 4000))
                stores.control.put_create_only(keys.promotion(run_id), dump_model(promotion))
            seq += 1
            events.append((seq, {"eval/checkpoint_step": step, **result["aggregates"],
                                 "eval/outcome/success/rate_ci95_low": max(0.0, rate - 0.05),
                                 "eval/outcome/success/rate_ci95_high": min(1.0, rate + 0.05)}))
        journal.write_many(events)
        stores.control.put_create_only(keys.terminal(run_id, "attempt-001"), dump_model(TerminalReceipt(
            run_id=run_id, attempt_id="attempt-001", goal_id=goal, recipe_id=recipe, seed=run_seed,
            outcome="succeeded" if promotion else "failed", reason="synthetic", final_step=rollouts * 512,
            checkpoints=ckpts, evaluations=evaluations,
            promotion=TerminalPromotion(checkpoint_step=promotion.checkpoint_step, sha256=promotion.checkpoint_sha256,
                                        uri=promotion.uri) if promotion else None,
            metrics=TerminalMetrics(local_high_water=seq, sinks={"journal": seq, "wandb": None}), drained=True,
            learner=LearnerExit(exit_code=0, stop_reason="budget"), sealed_at=created)))
        ids.append(run_id)
    return ids


def measure(home: Path, rounds: int = 3) -> list[dict]:
    """Time ``build_site`` (all goals) and ``leaders_runs`` (one goal) over the runs in ``home``."""
    from gradlab.results.cohorts import leaders_runs
    from gradlab.results.reports import build_site
    from gradlab.settings import load_settings
    from gradlab.stores import open_stores

    os.environ["GRADLAB_HOME"] = str(home)
    settings, stores = load_settings(), open_stores()
    runs = len([k for k in stores.control.list("runs/") if k.endswith("/run.json")])
    cases = {
        "reports build": lambda r: build_site(settings, stores, home / f"site-{r}"),
        "leaders runs": lambda r: leaders_runs(stores, GOALS[0], min_seeds=3),
    }
    rows = []
    for name, call in cases.items():
        times = []
        for r in range(rounds):
            t0 = time.perf_counter()
            call(r)
            times.append(time.perf_counter() - t0)
        best = min(times)
        rows.append({"case": name, "runs": runs, "seconds": best, "slowest_s": max(times), "budget_s": BUDGET_S[name],
                     "ok": best <= BUDGET_S[name]})
    return rows


@contextlib.contextmanager
def temporary_home(prefix: str) -> Iterator[Path]:
    """A temporary folder for a benchmark's ``GRADLAB_HOME`` (:func:`synthesize` and :func:`measure`
    point the variable at it); the variable is restored and the folder removed afterwards."""
    old = os.environ.get("GRADLAB_HOME")
    try:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            yield Path(tmp)
    finally:
        if old is None:
            os.environ.pop("GRADLAB_HOME", None)
        else:
            os.environ["GRADLAB_HOME"] = old


def main(runs: int = 100, rounds: int = 3, as_json: bool = False) -> None:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    err = Console(stderr=True)
    with temporary_home("gradlab-bench-reports-") as home:
        with Progress(console=err, transient=True) as bar:
            bar.add_task(f"writing {runs} synthetic runs", total=None)
            synthesize(home, runs)
        rows = measure(home, rounds)
    load = os.getloadavg()[0]
    if as_json:
        print(json.dumps({"rows": rows, "load_average_1m": load, "cpus": os.cpu_count()}))
        return
    table = Table("case", "runs", "seconds (fastest)", "slowest", "budget", "within", title=f"reports over {runs} runs")
    for row in rows:
        table.add_row(row["case"], str(row["runs"]), f"{row['seconds']:.3f}", f"{row['slowest_s']:.3f}",
                      f"{row['budget_s']:.0f} s", "yes" if row["ok"] else "[red]no[/]")
    Console().print(table)
    err.print(f"load average (1 min) {load:.1f} on {os.cpu_count()} CPUs")
