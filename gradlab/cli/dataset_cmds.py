"""``gradlab dataset record|verify|list|show|play|export|upload`` (docs/ARCHITECTURE.md section 12)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gradlab.cli.output import console, err_console, fail, print_json, say
from gradlab.errors import GradlabError

dataset_app = typer.Typer(help="Gameplay datasets: record episodes, verify them bit-exactly, export, upload.",
                          no_args_is_help=True)
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]


def _store() -> Any:
    from gradlab.stores import open_dataset_store

    try:
        return open_dataset_store()
    except GradlabError as e:
        fail(str(e))


def _cache() -> Path:
    from gradlab.play.replay import dataset_cache
    from gradlab.settings import load_settings

    return dataset_cache(load_settings())


def run_recording(plan: Any, *, workers: int) -> dict:
    """Run the ``dataset-record`` flow on ``plan`` in this process; the manifest JSON, or exit 1."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.dataset_record import dataset_record
    from gradlab.cli.local_flow import configure_prefect

    api = configure_prefect()
    err_console.print(f"recording dataset [bold]{escape(plan.name)}[/]: {len(plan.episodes)} episodes of "
                      f"{escape(plan.goal_id)} in {len(plan.chunks)} chunks on {workers} workers; Prefect API: "
                      f"{escape(api)}", highlight=False)
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        state = dataset_record(plan=plan.model_dump(mode="json"), workers=workers, return_state=True)
    if not state.is_completed():
        from gradlab.datasets.store import dataset_exists
        from gradlab.stores import open_dataset_store

        if dataset_exists(open_dataset_store(), plan.name):  # another recording stored the name first
            fail(f"dataset {plan.name}: the dataset-record flow ended {state.type.value}: {state.message}; this "
                 "recording stored nothing (its staged files are removed)")
        fail(f"dataset {plan.name}: the dataset-record flow ended {state.type.value}: {state.message} "
             "(no dataset was stored; run the command again)")
    return state.result()


@dataset_app.command("record")
def record(
    name: Annotated[str, typer.Argument(help="The new dataset's name (datasets are immutable).")],
    goal: Annotated[str, typer.Option("--goal", help="The goal id, e.g. CartPole-v1.")],
    policy: Annotated[str, typer.Option("--policy", "--agent", help="RUN[:STEP], a checkpoint folder, hf://OWNER/NAME, random, noop, or human (you, at the web player's keyboard).")],
    episodes: Annotated[int, typer.Option("--episodes", min=1, max=1000, help="Episodes to record.")],
    seeds: Annotated[int | None, typer.Option("--seeds", min=0, help="Base seed of the episode plan (default: the goal's eval.seed); episode seeds follow the evaluation manifest's rule.")] = None,
    frames: Annotated[bool, typer.Option("--frames/--no-frames", help="Also record rendered frames (MP4 per episode).")] = True,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Chunks recorded at once (local evaluation workers).")] = 1,
    chunk: Annotated[int, typer.Option("--chunk", min=1, help="Episodes per chunk (one Prefect task each).")] = 50,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="--agent human: the player's loopback port (0: a free one).")] = 0,
    no_open: Annotated[bool, typer.Option("--no-open", help="--agent human: print the player's URL, open no browser.")] = False,
    json_out: JsonOption = False,
) -> None:
    """Record N episodes of a goal by a policy into the dataset store, as the dataset-record Prefect flow.

    With ``--agent human`` you play them: the web player opens its play-yourself page for the goal
    (keys from the action meanings), and the command ends once the N-th episode has landed.
    """
    from gradlab.datasets.plan import plan_recording
    from gradlab.datasets.store import dataset_exists

    store = _store()
    try:
        if dataset_exists(store, name):
            fail(f"dataset {name!r} exists already in {store.base_url} (datasets are immutable: choose another name)")
        plan = plan_recording(name, goal_id=goal, policy=policy, episodes=episodes, base_seed=seeds, frames=frames,
                              chunk_episodes=chunk, warn=say)
    except GradlabError as e:
        fail(str(e))
    if plan.agent.kind == "human":
        if seeds is not None:
            fail("--seeds: a human recording plays the goal's evaluation manifest (leave --seeds out)", code=2)
        manifest = _record_human(store, name, goal, episodes=episodes, frames=frames, port=port, no_open=no_open)
    else:
        manifest = run_recording(plan, workers=workers)
    if json_out:
        print_json(manifest)
        return
    from gradlab.contracts.dataset import DatasetManifest

    _print_show(DatasetManifest.model_validate(manifest))


