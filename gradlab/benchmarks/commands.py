"""``gradlab benchmark commands``: how fast the everyday read-only commands answer, and what they import.

Each command runs in a fresh interpreter (as a person's shell starts it) over synthetic sealed
runs in a temporary ``GRADLAB_HOME`` (:func:`gradlab.benchmarks.reports.synthesize`), ``rounds``
times; the table gives the fastest and slowest wall time against the budget (1.5 s on a quiet
machine, issue 26) and which of :data:`HEAVY_MODULES` it imported (none, except ``prefect`` for
``experiment status``, which asks the server: measured only with ``--prefect-api``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

#: Modules an everyday command must not import (seconds each to import; torch ~2-5 s here).
HEAVY_MODULES = ("torch", "stable_baselines3", "wandb", "prefect", "matplotlib", "ale_py")
#: The budget of one command, wall seconds on a quiet machine.
BUDGET_S = 1.5

#: Run with ``python -c PROBE ARGS...``: gradlab's console script with ARGS, then, at exit, one
#: stderr line ``GRADLAB_IMPORTED [...]``: which of :data:`HEAVY_MODULES` it imported.
PROBE = f"""import atexit, json, sys
atexit.register(lambda: print("GRADLAB_IMPORTED " + json.dumps([m for m in {HEAVY_MODULES!r} if m in sys.modules]),
                              file=sys.__stderr__))
from gradlab.cli.app import main
sys.argv = ["gradlab", *sys.argv[1:]]
main()
"""


def commands(run_id: str, goal: str) -> list[list[str]]:
    """The cheap commands measured (``runs show`` of ``run_id``, ``leaders`` of ``goal``)."""
    return [["runs", "list"], ["runs", "show", run_id], ["leaders", "runs", "--goal", goal],
            ["leaders", "checkpoints", "--goal", goal], ["goals", "list"], ["recipe", "show", "CartPole-v1/ppo"]]


def measure(args: list[str], home: Path, rounds: int, env: dict[str, str] | None = None) -> dict:
    """One command ``rounds`` times in fresh interpreters: {command, seconds, slowest_s, imported, exit_code}."""
    times, imported, code = [], [], 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                             env={**os.environ, "GRADLAB_HOME": str(home), "GRADLAB_DAEMON": "0", **(env or {})})
        times.append(time.perf_counter() - t0)
        code = out.returncode
        line = next((x for x in out.stderr.splitlines() if x.startswith("GRADLAB_IMPORTED ")), None)
        imported = json.loads(line.split(" ", 1)[1]) if line else ["(did not finish)"]
    return {"command": " ".join(args), "seconds": min(times), "slowest_s": max(times), "imported": imported,
            "exit_code": code, "budget_s": BUDGET_S, "ok": min(times) <= BUDGET_S and code == 0}


def main(rounds: int = 3, prefect_api: str | None = None, as_json: bool = False) -> None:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from gradlab.benchmarks.reports import synthesize, temporary_home

    err = Console(stderr=True)
    rows = []
    with temporary_home("gradlab-bench-commands-") as home:
        ids = synthesize(home, runs=10, rollouts=20)
        todo = commands(ids[0], "gradlab__bandit")
        if prefect_api:
            todo.append(["experiment", "status", "--run", ids[0]])
        with Progress(console=err, transient=True) as bar:
            task = bar.add_task("commands", total=len(todo))
            for args in todo:
                extra = {"PREFECT_API_URL": prefect_api} if args[0] == "experiment" and prefect_api else None
                rows.append(measure(args, home, rounds, extra))
                bar.advance(task)
    load = os.getloadavg()[0]
    if as_json:
        print(json.dumps({"rows": rows, "load_average_1m": load, "cpus": os.cpu_count()}))
        return
    table = Table("command", "seconds (fastest)", "slowest", "budget", "within", "heavy imports",
                  title=f"everyday commands, fastest of {rounds} fresh processes")
    for row in rows:
        table.add_row(row["command"], f"{row['seconds']:.2f}", f"{row['slowest_s']:.2f}", f"{row['budget_s']:.1f} s",
                      "yes" if row["ok"] else "[red]no[/]", ", ".join(row["imported"]) or "none")
    Console().print(table)
    err.print(f"load average (1 min) {load:.1f} on {os.cpu_count()} CPUs (the budget is for a quiet machine)")
