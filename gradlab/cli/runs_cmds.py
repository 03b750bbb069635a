"""``gradlab runs list|show|retry|sync|reconcile``: runs as the receipt store records them."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from gradlab.cli.output import console, err_console, fail, print_json
from gradlab.cli.store_reads import open_stores_or_exit, run_view_or_exit

runs_app = typer.Typer(help="List, inspect, retry and reconcile runs (read from the receipt store).",
                       no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]


@runs_app.command("list")
def list_runs(json_out: JsonOption = False) -> None:
    """Every run in the receipt store with its latest attempt's outcome."""
    from gradlab import receipts as rules

    stores = open_stores_or_exit()
    rows = []
    for run_id in rules.list_runs(stores):
        record = rules.read_run(stores, run_id)
        attempts = rules.list_attempts(stores, run_id)
        latest = attempts[-1] if attempts else None
        terminal = rules.read_terminal(stores, run_id, latest.attempt_id) if latest else None
        promotion = rules.read_promotion(stores, run_id)
        rows.append({"run_id": run_id, "goal_id": record.goal_id, "recipe_id": record.recipe_id, "seed": record.seed,
                     "attempts": len(attempts), "outcome": terminal.outcome if terminal else ("running" if latest else None),
                     "promoted_step": promotion.checkpoint_step if promotion else None,
                     "created_at": record.created_at.isoformat()})
    if json_out:
        print_json(rows)
        return
    table = Table("run", "goal/recipe", "seed", "attempts", "outcome", "promoted")
    for r in rows:
        table.add_row(r["run_id"], f"{r['goal_id']}/{r['recipe_id']}", str(r["seed"]), str(r["attempts"]),
                      str(r["outcome"]), str(r["promoted_step"]) if r["promoted_step"] is not None else "-")
    console.print(table)


@runs_app.command("show")
def show(run_id: Annotated[str, typer.Argument(help="The run id.")], json_out: JsonOption = False) -> None:
    """A run's receipt, checkpoints, evaluations and promotion."""
    view = run_view_or_exit(open_stores_or_exit(), run_id)
    if json_out:
        print_json(view)
        return
    run = view["run"]
    console.print(f"[bold]{run['run_id']}[/] {escape(run['display_name'])}")
    for a in view["attempts"]:
        console.print(f"  {a['attempt_id']} ({a['mode']}): {a['outcome'] or 'no receipt yet'}")
        for note in [*a.get("skipped_checkpoints", []), *([a["outbox_replaced"]] if a.get("outbox_replaced") else [])]:
            console.print(f"    [yellow]{escape(note)}[/]", highlight=False)
    if view["receipt"]:
        console.print(f"  outcome: {view['receipt']['outcome']}: {escape(view['receipt']['reason'])}")
    if view.get("init_from"):
        parent = view["init_from"]
        console.print(f"  warm start from {escape(parent['source'])}: step {parent['checkpoint_step']}, "
                      f"sha256 {parent['checkpoint_sha256']}" + (" (with its optimizer)" if parent.get("optimizer") else ""),
                      highlight=False)
    table = Table("step", "sha256", "evaluation", "return mean")
    evals = {e["checkpoint_step"]: e for e in view["evaluations"]}
    for c in view["checkpoints"]:
        e = evals.get(c["step"], {})
        rm = e.get("return_mean")
        table.add_row(str(c["step"]), c["sha256"][:16], e.get("status", "-"), f"{rm:.2f}" if rm is not None else "-")
    console.print(table)
    promo = view["promotion"]
    console.print(f"  promotion: step {promo['checkpoint_step']}" if promo else "  promotion: none")


@runs_app.command("retry")
def retry(
    run_id: Annotated[str, typer.Argument(help="The run id.")],
    wandb: Annotated[str | None, typer.Option("--wandb", help="W&B mode for this attempt.")] = None,
    eval_backend: Annotated[str, typer.Option("--eval-backend")] = "local",
    json_out: JsonOption = False,
) -> None:
    """A new attempt of RUN_ID: refused while its lease is live; drain-only if the learner had
    finished; otherwise the learner resumes from the newest checkpoint that verifies."""
    from gradlab import receipts as rules
    from gradlab.cli.local_flow import configure_prefect, run_flow
    from gradlab.cli.run_display import LiveProgress, print_summary
    from gradlab.errors import ConfigError, NotFound
    from gradlab.receipts.lease import read_lease
    from gradlab.runs.timeouts import check_run_environment
    from gradlab.settings import load_settings

    try:  # the environment's run settings, before an attempt is opened or a learner started
        check_run_environment()
    except ConfigError as e:
        fail(str(e))
    stores = open_stores_or_exit()
    view = run_view_or_exit(stores, run_id)
    if view["receipt"] is not None and view["receipt"]["outcome"] == "succeeded":
        fail(f"run {run_id} already succeeded ({view['receipt']['attempt_id']}): nothing to retry")
    held = read_lease(stores.control, run_id)
    _refuse_if_owner_alive(held, run_id)
    if held is not None and held.lease.in_force():
        fail(f"run {run_id}: attempt {held.lease.holder} still holds the lease until {held.lease.expires_at.isoformat()} "
             f"(owner {held.lease.owner}); retry after it ends or expires")
    import time

    started = time.monotonic()
    published = max((c["step"] for c in view["checkpoints"]), default=None)
    resumes = (f"the learner resumes from the newest checkpoint that verifies (published: step {published:,}; "
               "a newer local one verified against its manifest goes first)") if published is not None \
        else "the learner resumes from the newest local checkpoint that verifies, else starts from step 0 (nothing was published)"
    err_console.print(f"run [bold]{run_id}[/]: attempt {len(view['attempts']) + 1}; {resumes}, or only the pending "
                      "work is drained if the learner had finished", highlight=False)
    err_console.print(f"Prefect API: {escape(configure_prefect())}", highlight=False)
    try:
        timesteps = int(rules.read_run_spec(stores, run_id)["recipe"]["train"]["timesteps"])
    except (NotFound, KeyError, TypeError, ValueError):
        timesteps = 0
    display = LiveProgress(load_settings().run_dir(run_id) / "outbox.sqlite", timesteps).start()
    try:
        receipt, state = run_flow(recipe=None, seed=view["run"]["seed"], wandb_mode=wandb, eval_backend=eval_backend,
                                  run_id=run_id)
    except KeyboardInterrupt:
        receipt, state = None, None
    finally:
        display.stop()
    if receipt is None:
        why = f": {state.message}" if state is not None and state.message else ""
        fail(f"run {run_id}: the retry sealed no receipt{why}; see `gradlab runs show {run_id}`")
    print_summary(receipt, time.monotonic() - started)
    if json_out:
        print_json(receipt)
    raise typer.Exit(0 if receipt["outcome"] == "succeeded" else 1)