def _record_human(store: Any, name: str, goal: str, *, episodes: int, frames: bool, port: int,
                  no_open: bool) -> dict:
    """Serve the player's play-yourself page recording ``name`` until the dataset lands; its manifest JSON.

    The URL goes to stderr (``--json`` keeps stdout for the manifest). Ctrl-C before the last
    episode ends stores no dataset (exit 1).
    """
    from urllib.parse import quote, urlencode

    from gradlab.cli.play_cmds import serve_and_open
    from gradlab.datasets.store import read_dataset
    from gradlab.play.catalog import Catalog
    from gradlab.play.server import PlayConfig, bind_loopback
    from gradlab.settings import load_settings
    from gradlab.stores import open_stores

    try:
        settings = load_settings()
        sock = bind_loopback(port)
        config = PlayConfig(catalog=Catalog(stores=open_stores(settings), settings=settings),
                            port=sock.getsockname()[1], max_sessions=1)
    except GradlabError as e:
        fail(str(e))
    config.on_dataset = lambda _landed: config.shutdown()
    query = urlencode({"dataset": name, "episodes": episodes, **({} if frames else {"frames": 0})})
    url = config.url(f"/human/{quote(goal)}?{query}")

    serve_and_open(config, sock, url, no_open=no_open, announce=lambda: err_console.print(
        f"play {episodes} episode(s) of {escape(goal)} at {escape(url)}", highlight=False, soft_wrap=True))
    try:
        return read_dataset(store, name).as_json()
    except GradlabError:
        fail(f"dataset {name}: the player stopped before {episodes} episode(s) ended; no dataset was stored")


@dataset_app.command("verify")
def verify(
    name: Annotated[str, typer.Argument(help="The dataset.")],
    replay: Annotated[bool, typer.Option("--replay/--files-only", help="Also re-simulate every episode.")] = True,
    json_out: JsonOption = False,
) -> None:
    """Check every file against the manifest, then re-simulate every episode from its seed and actions."""
    from rich.progress import Progress

    from gradlab.datasets.verify import verify_dataset

    try:
        with Progress(console=err_console, transient=True, disable=json_out) as bar:
            task = bar.add_task("re-simulating", total=None)
            report = verify_dataset(_store(), name, cache=_cache(), replay=replay,
                                    progress=lambda done, total: bar.update(task, completed=done, total=total))
    except GradlabError as e:
        fail(str(e))
    if json_out:
        print_json({"name": name, "ok": report.ok, "files_checked": report.files_checked,
                    "file_problems": report.file_problems, "episodes_replayed": report.episodes_replayed,
                    "divergences": report.divergences, "unchecked": report.unchecked,
                    "determinism": report.determinism})
    else:
        for line in report.file_problems + (report.divergences if report.determinism == "deterministic" else []):
            err_console.print(f"[bold red]error:[/] {escape(line)}", highlight=False)
        for line in report.unchecked:
            err_console.print(f"not checked: {escape(line)}", highlight=False)
        if report.ok:
            console.print(f"dataset {escape(name)}: {report.files_checked} files match the manifest; "
                          f"{report.episodes_replayed} episodes re-simulated"
                          + (" bit-exactly" if report.determinism == "deterministic" and replay else ""), highlight=False)
    raise typer.Exit(0 if report.ok else 1)


@dataset_app.command("list")
def list_command(json_out: JsonOption = False) -> None:
    """The datasets in the dataset store."""
    from gradlab.datasets.store import list_datasets, read_dataset

    store = _store()
    manifests, problems = [], []
    try:
        names = list_datasets(store)
    except GradlabError as e:
        fail(str(e))
    for n in names:  # one bad manifest is named; it does not hide the others
        try:
            manifests.append(read_dataset(store, n))
        except GradlabError as e:
            problems.append(str(e))
    if json_out:
        print_json([dataset_summary(m) for m in manifests])
        if problems:
            fail_with_lines(problems)
        return
    table = Table(title=f"datasets in {store.base_url}")
    for col in ("name", "goal", "agent", "episodes", "steps", "return mean", "frames", "created"):
        table.add_column(col)
    for m in manifests:
        s = dataset_summary(m)
        table.add_row(m.name, m.goal_id, s["agent"], str(s["episodes"]), str(s["steps"]),
                      f"{s['return']['mean']:.3f}", "yes" if m.frames else "no", m.created_at[:19])
    console.print(table)
    if problems:
        fail_with_lines(problems)


def fail_with_lines(problems: list[str]) -> None:
    """Print each problem as its own ``error:`` line on stderr, then exit 1."""
    from rich.markup import escape

    for line in problems[:-1]:
        err_console.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
    fail(problems[-1])


