"""Results commands: ``runs curves``, ``sweep``, ``compare``, ``leaders runs|checkpoints``,
``reports build|sync`` (docs/ARCHITECTURE.md section 12). Everything is read from our stores and
local journals: no W&B account or network is needed."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from gradlab.cli.contracts_cmds import SetOption, resolve_or_exit
from gradlab.cli.output import console, err_console, fail, print_json
from gradlab.cli.store_reads import open_stores_or_exit
from gradlab.console import plural

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]
GoalOption = Annotated[str, typer.Option("--goal", help="The goal id, e.g. gradlab__bandit.")]

leaders_app = typer.Typer(help="Rank recipes (cohorts of seeds) and accepted checkpoints of a goal.", no_args_is_help=True)
reports_app = typer.Typer(help="Static HTML reports: build them, publish them to a store.", no_args_is_help=True)


def fmt_estimate(e, digits: int = 3) -> str:
    """``value [low, high]``, or the value with why its interval is undefined."""
    if e.value is None:
        return f"- ({e.note})" if e.note else "-"
    if e.low is None:
        return f"{e.value:.{digits}f} (interval undefined: {plural(e.n, 'seed')})"
    return f"{e.value:.{digits}f} [{e.low:.{digits}f}, {e.high:.{digits}f}]"


def _domain(call):
    """Run a domain call; a gradlab error becomes one line and exit 1."""
    from gradlab.errors import GradlabError

    try:
        return call()
    except GradlabError as e:
        fail(str(e))


# -- curves ----------------------------------------------------------------------------------------
def curves(
    run_ids: Annotated[list[str], typer.Argument(help="One or more run ids.")],
    metric: Annotated[list[str] | None, typer.Option("--metric", help="A registered metric name or template (repeatable; "
                                                      "default: returns, evaluation, success, losses, steps/s).")] = None,
    x: Annotated[str, typer.Option("--x", help="x axis: steps or seconds (learner wall time).")] = "steps",
    out: Annotated[Path | None, typer.Option("--out", help="The figure to write (.png or .svg; default "
                                             "<GRADLAB_HOME>/curves/<RUN_ID>.png, never the current folder).")] = None,
    json_out: JsonOption = False,
) -> None:
    """Draw training and evaluation curves of runs from their local metric journals (read only: the
    journals are never modified). Says where the figure was written."""
    from gradlab.results.curves import DEFAULT_METRICS, X_AXES, empty_reasons, plot_curves, run_curves
    from gradlab.settings import load_settings

    if x not in X_AXES:
        fail(f"--x: expected one of {', '.join(X_AXES)}, found {x!r}", code=2)
    settings = load_settings()
    if out is None:
        out = settings.home / "curves" / default_figure_name(run_ids)
    target = out.absolute()
    if target.suffix.lower() not in (".png", ".svg"):
        fail(f"--out {out}: expected a .png or .svg file", code=2)
    stores = open_stores_or_exit()
    found = _domain(lambda: run_curves(settings, stores, run_ids, metric or DEFAULT_METRICS, x))
    empty = _domain(lambda: empty_reasons(stores, run_ids, metric or DEFAULT_METRICS, found))
    _domain(lambda: plot_curves(found, target, title=", ".join(run_ids), empty=empty))
    if json_out:
        print_json({"out": str(target), "curves": [c.as_json() for c in found], "empty": empty})
        return
    err_console.print(f"wrote {escape(str(target))} ({plural(len(found), 'curve')}, "
                      f"{plural(sum(len(c.x) for c in found), 'point')})", highlight=False)
    for name, why in empty.items():
        err_console.print(f"{escape(name)}: {escape(why)}", highlight=False)


def default_figure_name(run_ids: list[str]) -> str:
    """``<RUN_ID>.png``; for several runs their ids joined by ``+`` (after 3: ``+N-more``), so the
    figure of two runs never takes the name of one of them."""
    shown = run_ids if len(run_ids) <= 4 else [*run_ids[:3], f"{len(run_ids) - 3}-more"]
    return "+".join(shown) + ".png"


# -- sweep -----------------------------------------------------------------------------------------
def sweep(
    ref: Annotated[str, typer.Argument(help="GOAL/RECIPE, e.g. gradlab__bandit/ppo.")],
    seeds: Annotated[int, typer.Option("--seeds", help="Number of seeds (first-seed, first-seed+1, ...).")] = 3,
    first_seed: Annotated[int, typer.Option("--first-seed", help="The first seed.")] = 0,
    overrides: SetOption = None,
    deployment: Annotated[str | None, typer.Option("--deployment", help="Queue the runs on this deployment "
                                                   "(e.g. training-run/local) instead of training them here.")] = None,
    max_parallel: Annotated[int | None, typer.Option("--max-parallel", help="Seeds trained at once here "
                                                     "(default: the CPU count).")] = None,
    wandb: Annotated[str | None, typer.Option("--wandb", help="W&B mode: disabled, offline or online.")] = None,
    follow: Annotated[bool, typer.Option("--follow", help="Show each seed's progress until the cohort ends.")] = False,
    json_out: JsonOption = False,
) -> None:
    """Train a cohort of seeds of GOAL/RECIPE (the `sweep` flow) and seal its cohort receipt; exit 0
    only if every seed's terminal receipt says succeeded."""
    from gradlab.contracts.seeds import MAX_RUN_SEED

    if seeds < 1:
        fail(f"--seeds: expected at least 1, found {seeds}", code=2)
    if not 0 <= first_seed <= MAX_RUN_SEED - seeds + 1:
        fail(f"--first-seed: expected 0..{MAX_RUN_SEED - seeds + 1}, found {first_seed}", code=2)
    if wandb is not None and wandb not in ("disabled", "offline", "online"):
        fail(f"--wandb: expected disabled, offline or online, found {wandb!r}", code=2)
    if max_parallel is not None and max_parallel < 1:
        fail(f"--max-parallel: expected at least 1, found {max_parallel}", code=2)
    resolve_or_exit(ref, overrides)
    if seeds == 1:
        err_console.print("note: a cohort of one seed has no intervals (they are undefined); use --seeds 3 or more")
    from gradlab.cli.local_flow import cancel_on_ctrl_c, configure_prefect
    from gradlab.contracts.run_spec import new_run_id
    from gradlab.results.cohort_receipts import new_cohort_id

    cohort_id = new_cohort_id()
    run_ids = [new_run_id() for _ in range(seeds)]
    seed_list = list(range(first_seed, first_seed + seeds))
    created_at = datetime.now(UTC)
    try:
        api = configure_prefect()
    except KeyboardInterrupt:  # before the flow: every seed is listed, none started
        _seal_interrupted(cohort_id, ref, overrides, seed_list, run_ids, deployment, created_at,
                          "interrupted by the user (Ctrl-C) while the Prefect server started")
        raise typer.Exit(130) from None
    cancel_on_ctrl_c()  # Ctrl-C: every local seed stops its learner and seals `cancelled`; the rest never start
    if deployment:
        _require_deployment(deployment, api)
    err_console.print(f"cohort [bold]{cohort_id}[/]: {plural(seeds, 'seed')} of {escape(ref)} "
                      f"({'queued on ' + escape(deployment) if deployment else 'trained here'}); Prefect API: {escape(api)}",
                      highlight=False)
    stop = threading.Event()
    shown = threading.Thread(target=_follow, args=(run_ids, first_seed, stop), daemon=True) if follow else None
    if shown:
        shown.start()
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.sweep import sweep as sweep_flow

    try:
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            state = sweep_flow(recipe=ref, seeds=seeds, first_seed=first_seed, overrides=list(overrides or []),
                               deployment=deployment, wandb_mode=wandb, max_parallel=max_parallel, cohort_id=cohort_id,
                               run_ids=run_ids, return_state=True)
    except KeyboardInterrupt:  # the second Ctrl-C: the flow stopped where it was; its seeds are listed as they are
        _seal_interrupted(cohort_id, ref, overrides, seed_list, run_ids, deployment, created_at,
                          "interrupted by the user (Ctrl-C twice) before the sweep sealed its cohort")
        raise typer.Exit(130) from None
    finally:
        stop.set()
        if shown:
            shown.join(timeout=3)
    if not state.is_completed():
        fail(f"cohort {cohort_id}: the sweep flow ended {state.type.value}: {state.message}")
    receipt = state.result()
    stores = open_stores_or_exit()
    from gradlab.results.cohorts import cohort_stats

    results = [r for run in receipt["runs"] if (r := _seed_result(stores, run["run_id"])) is not None]
    summary = cohort_stats(results) if results else None
    ok = all(r["outcome"] == "succeeded" for r in receipt["runs"])
    if json_out:
        print_json({"cohort": receipt, "stats": summary.as_json() if summary else None})
    else:
        _print_cohort(summary, title=f"cohort {cohort_id}")
    _say_unstarted(receipt)
    raise typer.Exit(0 if ok else 1)


