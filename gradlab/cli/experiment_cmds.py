"""``gradlab experiment``: queued runs on Prefect deployments (docs/ARCHITECTURE.md section 11).

``preflight`` checks, read-only, every service a queued run needs and says what is missing
(see :mod:`gradlab.deploy.preflight`). It imports neither prefect nor torch.

``launch|status|follow|wait|logs|cancel|retry|list`` are thin conveniences over the Prefect API
(:mod:`gradlab.cli.prefect_runs`) plus our receipts: Prefect says where a flow run is (Scheduled,
Running, Cancelling, Completed...), the stores say what it proved (checkpoints, evaluations,
promotion, terminal outcome). ``--run`` takes a gradlab run id or a Prefect flow run id. They need
a Prefect server: ``PREFECT_API_URL`` / ``[prefect] api_url``, else the local one kept in the
background, which the first of them starts (``gradlab.runs.server``; not with ``GRADLAB_DAEMON=0``).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gradlab.cli.contracts_cmds import SetOption
from gradlab.cli.output import console, err_console, fail, print_json

experiment_app = typer.Typer(help="Queued runs on Prefect deployments: launch, status, follow, wait, logs, cancel, "
                                  "retry, list, preflight.", no_args_is_help=True)

_STYLE = {"ok": "green", "fail": "red", "warn": "yellow", "skip": "dim"}


@experiment_app.command("preflight")
def preflight(
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    timeout_s: Annotated[float, typer.Option("--timeout", help="Timeout of each HTTP probe, seconds.")] = 2.0,
) -> None:
    """Check the Prefect API, work pools, deployments, stores and W&B; exit 1 if a required one fails.

    Read-only except one create-only probe object per store under `_preflight/<random>/`.
    """
    from gradlab.deploy.preflight import run_preflight

    report = run_preflight(timeout_s=timeout_s)
    if json_out:
        print_json(report.as_json())
    else:
        table = Table("check", "status", "detail")
        for c in report.checks:
            status = f"[{_STYLE[c.status]}]{c.status}[/]" + ("" if c.required else " (optional)")
            detail = escape(c.detail) + (f"\n[dim]→ {escape(c.fix)}[/]" if c.fix and c.status != "ok" else "")
            table.add_row(c.name, status, detail)
        console.print(table)
        if report.ok:
            console.print("[green]ready[/]: every required service answered")
        else:
            console.print(f"[red]missing[/]: {', '.join(c.name for c in report.missing)}")
    if not report.ok:
        raise typer.Exit(1)


# --------------------------------------------------------------------------------------------
# launch | status | follow | wait | logs | cancel | retry | list
# --------------------------------------------------------------------------------------------

RunOption = Annotated[str, typer.Option("--run", help="A gradlab run id, or a Prefect flow run id.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]
DEFAULT_DEPLOYMENT = "training-run/local"
#: Seconds between two looks at the Prefect API and the stores while following or waiting.
POLL_S = 1.0


@contextmanager
def _prefect() -> Iterator[tuple[Any, str]]:
    """A synchronous Prefect client on the configured server, and that server's API URL."""
    from gradlab.cli.pools_cmds import use_prefect_server

    api_url = use_prefect_server()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        yield client, api_url


def _resolve(client: Any, ref: str) -> tuple[str | None, list[Any]]:
    """``--run`` → (gradlab run id, its flow runs newest first); exits 1 when neither exists."""
    from gradlab.cli.prefect_runs import resolve_run
    from gradlab.errors import NotFound

    try:
        run_id, flow_runs = resolve_run(client, ref)
    except NotFound as e:
        fail(str(e))
    if not flow_runs and (run_id is None or _store_view(run_id) is None):
        fail(f"no run {ref}: no flow run is tagged with it on the Prefect server and the stores have no such run")
    return run_id, flow_runs


