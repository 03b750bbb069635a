"""``gradlab env list|inspect|preflight`` and ``gradlab rom import|status``.

``env list`` stays cheap: providers are described from package metadata and their id lists; no
emulator is started and torch is never imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from gradlab.cli.output import console, err_console, fail, fail_with_problems, print_json
from gradlab.errors import ConfigError, GradlabError, NotFound

env_app = typer.Typer(help="Environment providers: list, inspect, preflight.", no_args_is_help=True)
rom_app = typer.Typer(help="stable-retro ROMs: import (hash-verified) and status.", no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]


@env_app.command("list")
def env_list(json_out: JsonOption = False) -> None:
    """Providers, whether each is available here, its package version and its environment ids."""
    from gradlab.envs.registry import list_providers

    rows = list_providers()
    if json_out:
        print_json([{k: r[k] for k in ("provider", "available", "version", "env_ids")} for r in rows])
        return
    table = Table("provider", "available", "version", "environments")
    for r in rows:
        ids = r["env_ids"]
        shown = ", ".join(ids[:8]) + (f", … ({len(ids)} in all)" if len(ids) > 8 else "")
        table.add_row(r["provider"], "yes" if r["available"] else f"no: {r['reason']}", r["version"] or "-",
                      escape(shown))
    console.print(table)


@env_app.command("inspect")
def env_inspect(
    ref: Annotated[str, typer.Argument(help="PROVIDER:ENV_ID, e.g. gymnasium:CartPole-v1 or ale:Breakout, or a GOAL "
                                            "(its training environment, action profile included)")],
    settings: Annotated[list[str] | None, typer.Option(
        "--set", help="An environment setting: dotted.key=value (YAML scalar), e.g. preprocessing.frame_skip=2 or "
                      "provider_args.use_fire_reset=true. Repeatable.")] = None,
    json_out: JsonOption = False,
) -> None:
    """Observation space, action space, action meanings, render shape, native max steps and the provider's
    settings (for ale: frame skip, sticky actions, action set, noop max, max-pool, episode cap in frames and steps).
    Under a goal's action profile the actions are the profile's, each with the native buttons it presses."""
    from gradlab.envs.registry import describe

    try:
        info = describe(_inspect_spec(ref, settings or []))
    except ConfigError as e:
        fail_with_problems(e)
    except (GradlabError, ImportError) as e:
        fail(str(e))
    data = info.as_json()
    if json_out:
        print_json(data)
        return
    table = Table("field", "value", show_header=False)
    for key in ("provider", "env_id", "version", "observation_space", "obs_dtype", "action_space", "n_actions",
                "action_meanings", "render_shape", "native_max_steps"):
        value = data[key]
        table.add_row(key, escape(", ".join(value) if key == "action_meanings" else str(value)))
    for key, value in data["extra"].items():
        if key == "profile_actions":
            value = ", ".join(f"{i} {a['name']} = {'+'.join(a['buttons']) or 'no button'}" for i, a in enumerate(value))
        table.add_row(escape(_EXTRA_LABELS.get(key, key.replace("_", " "))), escape(str(value)))
    console.print(table)


#: Labels of provider facts in ``env inspect``'s table (the JSON keeps the field names).
_EXTRA_LABELS = {
    "repeat_action_probability": "sticky-action probability",
    "max_pool": "max-pool (last 2 frames)",
    "max_frames_per_episode": "episode cap (emulator frames)",
    "max_steps_per_episode": "episode cap (agent steps)",
    "profile_actions": "profile actions (native buttons)",
    "native_action_space": "native action space",
}


def _inspect_spec(ref: str, settings: list[str]):
    """The EnvironmentSpec of ``PROVIDER:ENV_ID`` with ``--set`` settings applied (validated).

    Raises:
        NotFound: ``ref`` is not PROVIDER:ENV_ID. ConfigError: a malformed or invalid setting (names it).
    """
    from pydantic import ValidationError

    from gradlab.contracts.compose import parse_override, set_path
    from gradlab.contracts.environment import EnvironmentSpec
    from gradlab.errors import ConfigProblem

    provider, sep, env_id = ref.partition(":")
    if not sep:  # a goal: its training environment as composed (an action profile resolved)
        from gradlab.contracts import Experiments

        data: dict = Experiments().load_goal(ref).train.environment.model_dump(mode="json")
    elif not provider or not env_id:
        raise NotFound(f"expected PROVIDER:ENV_ID or GOAL, found {ref!r}")
    else:
        data = {"provider": provider, "env_id": env_id}
    for text in settings:
        key, value = parse_override(text)
        set_path(data, key, value)
    try:
        return EnvironmentSpec.model_validate(data)
    except ValidationError as e:
        raise ConfigError([ConfigProblem(file="--set", key_path=".".join(str(p) for p in err["loc"]),
                                         message=err["msg"].removeprefix("Value error, "))
                           for err in e.errors(include_url=False)]) from None


@env_app.command("preflight")
def env_preflight(
    ref: Annotated[str, typer.Argument(help="GOAL/RECIPE (or GOAL: its training environment)")],
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a recipe key: dotted.key=value (YAML scalar). Repeatable.")] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Vector steps of random actions.")] = 200,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Run seed (lane seeds derive from it).")] = 0,
    json_out: JsonOption = False,
) -> None:
    """Build the vector env exactly as training will, step random actions and check it (exit 1 on failure)."""
    from gradlab.contracts import Experiments
    from gradlab.envs.preflight import preflight

    try:
        experiments = Experiments()
        if "/" in ref:
            spec = experiments.resolve(ref, overrides or []).environment
        else:
            if overrides:
                fail("--set needs GOAL/RECIPE")
            spec = experiments.load_goal(ref).train.environment
    except ConfigError as e:
        fail_with_problems(e)
    except NotFound as e:
        fail(str(e))
    report = preflight(spec, steps=steps, seed=seed, target=ref)
    if json_out:
        print_json(report.as_json())
    else:
        console.print(f"[bold]{escape(ref)}[/] → {report.provider}:{escape(report.env_id)}")
        for c in report.checks:
            mark = "[green]ok[/]" if c["ok"] else "[red]FAIL[/]"
            detail = "" if c["ok"] and c["name"] != "build" else f" — {escape(c['detail'])}"
            console.print(f"  {mark} {c['name']}{detail}")
        if report.obs_shape is not None:
            console.print(f"  observation {tuple(report.obs_shape)} {report.obs_dtype}; actions {report.action_space}")
            console.print(f"  {report.steps} steps × {report.n_envs} lanes: {report.episodes} episodes "
                          f"{report.outcomes}; {report.steps_per_s} steps/s")
    if not report.ok:
        raise typer.Exit(1)


@rom_app.command("import")
def rom_import(
    path: Annotated[Path, typer.Argument(help="A ROM file or a folder of ROMs.")],
    json_out: JsonOption = False,
) -> None:
    """Import ROMs whose sha1 matches stable-retro's game data into $GRADLAB_HOME/roms/retro."""
    from gradlab.envs.roms import import_roms

    try:
        rows = import_roms(path)
    except GradlabError as e:
        fail(str(e))
    if json_out:
        print_json(rows)
    else:
        for r in rows:
            if r["game"]:
                console.print(f"[green]{r['status']}[/] {escape(r['file'])} → {r['game']} ({r['dest']})")
            else:
                err_console.print(f"[yellow]{r['status']}[/] {escape(r['file'])} (sha1 {r['sha1']}): "
                                  "matches no stable-retro game")
    if not any(r["game"] for r in rows):
        raise typer.Exit(1)


@rom_app.command("status")
def rom_status_cmd(json_out: JsonOption = False) -> None:
    """ROMs usable here: bundled with stable-retro or imported, each with its sha1 re-verified."""
    from gradlab.envs.roms import rom_cache_dir, rom_status

    rows = rom_status()
    if json_out:
        print_json({"cache": str(rom_cache_dir()), "roms": rows})
        return
    table = Table("game", "source", "verified", "sha1", "path")
    for r in rows:
        table.add_row(r["game"], r["source"], "yes" if r["verified"] else "[red]NO[/]", r["sha1"], escape(r["path"]))
    console.print(table)
    console.print(f"cache: {rom_cache_dir()}")