def _seed_result(stores, run_id: str):
    """The seed's result, or None for a reserved run that never started (no run record)."""
    from gradlab.errors import NotFound
    from gradlab.results.cohorts import seed_result

    try:
        return seed_result(stores, run_id)
    except NotFound:
        return None


def _say_unstarted(receipt: dict) -> None:
    """Name the seeds of a cohort receipt that never started (stderr), and why."""
    unstarted = [r for r in receipt["runs"] if r["outcome"] is None and r["flow_run_id"] is None]
    if unstarted:
        err_console.print(f"cohort {receipt['cohort_id']}: {plural(len(unstarted), 'seed')} never started "
                          f"({receipt.get('interrupted') or 'no receipt'}): "
                          + ", ".join(f"seed {r['seed']} ({r['run_id']})" for r in unstarted)
                          + "; listed in the cohort receipt, not scored", highlight=False)


def _seal_interrupted(cohort_id: str, ref: str, overrides: list[str] | None, seeds: list[int], run_ids: list[str],
                      deployment: str | None, created_at: datetime, why: str) -> None:
    """Seal the cohort receipt of a sweep interrupted before its flow sealed one: every reserved run is
    listed with what the store says of it (a run that never started has no outcome). A receipt the
    flow already sealed is kept as it is."""
    from gradlab.errors import GradlabError, NotFound
    from gradlab.results.cohort_receipts import build_cohort_receipt, read_cohort

    try:
        stores = open_stores_or_exit()
        try:
            receipt = read_cohort(stores, cohort_id)
        except NotFound:
            receipt = build_cohort_receipt(
                stores, cohort_id=cohort_id, recipe=ref, overrides=list(overrides or []), seeds=seeds,
                launched=[{"run_id": r, "seed": s, "flow_run_id": None} for s, r in zip(seeds, run_ids, strict=True)],
                deployment=deployment, flow_run_id=None, created_at=created_at, interrupted=why)
    except GradlabError as e:
        fail(f"cohort {cohort_id}: {why}, and its cohort receipt could not be sealed: {e}", code=130)
    err_console.print(f"cohort {cohort_id}: {why}; cohort receipt sealed", highlight=False)
    _say_unstarted(receipt.model_dump(mode="json"))