def _store_view(run_id: str | None) -> dict[str, Any] | None:
    """What the stores hold about ``run_id`` in compact form (docs/ARCHITECTURE.md section 8), or None before it is opened.

    Returns:
        ``{"goal_id", "recipe_id", "seed", "attempts": [{"attempt_id", "mode", "outcome"}],
        "outcome": latest attempt's outcome (None while it runs), "reason", "final_step",
        "checkpoints": [{"step", "sha256", "uri"}], "evaluations": [{"checkpoint_step", "status",
        "return_mean"}], "promotion": {"checkpoint_step", "sha256", ...} | None, "live": the running
        attempt's progress (:func:`_live_view`) | None}``.
    """
    if run_id is None:
        return None
    from gradlab import receipts as rules
    from gradlab.cli.store_reads import open_stores_or_exit, run_view_or_exit
    from gradlab.errors import NotFound

    stores = open_stores_or_exit()
    try:
        rules.read_run(stores, run_id)
    except NotFound:
        return None
    view = run_view_or_exit(stores, run_id)
    latest = view["attempts"][-1] if view["attempts"] else None
    live = _live_view(stores, run_id) if latest and not latest["outcome"] else None
    receipt = view["receipt"] if latest and latest["outcome"] and view["receipt"] and \
        view["receipt"]["attempt_id"] == latest["attempt_id"] else None
    return {
        "goal_id": view["run"]["goal_id"], "recipe_id": view["run"]["recipe_id"], "seed": view["run"]["seed"],
        "attempts": [{"attempt_id": a["attempt_id"], "mode": a["mode"], "outcome": a["outcome"]} for a in view["attempts"]],
        "outcome": latest["outcome"] if latest else None,
        "reason": receipt["reason"] if receipt else None,
        "final_step": receipt["final_step"] if receipt else None,
        "checkpoints": [{"step": c["step"], "sha256": c["sha256"], "uri": c["uri"]} for c in view["checkpoints"]],
        "evaluations": [{"checkpoint_step": e["checkpoint_step"], "status": e["status"], "return_mean": e["return_mean"]}
                        for e in view["evaluations"]],
        "promotion": view["promotion"],
        "live": live,
    }


def _live_view(stores: Any, run_id: str) -> dict[str, Any] | None:
    """A running attempt's progress from its outbox when the run directory is on this machine:
    ``{"step", "timesteps", "steps_per_s", "learner_done", "checkpoints", "evaluations_left"}``;
    None when it is elsewhere (another worker's machine)."""
    from gradlab import receipts as rules
    from gradlab.runs.progress import RunProgress
    from gradlab.settings import load_settings

    outbox = load_settings().run_dir(run_id) / "outbox.sqlite"
    if not outbox.is_file():
        return None
    try:
        timesteps = int(rules.read_run_spec(stores, run_id)["recipe"]["train"]["timesteps"])
        progress = RunProgress(outbox, timesteps).refresh()
    except Exception:  # noqa: BLE001 - a view: the stores' part still shows
        return None
    rate = progress.learner_steps_per_s
    return {"step": progress.step, "timesteps": timesteps, "steps_per_s": round(rate, 1) if rate else None,
            "learner_done": progress.finished, "checkpoints": progress.checkpoints,
            "evaluations_left": progress.evaluations_left}


def _last_evaluation(stores: dict[str, Any]) -> dict[str, Any] | None:
    """The highest-step evaluation with a result (not ``deferred``, ``running`` or ``queued``), or None."""
    done = [e for e in stores["evaluations"] if e["status"] not in ("deferred", "running", "queued")]
    return max(done, key=lambda e: e["checkpoint_step"]) if done else None


def _status(client: Any, api_url: str, ref: str) -> dict[str, Any]:
    """Prefect's view of the run's latest flow run plus the stores' view (``status --json``)."""
    from gradlab.cli.prefect_runs import FlowRunView, deployment_names, ui_url

    run_id, flow_runs = _resolve(client, ref)
    names = deployment_names(client, flow_runs)
    views = [FlowRunView.of(fr, names).as_json() for fr in flow_runs]
    latest = views[0] if views else None
    if latest is not None:
        latest["ui_url"] = ui_url(api_url, latest["flow_run_id"])
    return {"run_id": run_id, "prefect": latest, "flow_runs": views, "stores": _store_view(run_id)}


