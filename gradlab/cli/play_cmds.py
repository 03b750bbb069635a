"""``gradlab play [SOURCE]``: watch a policy play in the browser, or record episodes as MP4.

SOURCE is ``RUN_ID[:STEP]`` (default the promoted checkpoint, else the newest), a checkpoint folder,
or a checkpoint URI in a configured store (``file://...`` or ``s3://.../runs/<run>/checkpoints/
<step>-<sha16>/``); ``--recipe GOAL/RECIPE`` plays the newest promoted checkpoint of that recipe;
no SOURCE opens the catalog. The source is resolved and verified before any server starts, so a
bad one is one error line and exit 1. docs/ARCHITECTURE.md section 12.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from gradlab.cli.output import console, err_console, fail, say


def _newest_promoted(stores: Any, recipe: str) -> str:
    """The run id of the newest run of ``GOAL/RECIPE`` with a promotion."""
    from gradlab import receipts as rules

    goal_id, _, recipe_id = recipe.rpartition("/")  # a nested goal id keeps its '/'
    if not goal_id or not recipe_id:
        fail(f"--recipe {recipe}: expected GOAL/RECIPE, e.g. CartPole-v1/ppo")
    for run_id in reversed(rules.list_runs(stores)):
        rec = rules.read_run(stores, run_id)
        if (rec.goal_id, rec.recipe_id) == (goal_id, recipe_id) and rules.read_promotion(stores, run_id):
            return run_id
    fail(f"--recipe {recipe}: no run of it with a promoted checkpoint in {stores.control.base_url} "
         "(`gradlab runs list` lists the runs)")


def _resolve(source: str, settings: Any, stores: Any) -> Any:
    from gradlab.checkpoints.resolve import resolve_checkpoint, resolve_store_uri

    if source.startswith("hf://"):  # a published repository: every file checked against gradlab.json
        from gradlab.share.hub import resolve_repo

        return resolve_repo(source)
    if not source.startswith("s3://"):
        return resolve_checkpoint(source, settings=settings, stores=stores, warn=say)
    return resolve_store_uri(source, stores=stores, settings=settings, warn=say)


def play_command(
    source: Annotated[str | None, typer.Argument(help="RUN_ID[:STEP], a checkpoint folder or URI, or hf://OWNER/NAME; none: the catalog.")] = None,
    recipe: Annotated[str | None, typer.Option("--recipe", help="GOAL/RECIPE: its newest promoted checkpoint.")] = None,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Loopback port (0: a free one).")] = 0,
    no_open: Annotated[bool, typer.Option("--no-open", help="Do not open a browser.")] = False,
    fps: Annotated[float, typer.Option("--fps", min=0.0, max=1000.0, help="Steps per second (0: as fast as possible).")] = 30.0,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the first episode.")] = 0,
    deterministic: Annotated[bool, typer.Option("--deterministic/--stochastic", help="Greedy or sampled actions.")] = True,
    record: Annotated[Path | None, typer.Option("--record", help="Write episodes to this MP4 (headless, no server).")] = None,
    episodes: Annotated[int, typer.Option("--episodes", min=1, help="Episodes to record with --record.")] = 1,
    max_sessions: Annotated[int, typer.Option("--max-sessions", min=1, max=64, help="Live playback sessions at once "
                                              "(each a worker process of about 400 MB; one more is kept warm).")] = 2,
) -> None:
    """Browse projects, goals, runs and checkpoints and watch a policy play, with live telemetry."""
    from gradlab.errors import GradlabError
    from gradlab.settings import load_settings
    from gradlab.stores import open_stores

    if source is not None and recipe is not None:
        fail("give SOURCE or --recipe, not both", code=2)
    try:
        settings = load_settings()
        stores = open_stores(settings)
        if recipe is not None:
            source = _newest_promoted(stores, recipe)
        resolved = _resolve(source, settings, stores) if source is not None else None
        if record is not None:
            if resolved is None:
                fail("--record needs SOURCE or --recipe (what to record)", code=2)
            _record(resolved, record, episodes=episodes, fps=fps or 30.0, seed=seed, deterministic=deterministic)
            return
        from gradlab.play.catalog import Catalog
        from gradlab.play.server import PlayConfig, bind_loopback

        catalog = Catalog(stores=stores, settings=settings)
        path = "/"
        if resolved is not None:
            run_id, step = catalog.pin(resolved)
            path = f"/runs/{run_id}/checkpoints/{step}"
        sock = bind_loopback(port)
        config = PlayConfig(catalog=catalog, port=sock.getsockname()[1], fps=fps, seed=seed,
                            deterministic=deterministic, max_sessions=max_sessions)
    except GradlabError as e:
        fail(str(e))
    url = config.url(path)
    serve_and_open(config, sock, url, announce=lambda: console.print(url, highlight=False, soft_wrap=True),
                   no_open=no_open)
    err_console.print("gradlab play: stopped", highlight=False)


def serve_and_open(config: Any, sock: Any, url: str, *, announce: Callable[[], None], no_open: bool) -> None:
    """Serve the player on ``sock`` until it stops or Ctrl-C; once it listens, ``announce`` the URL
    and (unless ``no_open``) open ``url`` in the user's browser."""
    from gradlab.play.server import serve

    def ready() -> None:
        announce()
        if not no_open:
            import webbrowser

            webbrowser.open(url)

    try:
        serve(config, sock=sock, ready=ready)
    except KeyboardInterrupt:
        pass


def _record(resolved: Any, out: Path, *, episodes: int, fps: float, seed: int, deterministic: bool) -> None:
    """Play ``episodes`` episodes headless and write them as one MP4 (:mod:`gradlab.play.record`)."""
    from rich.progress import Progress

    from gradlab.play.record import record_episodes
    from gradlab.play.session import PlaybackSession, verify_mode

    if not out.parent.is_dir():
        fail(f"--record {out}: folder {out.parent} does not exist")
    session = PlaybackSession(resolved.path, resolved.spec, deterministic=deterministic, seed=seed,
                              verify=verify_mode(resolved))
    try:
        with Progress(console=err_console, transient=True) as progress:
            task = progress.add_task("recording", total=episodes)
            count, returns = record_episodes(session, out, episodes=episodes, fps=fps, seed=seed,
                                             on_episode=lambda _: progress.advance(task))
    finally:
        session.close()
    console.print(f"{out}: {count} frames, {episodes} episode(s), return {', '.join(f'{r:g}' for r in returns)}",
                  highlight=False)