def dataset_summary(manifest: Any) -> dict:
    """Counts, return statistics (mean with a bootstrap 95% interval, IQM with its stratified-bootstrap
    interval: :mod:`gradlab.results.stats`), outcomes and provenance of a dataset."""
    from collections import Counter

    import numpy as np

    from gradlab.results.stats import iqm_estimate, stratified_bootstrap_ci

    returns = np.asarray([e.return_ for e in manifest.episodes], dtype=np.float64)
    mean_ci = stratified_bootstrap_ci(returns, statistic=np.mean) if len(returns) > 1 else None
    iqm = iqm_estimate(returns)
    agent = manifest.agent
    label = agent.kind if agent.kind != "checkpoint" else f"{agent.run_id}:{agent.checkpoint_step}"
    return {
        "name": manifest.name, "sha256": manifest.sha256, "goal_id": manifest.goal_id, "agent": label,
        "provenance": agent.model_dump(mode="json"), "episodes": len(manifest.episodes),
        "steps": int(sum(e.length for e in manifest.episodes)),
        "return": {"mean": float(returns.mean()), "mean_low": mean_ci[0] if mean_ci else None,
                   "mean_high": mean_ci[1] if mean_ci else None, "iqm": iqm.as_json(),
                   "min": float(returns.min()), "max": float(returns.max())},
        "length_mean": float(np.mean([e.length for e in manifest.episodes])),
        "outcomes": dict(sorted(Counter(e.outcome for e in manifest.episodes).items())),
        "frames": manifest.frames, "determinism": manifest.determinism,
        "goal_contract_sha256": manifest.goal_contract_sha256, "environment_sha256": manifest.environment_sha256,
        "versions": manifest.versions, "created_at": manifest.created_at, "recording_id": manifest.recording_id,
        "files": len(manifest.files), "bytes": sum(f.size_bytes for f in manifest.files.values()),
    }


def _print_show(manifest: Any) -> None:
    s = dataset_summary(manifest)
    r = s["return"]
    interval = f" [{r['mean_low']:.3f}, {r['mean_high']:.3f}]" if r["mean_low"] is not None else " (one episode: no interval)"
    iqm = r["iqm"]
    iqm_text = f"{iqm['value']:.3f}" + (f" [{iqm['low']:.3f}, {iqm['high']:.3f}]" if iqm["low"] is not None else "")
    table = Table(title=f"dataset {manifest.name} ({s['sha256'][:16]})", show_header=False)
    table.add_column("key")
    table.add_column("value")
    rows = [
        ("goal", f"{manifest.goal_id} (goal {manifest.goal_contract_sha256[:16]}, environment "
                 f"{manifest.environment_sha256[:16]})"),
        ("agent", s["agent"] + (f" ({manifest.agent.publication})" if manifest.agent.publication else "")
         + (f", {manifest.agent.policy_mode}" if manifest.agent.policy_mode else "")),
        ("episodes", f"{s['episodes']} ({s['steps']} steps, mean length {s['length_mean']:.1f})"),
        ("return mean (95% bootstrap)", f"{r['mean']:.3f}{interval}"),
        ("return IQM (95% bootstrap)", iqm_text),
        ("return min / max", f"{r['min']:.3f} / {r['max']:.3f}"),
        ("outcomes", ", ".join(f"{k} {v}" for k, v in s["outcomes"].items())),
        ("frames", "yes" if manifest.frames else "no"), ("replay", manifest.determinism),
        ("files", f"{s['files']} ({s['bytes'] / 1e6:.2f} MB)"),
        ("versions", ", ".join(f"{k} {v}" for k, v in sorted(manifest.versions.items()))),
        ("created", f"{manifest.created_at} ({manifest.recording_id})"),
    ]
    for key, value in rows:
        table.add_row(key, escape(str(value)))
    console.print(table)


@dataset_app.command("show")
def show(name: Annotated[str, typer.Argument(help="The dataset.")], json_out: JsonOption = False) -> None:
    """Counts, return statistics with intervals, and provenance of a dataset."""
    from gradlab.datasets.store import read_dataset

    try:
        manifest = read_dataset(_store(), name)
    except GradlabError as e:
        fail(str(e))
    if json_out:
        print_json({**dataset_summary(manifest), "episodes_detail": [e.model_dump(mode="json", by_alias=True)
                                                                     for e in manifest.episodes]})
    else:
        _print_show(manifest)