def _render_status(status: dict[str, Any]) -> None:
    prefect, stores = status["prefect"], status["stores"]
    what = f"{stores['goal_id']}/{stores['recipe_id']} seed {stores['seed']}" if stores else \
        (f"{prefect['recipe']} seed {prefect['seed']}" if prefect and prefect["recipe"] else "")
    console.print(f"[bold]{status['run_id'] or '(run id not yet assigned)'}[/] {escape(what)}", highlight=False)
    if prefect:
        msg = f" ({escape(prefect['state_message'])})" if prefect["state_message"] else ""
        console.print(f"  prefect: [bold]{prefect['state']}[/]{msg}; flow run {prefect['flow_run_id']} "
                      f"({prefect['deployment'] or 'no deployment'}), {len(status['flow_runs'])} flow run(s)",
                      highlight=False)
        console.print(f"  ui: {prefect['ui_url']}", highlight=False)
    else:
        console.print("  prefect: no flow run (a run `gradlab train` ran in-process before tagging)")
    if stores is None:
        console.print("  stores: not opened yet")
        return
    for a in stores["attempts"]:
        console.print(f"  {a['attempt_id']} ({a['mode']}): {a['outcome'] or 'running (no receipt yet)'}")
    live = stores.get("live")
    if live:
        what = (f"learner done, {live['evaluations_left']} evaluation(s) left" if live["learner_done"]
                else f"{live['steps_per_s']:,.0f} steps/s" if live["steps_per_s"] else "starting")
        console.print(f"  training: step {live['step']:,}/{live['timesteps']:,} ({what})", highlight=False)
    steps = [c["step"] for c in stores["checkpoints"]]
    console.print(f"  checkpoints: {len(steps)} published" + (f" (steps {', '.join(map(str, steps))})" if steps else ""))
    counts = Counter(e["status"] for e in stores["evaluations"])
    console.print("  evaluations: " + (", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"))
    if (last := _last_evaluation(stores)) is not None:
        rm = f" (return mean {last['return_mean']:.2f})" if last["return_mean"] is not None else ""
        console.print(f"  last evaluation: step {last['checkpoint_step']} {last['status']}{rm}", highlight=False)
    promo = stores["promotion"]
    console.print(f"  promotion: step {promo['checkpoint_step']}" if promo else "  promotion: none")
    if stores["outcome"]:
        console.print(f"  outcome: [bold]{stores['outcome']}[/]: {escape(stores['reason'] or '')}"
                      + (f" (final step {stores['final_step']})" if stores["final_step"] is not None else ""))