def _require_deployment(name: str, api: str) -> None:
    """Exit 1 unless the Prefect API knows deployment ``name`` (``flow-name/deployment-name``)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    if name.count("/") != 1:
        fail(f"--deployment: expected FLOW/DEPLOYMENT (e.g. training-run/local), found {name!r}", code=2)
    try:
        with get_client(sync_client=True) as client:
            client.read_deployment_by_name(name)
    except ObjectNotFound:
        fail(f"--deployment {name}: no such deployment on {api}; create it with `prefect deploy --all` "
             "(prefect.yaml) after `gradlab pools create`")
    except Exception as e:  # noqa: BLE001 - the API is down: say so before anything is queued
        fail(f"--deployment {name}: cannot reach the Prefect API at {api}: {e}")


def _follow(run_ids: list[str], first_seed: int, stop: threading.Event) -> None:
    """One line per seed every few seconds: its step, from the run's local outbox."""
    from gradlab.runs.paths import RunPaths
    from gradlab.runs.progress import RunProgress
    from gradlab.settings import load_settings

    settings = load_settings()
    progress: dict[str, RunProgress] = {}
    while not stop.wait(5.0):
        parts = []
        for i, run_id in enumerate(run_ids):
            outbox = RunPaths(settings.run_dir(run_id)).outbox
            try:
                if run_id not in progress and outbox.exists():
                    spec = RunPaths(settings.run_dir(run_id)).spec
                    import json

                    timesteps = int(json.loads(spec.read_text())["recipe"]["train"]["timesteps"])
                    progress[run_id] = RunProgress(outbox, timesteps)
                p = progress.get(run_id)
                parts.append(f"s{first_seed + i}: " + (f"{p.refresh().step:,}/{p.timesteps:,}"
                                                       + (" done" if p.finished else "") if p else "waiting"))
            except Exception:  # noqa: BLE001 - the display must never disturb the sweep
                parts.append(f"s{first_seed + i}: ?")
        err_console.print(" · ".join(parts), highlight=False)