@dataset_app.command("play")
def play(
    name: Annotated[str, typer.Argument(help="The dataset.")],
    episode: Annotated[int, typer.Option("--episode", min=0, help="The episode's index (`gradlab dataset show NAME --json` lists them).")] = 0,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="The player's loopback port (0: a free one).")] = 0,
    no_open: Annotated[bool, typer.Option("--no-open", help="Print the URL, open no browser.")] = False,
    max_sessions: Annotated[int, typer.Option("--max-sessions", min=1, max=64, help="Open episodes and playback "
                                              "sessions at once (each a worker process; one more is kept warm).")] = 2,
) -> None:
    """Open a recorded episode in the web player: its frames under the player's scrubber, the recorded
    actions, rewards and returns per step, and its provenance.

    The dataset's files are verified first (a local copy checked against the manifest's sha256); a
    dataset recorded with --no-frames gets its frames re-simulated when its goal is deterministic.
    """
    from urllib.parse import quote

    from gradlab.cli.play_cmds import serve_and_open
    from gradlab.play.catalog import Catalog
    from gradlab.play.replay import prepare_replay
    from gradlab.play.server import PlayConfig, bind_loopback
    from gradlab.settings import load_settings
    from gradlab.stores import open_stores

    try:
        settings = load_settings()
        prepare_replay(settings, name, episode)  # missing dataset or episode, or a file that does not verify: exit 1
        sock = bind_loopback(port)
        config = PlayConfig(catalog=Catalog(stores=open_stores(settings), settings=settings),
                            port=sock.getsockname()[1], max_sessions=max_sessions)
    except GradlabError as e:
        fail(str(e))
    url = config.url(f"/datasets/{quote(name)}/episodes/{episode}")
    serve_and_open(config, sock, url, no_open=no_open,
                   announce=lambda: console.print(url, highlight=False, soft_wrap=True))
    err_console.print("gradlab dataset play: stopped", highlight=False)


def _local_copy(name: str) -> tuple[Any, Path]:
    from gradlab.datasets.store import fetch_dataset, read_dataset

    store = _store()
    manifest = read_dataset(store, name)
    return manifest, fetch_dataset(store, manifest, _cache())


@dataset_app.command("export")
def export(
    name: Annotated[str, typer.Argument(help="The dataset.")],
    fmt: Annotated[str, typer.Option("--format", help="minari or hf (a Hugging Face dataset folder).")],
    out: Annotated[Path | None, typer.Option("--out", help="minari: the Minari datasets folder (MINARI_DATASETS_PATH); hf: the new folder. Default: ./<name>-<format>.")] = None,
) -> None:
    """Write the dataset in Minari's layout or as a Hugging Face dataset folder (files verified first)."""
    from gradlab.datasets.export import FORMATS, export_hf, export_minari

    if fmt not in FORMATS:
        fail(f"--format: expected one of {', '.join(FORMATS)}, found {fmt!r}", code=2)
    out = out or Path(f"{name}-{fmt}")
    try:
        manifest, folder = _local_copy(name)
        if fmt == "minari":
            dataset_id = export_minari(manifest, folder, out)
            console.print(f"Minari dataset {dataset_id} in {escape(str(out))} (MINARI_DATASETS_PATH={escape(str(out))} "
                          f"python -c \"import minari; minari.load_dataset('{dataset_id}')\")", highlight=False)
        else:
            written = export_hf(manifest, folder, out, summary=dataset_summary(manifest))
            console.print(f"Hugging Face dataset folder {escape(str(written))} (datasets.load_dataset('{escape(str(written))}'))",
                          highlight=False)
    except GradlabError as e:
        fail(str(e))


@dataset_app.command("upload")
def upload(
    name: Annotated[str, typer.Argument(help="The dataset.")],
    repo: Annotated[str, typer.Argument(help="OWNER/NAME of the Hugging Face dataset repository.")],
    out: Annotated[Path | None, typer.Option("--out", help="Where the folder is built (kept). Default: a temporary folder.")] = None,
    private: Annotated[bool, typer.Option("--private", help="Create the repository private.")] = False,
) -> None:
    """Export the dataset as a Hugging Face dataset (with a dataset card) and upload it when a token is configured."""
    import tempfile

    from gradlab.datasets.export import export_hf
    from gradlab.datasets.hub import upload_dataset
    from gradlab.share.hub import hf_token, parse_hf_ref

    try:
        repo_id = parse_hf_ref(repo if repo.startswith("hf://") else f"hf://{repo}")
        manifest, folder = _local_copy(name)
        target = out or Path(tempfile.mkdtemp(prefix=f"gradlab-dataset-{name}-")) / "repo"
        export_hf(manifest, folder, target, summary=dataset_summary(manifest))
        token = hf_token()
        if not token:  # as publish: nothing uploaded is a failure, and the built folder is kept
            fail(f"no Hugging Face token (set HF_TOKEN, [hub] token_ref in the config file, or run `hf auth login`): "
                 f"nothing uploaded; the dataset folder is kept at {target}; upload it with "
                 f"`hf upload {repo_id} {target} --repo-type dataset` or run this command again with a token")
        url = upload_dataset(target, repo_id, token=token, manifest=manifest, private=private)
    except GradlabError as e:
        fail(str(e))
    console.print(f"uploaded dataset {escape(name)} to hf://datasets/{repo_id}: {escape(url)}", highlight=False)