def _changes(before: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """Lines saying what changed between two looks at a run (state, checkpoints, evaluations...)."""
    lines = []
    old_prefect = (before or {}).get("prefect") or {}
    prefect = now["prefect"] or {}
    if prefect.get("state") != old_prefect.get("state") or prefect.get("flow_run_id") != old_prefect.get("flow_run_id"):
        msg = f": {prefect['state_message']}" if prefect.get("state_message") else ""
        lines.append(f"prefect {prefect.get('state')}{msg}")
    old_stores = (before or {}).get("stores") or {"checkpoints": [], "evaluations": [], "promotion": None,
                                                  "attempts": [], "outcome": None}
    stores = now["stores"]
    if stores is None:
        return lines
    seen_attempts = {a["attempt_id"] for a in old_stores["attempts"]}
    lines += [f"{a['attempt_id']} opened ({a['mode']})" for a in stores["attempts"] if a["attempt_id"] not in seen_attempts]
    seen = {c["step"] for c in old_stores["checkpoints"]}
    lines += [f"checkpoint step {c['step']} published ({c['sha256'][:12]})" for c in stores["checkpoints"]
              if c["step"] not in seen]
    seen_evals = {(e["checkpoint_step"], e["status"]) for e in old_stores["evaluations"]}
    for e in stores["evaluations"]:
        if (e["checkpoint_step"], e["status"]) not in seen_evals:
            rm = f", mean return {e['return_mean']:.2f}" if e["return_mean"] is not None else ""
            lines.append(f"evaluation of step {e['checkpoint_step']}: {e['status']}{rm}")
    if stores["promotion"] and not old_stores["promotion"]:
        lines.append(f"promoted step {stores['promotion']['checkpoint_step']}")
    if stores["outcome"] and stores["outcome"] != old_stores["outcome"]:
        lines.append(f"receipt: {stores['outcome']}: {stores['reason'] or ''}")
    return lines


def _live_screen(status: dict[str, Any]) -> Any:
    """The run's live screen (:class:`gradlab.cli.run_display.LiveProgress`, started) when its
    outbox is on this machine (the stores' ``live`` view), else None."""
    live = (status["stores"] or {}).get("live")
    if not live or not status["run_id"]:
        return None
    from gradlab.cli.run_display import LiveProgress
    from gradlab.settings import load_settings

    return LiveProgress(load_settings().run_dir(status["run_id"]) / "outbox.sqlite", live["timesteps"]).start()


def _follow(client: Any, api_url: str, ref: str, *, quiet: bool = False) -> dict[str, Any]:
    """Print what changes until the latest flow run is final; return the last status. On a
    terminal, once the run's outbox is reachable here, the run's live screen (the one ``train``
    shows) is drawn below those lines until then; piped, only the lines.

    Ctrl-C stops following (exit 130), never the run.
    """
    last: dict[str, Any] | None = None
    screen = None
    try:
        while True:
            status = _status(client, api_url, ref)
            if screen is None and not quiet and err_console.is_terminal:
                screen = _live_screen(status)
            if not quiet:
                for line in _changes(last, status):
                    err_console.print(f"{datetime.now().strftime('%H:%M:%S')} {escape(line)}", highlight=False)
            last = status
            if status["prefect"] is None or status["prefect"]["final"]:
                # The receipt is sealed before the flow run ends: one more look catches it.
                return status
            if status["run_id"] and not ref.startswith("gradlab-"):
                ref = status["run_id"]  # a flow run id: follow its gradlab run from now on
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        if screen is not None:
            screen.stop()
            screen = None
        err_console.print("stopped following; the run goes on "
                          f"(`gradlab experiment cancel --run {last['run_id'] if last else ref}` stops it)")
        raise typer.Exit(130) from None
    finally:
        if screen is not None:
            screen.stop()


def _exit_code(status: dict[str, Any]) -> int:
    """0 exactly when the latest attempt's terminal receipt says ``succeeded``."""
    return 0 if status["stores"] and status["stores"]["outcome"] == "succeeded" else 1


def _queue(client: Any, api_url: str, deployment: str, parameters: dict[str, Any], run_id: str, headline: str, *,
           follow_: bool, json_out: bool, follow_flow_run: bool) -> None:
    """Create the flow run, say so, and with ``follow_`` follow it to the end (exit code from the receipt).

    ``follow_flow_run`` follows the new flow run itself; otherwise the run id's latest flow run.
    """
    from gradlab.cli.prefect_runs import create_run, ui_url
    from gradlab.errors import NotFound

    try:
        flow_run = create_run(client, deployment, parameters, run_id)
    except NotFound as e:
        fail(str(e))
    queued = {"run_id": run_id, "flow_run_id": str(flow_run.id), "deployment": deployment,
              "ui_url": ui_url(api_url, flow_run.id), "parameters": parameters}
    if not json_out:
        console.print(headline, highlight=False)
        console.print(f"  flow run {flow_run.id}\n  {queued['ui_url']}", highlight=False)
    if not follow_:
        if json_out:
            print_json(queued)
        return
    status = _follow(client, api_url, str(flow_run.id) if follow_flow_run else run_id)
    if json_out:
        print_json({**queued, "status": status})
    else:
        _render_status(status)
    raise typer.Exit(_exit_code(status))


@experiment_app.command("launch")
def launch(
    ref: Annotated[str, typer.Argument(help="GOAL/RECIPE, e.g. CartPole-v1/ppo.")],
    seed: Annotated[int, typer.Option("--seed", help="The run seed.")] = 0,
    overrides: SetOption = None,
    deployment: Annotated[str, typer.Option("--deployment", help="flow/deployment to queue on.")] = DEFAULT_DEPLOYMENT,
    wandb: Annotated[str | None, typer.Option("--wandb", help="disabled|offline|online (default: the worker's).")] = None,
    eval_backend: Annotated[str | None, typer.Option("--eval-backend", help="local|modal (default local).")] = None,
    no_eval: Annotated[bool, typer.Option("--no-eval", help="Skip evaluation (nothing can be promoted).")] = False,
    follow_: Annotated[bool, typer.Option("--follow", help="Stream its progress until it ends.")] = False,
    json_out: JsonOption = False,
) -> None:
    """Queue GOAL/RECIPE on a deployment; print the gradlab run id, the flow run id and its UI URL.

    The recipe and overrides are validated here first; the run id is reserved here and passed as
    the flow's `run_id`, so the run is known before a worker takes it.
    """
    from gradlab.cli.contracts_cmds import resolve_or_exit
    from gradlab.contracts.run_spec import new_run_id
    from gradlab.contracts.seeds import MAX_RUN_SEED

    resolve_or_exit(ref, overrides)
    if not 0 <= seed <= MAX_RUN_SEED:
        fail(f"--seed: expected 0..{MAX_RUN_SEED}, found {seed}")
    if wandb is not None and wandb not in ("disabled", "offline", "online"):
        fail(f"--wandb {wandb!r}: expected disabled, offline or online")
    if eval_backend is not None and eval_backend not in ("local", "modal"):
        fail(f"--eval-backend {eval_backend!r}: expected local or modal")
    run_id = new_run_id()
    parameters: dict[str, Any] = {"recipe": ref, "seed": seed, "overrides": list(overrides or []), "run_id": run_id}
    if wandb is not None:
        parameters["wandb_mode"] = wandb
    if eval_backend is not None:
        parameters["eval_backend"] = eval_backend
    if no_eval:
        parameters["evaluate"] = False
    with _prefect() as (client, api_url):
        _queue(client, api_url, deployment, parameters, run_id,
               f"queued [bold]{run_id}[/] ({escape(ref)} seed {seed}) on {deployment}",
               follow_=follow_, json_out=json_out, follow_flow_run=False)


@experiment_app.command("status")
def status(run: RunOption, json_out: JsonOption = False) -> None:
    """Prefect state of the run's latest flow run plus the receipts: checkpoints, evaluations,
    promotion, terminal outcome."""
    with _prefect() as (client, api_url):
        result = _status(client, api_url, run)
    if json_out:
        print_json(result)
    else:
        _render_status(result)


@experiment_app.command("follow")
def follow(run: RunOption) -> None:
    """Stream state changes (Prefect state, checkpoints, evaluations, promotion, receipt) until the
    run ends; exit 0 when its receipt says succeeded. Ctrl-C stops following, not the run."""
    with _prefect() as (client, api_url):
        result = _follow(client, api_url, run)
    _render_status(result)
    raise typer.Exit(_exit_code(result))


@experiment_app.command("wait")
def wait(
    run: RunOption,
    until: Annotated[str, typer.Option("--until", help="running | terminal.")] = "terminal",
    timeout: Annotated[str, typer.Option("--timeout", help="How long to wait: 90, 90s, 5m, 1h.")] = "1h",
    json_out: JsonOption = False,
) -> None:
    """Wait until the run's latest flow run is Running (or final), exit 0; exit 1 on timeout, or when
    waiting for `running` and the run ended without being seen running."""
    from gradlab.cli.prefect_runs import parse_duration
    from gradlab.errors import ConfigError

    if until not in ("running", "terminal"):
        fail(f"--until {until!r}: expected running or terminal")
    try:
        timeout_s = parse_duration(timeout)
    except ConfigError as e:
        fail(str(e))
    deadline = time.monotonic() + timeout_s
    reached = False
    with _prefect() as (client, api_url):
        while True:
            result = _status(client, api_url, run)
            prefect = result["prefect"] or {}
            if not prefect:  # a run with no flow run (`gradlab train` before tagging): the receipt says
                prefect = {"state": "no flow run", "final": bool((result["stores"] or {}).get("outcome"))}
            if until == "running" and prefect.get("state_type") == "RUNNING":
                reached = True
            elif until == "terminal" and prefect.get("final"):
                reached = True
            if reached or prefect.get("final") or time.monotonic() >= deadline:
                break
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
    summary = {"run_id": result["run_id"], "until": until, "reached": reached, "state": prefect.get("state"),
               "outcome": (result["stores"] or {}).get("outcome")}
    # a flow run that failed before it opened a run has no gradlab run id: name its flow run
    name = result["run_id"] or f"flow run {prefect.get('flow_run_id') or run}"
    if json_out:
        print_json(summary)
    elif reached:
        console.print(f"{name}: {prefect.get('state')}"
                      + (f" (receipt: {summary['outcome']})" if summary["outcome"] else ""), highlight=False)
    else:
        why = f"ended {prefect.get('state')}" if prefect.get("final") else f"still {prefect.get('state')} after {timeout}"
        err_console.print(f"{name}: not {until}: {why}", highlight=False)
    raise typer.Exit(0 if reached else 1)


@experiment_app.command("logs")
def logs(
    run: RunOption,
    tail: Annotated[int | None, typer.Option("--tail", min=1, help="Only the last N lines of each log.")] = None,
) -> None:
    """The latest flow run's Prefect logs, then the learner's log when the run directory is on this machine."""
    import logging

    from gradlab.cli.prefect_runs import flow_run_logs
    from gradlab.settings import load_settings

    with _prefect() as (client, _api_url):
        run_id, flow_runs = _resolve(client, run)
        rows = flow_run_logs(client, flow_runs[0].id, tail) if flow_runs else []
    if flow_runs:
        print(f"== prefect logs of flow run {flow_runs[0].id} ({flow_runs[0].name})")
    for r in rows:  # every line names its task (or the flow itself), each line of a multi-line message too
        prefix = f"{r['timestamp']} {logging.getLevelName(r['level']):<8} [{r['task']}] {r['name']}:"
        for part in str(r["message"]).splitlines() or [""]:
            print(f"{prefix} {part}")
    learner_log = load_settings().run_dir(run_id) / "learner.log" if run_id else None
    if learner_log is not None and learner_log.is_file():
        lines = learner_log.read_text(errors="replace").splitlines()
        print(f"== learner log {learner_log}")
        for line in lines[-tail:] if tail else lines:
            print(line)
    elif run_id:
        err_console.print("(no learner log on this machine: the run ran on another worker)")


@experiment_app.command("cancel")
def cancel(run: RunOption, json_out: JsonOption = False) -> None:
    """Cancel the run's flow run through Prefect: its worker stops the flow, the flow stops the
    learner and seals a `cancelled` receipt; everything already published stays."""
    from gradlab.cli.prefect_runs import cancel_flow_run
    from gradlab.errors import ConfigError

    with _prefect() as (client, _api_url):
        run_id, flow_runs = _resolve(client, run)
        live = [fr for fr in flow_runs if fr.state is None or not fr.state.is_final()]
        if not live:
            fail(f"run {run_id or run}: no flow run is scheduled or running (nothing to cancel)")
        moved = []
        for fr in live:
            try:
                moved.append({"flow_run_id": str(fr.id), "state": cancel_flow_run(client, fr)})
            except ConfigError as e:
                fail(str(e))
    if json_out:
        print_json({"run_id": run_id, "cancelled": moved})
        return
    for m in moved:
        console.print(f"{run_id}: flow run {m['flow_run_id']} → {m['state']}", highlight=False)


@experiment_app.command("retry")
def retry(
    run: RunOption,
    deployment: Annotated[str | None, typer.Option(
        "--deployment", help="flow/deployment (default: the one its last flow run used).")] = None,
    follow_: Annotated[bool, typer.Option("--follow", help="Stream its progress until it ends.")] = False,
    json_out: JsonOption = False,
) -> None:
    """Queue a new attempt of the run (a new flow run with its run id and no recipe): refused while a
    flow run of it is live or its lease is held; resumes from the newest checkpoint that verifies, or only
    drains when the learner had finished (docs/ARCHITECTURE.md section 8)."""
    from gradlab.cli.prefect_runs import FLOW_NAME, deployment_names
    from gradlab.cli.store_reads import open_stores_or_exit
    from gradlab.receipts.lease import read_lease

    with _prefect() as (client, api_url):
        run_id, flow_runs = _resolve(client, run)
        live = [fr for fr in flow_runs if fr.state is None or not fr.state.is_final()]
        if live:  # first: a run still queued is not opened yet, and launching it again would duplicate it
            fail(f"run {run_id or run}: flow run {live[0].id} is still "
                 f"{live[0].state.name if live[0].state else 'new'}; wait for it or cancel it first")
        if run_id is None or _store_view(run_id) is None:
            fail(f"run {run_id or run} was never opened in the stores: launch it again instead")
        held = read_lease(open_stores_or_exit().control, run_id)
        if held is not None and held.lease.in_force():
            fail(f"run {run_id}: attempt {held.lease.holder} still holds the lease until "
                 f"{held.lease.expires_at.isoformat()}; retry after it ends or expires")
        previous = flow_runs[0] if flow_runs else None
        if deployment is None:
            deployment = deployment_names(client, [previous]).get(previous.deployment_id) if previous else None
            deployment = deployment or DEFAULT_DEPLOYMENT
        if not deployment.startswith(f"{FLOW_NAME}/"):
            fail(f"--deployment {deployment!r}: expected {FLOW_NAME}/NAME")
        parameters: dict[str, Any] = {"run_id": run_id}
        for key in ("wandb_mode", "eval_backend"):  # the machine-side choices of its last flow run
            if previous is not None and (previous.parameters or {}).get(key) is not None:
                parameters[key] = previous.parameters[key]
        _queue(client, api_url, deployment, parameters, run_id,
               f"queued a new attempt of [bold]{run_id}[/] on {deployment}",
               follow_=follow_, json_out=json_out, follow_flow_run=True)


@experiment_app.command("list")
def list_(
    goal: Annotated[str | None, typer.Option("--goal", help="Only runs of this goal.")] = None,
    json_out: JsonOption = False,
) -> None:
    """Queued and finished runs: one row per gradlab run (its latest flow run), newest first."""
    from gradlab.cli.prefect_runs import FlowRunView, deployment_names, training_flow_runs

    with _prefect() as (client, _api_url):
        flow_runs = training_flow_runs(client)
        names = deployment_names(client, flow_runs)
    rows: dict[str, dict[str, Any]] = {}
    for fr in flow_runs:  # newest first: the first flow run of a run is its latest
        view = FlowRunView.of(fr, names)
        key = view.run_id or view.flow_run_id
        if key in rows:
            rows[key]["flow_runs"] += 1
            continue
        rows[key] = {"run_id": view.run_id, "flow_run_id": view.flow_run_id, "deployment": view.deployment,
                     "state": view.state, "recipe": view.recipe, "seed": view.seed, "created": view.created,
                     "flow_runs": 1, "outcome": None, "promoted_step": None}
    for row in rows.values():
        stores = _store_view(row["run_id"])
        if stores is not None:
            row["recipe"] = f"{stores['goal_id']}/{stores['recipe_id']}"
            row["seed"] = stores["seed"]
            row["outcome"] = stores["outcome"]
            row["promoted_step"] = stores["promotion"]["checkpoint_step"] if stores["promotion"] else None
    selected = [r for r in rows.values() if goal is None or (r["recipe"] or "").rpartition("/")[0] == goal]
    if json_out:
        print_json(selected)
        return
    table = Table("run", "recipe", "seed", "prefect", "flow runs", "outcome", "promoted")
    for r in selected:
        table.add_row(r["run_id"] or f"(flow run {r['flow_run_id'][:8]})", r["recipe"] or "-", str(r["seed"]),
                      str(r["state"]), str(r["flow_runs"]), str(r["outcome"] or "-"),
                      str(r["promoted_step"]) if r["promoted_step"] is not None else "-")
    console.print(table)