def _print_cohort(c, title: str) -> None:
    if c is None:
        err_console.print(f"{title}: no sealed runs")
        return
    table = Table(title=f"{escape(title)}: {escape(c.goal_id)}/{escape(c.label)} ({c.objective}, {c.direction})")
    for col in ("seed", "run", "outcome", "score", "scored by", "success rate", "steps to acceptance",
                "seconds to acceptance"):
        table.add_column(col)
    for s in c.seeds:
        table.add_row(str(s.seed), s.run_id, str(s.outcome), "-" if s.score is None else f"{s.score:.3f}", s.scored_by,
                      "-" if s.success_rate is None else f"{s.success_rate:.3f}", str(s.steps_to_acceptance or "-"),
                      "-" if s.seconds_to_acceptance is None else f"{s.seconds_to_acceptance:.1f}")
    console.print(table)
    console.print(f"IQM (95% stratified bootstrap): {fmt_estimate(c.iqm)}")
    console.print(f"median [IQR]: {fmt_estimate(c.median)}")
    console.print(f"steps to acceptance, median [IQR]: {fmt_estimate(c.steps_to_acceptance, 0)}; "
                  f"accepted {c.accepted}/{len(c.seeds)}")
    console.print(f"scored: {escape(c.note)}", highlight=False)


# -- compare ---------------------------------------------------------------------------------------
def compare(
    ref_a: Annotated[str, typer.Argument(help="GOAL/RECIPE_A.")],
    ref_b: Annotated[str, typer.Argument(help="GOAL/RECIPE_B (the same goal).")],
    set_a: Annotated[list[str] | None, typer.Option("--set-a", help="A's overrides (dotted.key=value, repeatable), "
                                                     "when the recipe has several cohorts.")] = None,
    set_b: Annotated[list[str] | None, typer.Option("--set-b", help="B's overrides.")] = None,
    json_out: JsonOption = False,
) -> None:
    """Both cohorts' statistics and the probability that a seed of A beats a seed of B."""
    from gradlab.contracts.experiments import split_ref
    from gradlab.errors import ConfigError
    from gradlab.results.cohorts import compare as compare_cohorts
    from gradlab.results.cohorts import find_cohort

    goals = []
    for ref in (ref_a, ref_b):
        try:
            goals.append(split_ref(ref)[0])
        except ConfigError as e:
            fail(f"{ref!r}: {e}", code=2)
    if goals[0] != goals[1]:
        fail(f"compare: {ref_a} and {ref_b} are of different goals; only cohorts of one goal are comparable")
    stores = open_stores_or_exit()
    a = _domain(lambda: find_cohort(stores, ref_a, set_a))
    b = _domain(lambda: find_cohort(stores, ref_b, set_b))
    p = _domain(lambda: compare_cohorts(a, b))
    same = sorted(s.run_id for s in a.seeds) == sorted(s.run_id for s in b.seeds)
    note = (f"A and B are the same cohort ({a.goal_id}/{a.label}, the same {plural(len(a.seeds), 'run')}): "
            "the probability of improvement is 0.5 by construction; "
            "name another recipe, or a variant with --set-a/--set-b") if same else None
    if json_out:
        print_json({"a": a.as_json(), "b": b.as_json(), "probability_of_improvement": p.as_json(), "same_cohort": same,
                    "note": note})
        return
    if same:
        err_console.print(f"note: {escape(note)}", highlight=False)
    _print_cohort(a, "A")
    _print_cohort(b, "B")
    console.print(f"P({escape(a.label)} > {escape(b.label)}) on {a.objective}: {fmt_estimate(p)}"
                  + (" (same cohort)" if same else ""))


# -- leaders ---------------------------------------------------------------------------------------
@leaders_app.command("runs")
def leaders_runs(
    goal: GoalOption,
    min_seeds: Annotated[int, typer.Option("--min-seeds", help="Only cohorts with at least K evaluated seeds.")] = 1,
    json_out: JsonOption = False,
) -> None:
    """Recipes of a goal ranked by the cohort IQM of the goal's objective, with 95% intervals."""
    from gradlab.results.cohorts import leaders_runs as rank

    found = _domain(lambda: rank(open_stores_or_exit(), goal, min_seeds=min_seeds))
    if json_out:
        print_json([c.as_json() for c in found])
        return
    if not found:
        err_console.print(f"goal {goal}: no cohort with at least {plural(min_seeds, 'evaluated seed')}")
        return
    table = Table("rank", "recipe", "seeds scored", f"IQM of {found[0].objective} [95% CI]", "median [IQR]",
                  "accepted", "steps to acceptance (median)", title=f"leaders: {escape(goal)}")
    for i, c in enumerate(found, start=1):
        steps = c.steps_to_acceptance.value
        table.add_row(str(i), escape(c.label), f"{len(c.scores)}/{len(c.seeds)}", fmt_estimate(c.iqm),
                      fmt_estimate(c.median), f"{c.accepted}/{len(c.seeds)}", "-" if steps is None else f"{steps:,.0f}")
    console.print(table)
    from gradlab.results.cohorts import SCORING_RULE

    console.print(f"scoring: {SCORING_RULE}", highlight=False)
    for c in found:
        if len(c.scores) != len(c.seeds) or any(r.scored_by != "promoted" for r in c.seeds):
            console.print(f"{escape(c.label)}: {escape(c.note)}", highlight=False)