@runs_app.command("sync")
def sync(
    run_id: Annotated[str, typer.Argument(help="The run id.")],
    offline: Annotated[bool, typer.Option("--offline", help="Rebuild the single history only; do not upload.")] = False,
    json_out: JsonOption = False,
) -> None:
    """Upload RUN_ID's metrics to W&B as one history: rebuilt from the journal's surviving lineage
    (a multi-attempt run's offline segments would keep only the last one); needs WANDB_API_KEY."""
    from gradlab.metrics import wandb_sync
    from gradlab.settings import load_settings

    settings = load_settings()
    run_dir = settings.run_dir(run_id)
    if not (run_dir / "journal.jsonl").is_file():
        fail(f"run {run_id}: no journal at {run_dir / 'journal.jsonl'} (sync runs on the machine that trained it)")
    run_view_or_exit(open_stores_or_exit(), run_id)  # exits 1 for an unknown run
    import json

    try:  # the project the run logged to, as the training flow chose it
        logging_cfg = json.loads((run_dir / "spec.json").read_text())["recipe"].get("logging", {})
    except (OSError, ValueError, KeyError):
        logging_cfg = {}
    project = settings.wandb_project or logging_cfg.get("wandb_project") or "gradlab"
    folder, points = wandb_sync.rebuild_history(run_dir, run_id, project, entity=settings.wandb_entity)
    synced = None
    if not offline:
        wandb_sync.upload(folder, run_id, project, entity=settings.wandb_entity)
        synced = str(wandb_sync.record_synced(run_dir, run_id, folder, points))
    if json_out:
        print_json({"run_id": run_id, "points": points, "folder": str(folder), "uploaded": not offline,
                    "synced": synced})
        return
    console.print(f"{run_id}: one W&B history of {points} points from the journal in {folder}"
                  + ("" if offline else f"; uploaded to {project}"), highlight=False)


@runs_app.command("reconcile")
def reconcile(run_id: Annotated[str, typer.Argument(help="The run id.")], json_out: JsonOption = False) -> None:
    """Close attempts whose process ended without sealing a receipt (crash, SIGKILL) as failed."""
    from gradlab import receipts as rules
    from gradlab.receipts.lease import read_lease

    stores = open_stores_or_exit()
    run_view_or_exit(stores, run_id)  # exits 1 for an unknown run
    _refuse_if_owner_alive(read_lease(stores.control, run_id), run_id)
    sealed = rules.reconcile_run(stores, run_id)
    if json_out:
        print_json([r.model_dump(mode="json") for r in sealed])
        return
    if not sealed:
        err_console.print("nothing to reconcile: every attempt has a receipt or a live lease")
    for r in sealed:
        console.print(f"{r.attempt_id}: sealed {r.outcome}: {escape(r.reason)}")


def _refuse_if_owner_alive(held, run_id: str) -> None:
    """An expired lease whose holder still runs on this host (suspended, swapping, a long store
    outage) is not a dead attempt: taking the run over would start a second learner lineage."""
    import os
    import socket

    if held is None or held.lease.released:
        return
    state = held.lease.owner_state()
    if state == "dead":
        return
    if state == "alive":
        fail(f"run {run_id}: attempt {held.lease.holder} is still running here (pid {held.lease.owner_pid}), although "
             f"its lease {'expired' if not held.lease.is_live() else 'is live'}; stop it first (Ctrl-C or "
             "`prefect flow-run cancel`)")
    if held.lease.owner_boot_id is not None:
        return  # another boot or another machine: only the lease's expiry can tell
    # A lease written before owners carried a boot id and start time: the pid is all there is.
    host, _, pid = held.lease.owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return
    except PermissionError:
        pass
    fail(f"run {run_id}: attempt {held.lease.holder} is still running here (pid {pid}), although its lease "
         f"{'expired' if not held.lease.is_live() else 'is live'}; stop it first (Ctrl-C or `prefect flow-run cancel`)")