@leaders_app.command("checkpoints")
def leaders_checkpoints(
    goal: GoalOption,
    limit: Annotated[int, typer.Option("--limit", help="At most N checkpoints.")] = 10,
    json_out: JsonOption = False,
) -> None:
    """Accepted checkpoints of a goal ranked by evaluation return mean, with hashes and a play command."""
    from gradlab.results.cohorts import leaders_checkpoints as rank

    if limit < 1:
        fail(f"--limit: expected at least 1, found {limit}", code=2)
    found = _domain(lambda: rank(open_stores_or_exit(), goal, limit=limit))
    if json_out:
        print_json([c.as_json() for c in found])
        return
    if not found:
        err_console.print(f"goal {goal}: no accepted checkpoint")
        return
    table = Table("rank", "run", "recipe", "seed", "step", "return mean", "sha256", "play", title=f"checkpoints: {escape(goal)}")
    for i, c in enumerate(found, start=1):
        table.add_row(str(i), c.run_id, escape(c.recipe_id), str(c.seed), f"{c.step:,}" + (" *" if c.promoted else ""),
                      "-" if c.return_mean is None else f"{c.return_mean:.3f}", c.sha256[:16], c.play_command)
    console.print(table)
    console.print("* promoted")


# -- reports ---------------------------------------------------------------------------------------
@reports_app.command("build")
def reports_build(
    goal: Annotated[str | None, typer.Option("--goal", help="Only this goal's page.")] = None,
    out: Annotated[Path, typer.Option("--out", help="The site's folder.")] = Path("reports"),
    json_out: JsonOption = False,
) -> None:
    """Write the static HTML reports (one page per project and goal; images embedded; no network)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from gradlab.results.reports import build_site
    from gradlab.settings import load_settings

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err_console,
                  transient=True) as bar:
        bar.add_task("building the reports", total=None)
        site = _domain(lambda: build_site(load_settings(), open_stores_or_exit(), out, goal=goal))
    for note in site.notes:
        err_console.print(f"warning: left out: {escape(note)}", highlight=False)
    if json_out:
        print_json({"out": str(site.root), "pages": list(site.pages), "goals": list(site.goals),
                    "left_out": list(site.notes)})
        return
    err_console.print(f"wrote {len(site.pages)} pages to {escape(str(site.root.absolute()))}; open "
                      f"{escape(str(site.root.absolute() / 'index.html'))}", highlight=False)


@reports_app.command("sync")
def reports_sync(
    goal: Annotated[str | None, typer.Option("--goal", help="Only this goal's page.")] = None,
    store: Annotated[str | None, typer.Option("--store", help="file:// or s3:// URL (default: "
                                              "GRADLAB_REPORTS_STORE_URL, else the model store).")] = None,
    site: Annotated[Path | None, typer.Option("--site", help="Publish this built site instead of building one.")] = None,
    json_out: JsonOption = False,
) -> None:
    """Build the reports and publish them: create-only under the build's content hash, the index by
    compare-and-swap."""
    import tempfile

    from gradlab.results.reports import build_site, reports_store_url, sync_site
    from gradlab.settings import load_settings
    from gradlab.stores import open_store

    settings = load_settings()
    target = _domain(lambda: open_store(store or reports_store_url(settings)))
    with tempfile.TemporaryDirectory(prefix="gradlab-reports-") as tmp:
        root = site
        if root is None:
            root = Path(tmp) / "site"
            _domain(lambda: build_site(settings, open_stores_or_exit(), root, goal=goal))
        result = _domain(lambda: sync_site(root, target))
    if json_out:
        print_json(result)
        return
    err_console.print(f"build {result['build'][:16]}: {result['files']} files ({result['uploaded']} new) at "
                      f"{escape(result['url'])}")
