"""``gradlab validate``, ``gradlab goals list``, ``gradlab recipe show``.

These commands must not import torch or prefect: they answer in well under 2 s.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from gradlab.cli.output import console, err_console, fail, fail_with_problems, print_json
from gradlab.errors import ConfigError, NotFound

goals_app = typer.Typer(help="Browse goals.", no_args_is_help=True)
recipe_app = typer.Typer(help="Inspect recipes.", no_args_is_help=True)

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a recipe key: dotted.key=value (YAML scalar). Repeatable."),
]


def _experiments():
    from gradlab.contracts import Experiments

    try:
        return Experiments()
    except NotFound as e:
        fail(str(e))


def validate(json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False) -> None:
    """Compose and validate every goal, recipe, preset, the catalog and prefect.yaml; check that every goal's
    environment exists in its provider, with valid provider arguments and its ROM present (no emulator starts)."""
    experiments = _experiments()
    report = experiments.validate_all()
    report.problems += _deployment_problems(experiments)
    missing: list = []
    report.problems += _environment_problems(experiments, missing=missing)
    if json_out:
        print_json({"goals": report.goals, "recipes": report.recipes, "presets": report.presets,
                    "errors": [p.as_json() for p in report.problems],
                    "missing": [p.as_json() for p in missing]})
    else:
        for problem in report.problems:
            err_console.print(escape(problem.render()), highlight=False)
        for problem in missing:
            err_console.print(f"[yellow]missing here:[/] {escape(problem.render())}", highlight=False)
        status = "[green]ok[/]" if report.ok else f"[red]{len(report.problems)} problem(s)[/]"
        lacking = f"; {len(missing)} goal(s) need a file this machine lacks (see above)" if missing else ""
        console.print(f"{report.goals} goals, {report.recipes} recipes, {report.presets} presets: {status}{lacking}")
    if not report.ok:
        raise typer.Exit(1)


def _environment_problems(experiments, refs: list[str] | None = None, *, missing: list | None = None) -> list:
    """Every goal's environment checked against its provider (env id, provider args, ROM, starts), no
    emulator. With ``missing``, a ROM this machine lacks goes there (a contract can be valid without
    it: ``gradlab train`` refuses it here, ``validate`` reports it apart and does not fail)."""
    from gradlab.envs.preflight import environment_problems

    return environment_problems(experiments, refs, missing=missing)


def _deployment_problems(experiments) -> list:
    """Problems of the checkout's ``prefect.yaml`` deployments (none outside a checkout); no prefect import."""
    from gradlab.deploy.project import find_project_root, validate_deployments

    root = find_project_root()
    return validate_deployments(root, experiments) if root is not None else []


@goals_app.command("list")
def goals_list(json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False) -> None:
    """List goals: id, title, project, provider, env id, evaluation mode, recipes."""
    from gradlab.envs.preflight import missing_files

    experiments = _experiments()
    rows, problems = [], []
    try:
        catalog = experiments.catalog
    except ConfigError as e:
        fail(str(e))
    for goal_id in experiments.goal_ids():
        try:
            goal = experiments.load_goal(goal_id)
        except ConfigError as e:
            problems += e.problems
            continue
        rows.append({
            "goal_id": goal_id, "title": goal.title, "project": catalog.project_of(goal_id),
            "provider": goal.train.environment.provider, "env_id": goal.train.environment.env_id,
            "evaluation_mode": goal.evaluation_mode, "recipes": experiments.recipe_ids(goal_id),
            "missing": missing_files(goal.train.environment),
        })
    if json_out:
        print_json(rows)
    else:
        table = Table("goal", "title", "project", "provider", "env id", "mode", "recipes")
        for r in rows:
            table.add_row(r["goal_id"], r["title"], r["project"] or "-", r["provider"], r["env_id"],
                          r["evaluation_mode"], ", ".join(r["recipes"]) + (" [yellow](ROM missing)[/]" if r["missing"] else ""))
        console.print(table)
        for message in dict.fromkeys(m for r in rows for m in r["missing"]):
            err_console.print(f"[yellow]missing here:[/] {escape(message)}", highlight=False)
    for problem in problems:
        err_console.print(escape(problem.render()), highlight=False)
    if problems:
        raise typer.Exit(1)


@recipe_app.command("show")
def recipe_show(
    ref: Annotated[str, typer.Argument(help="GOAL/RECIPE")],
    overrides: SetOption = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Show the fully composed, validated contract of GOAL/RECIPE and its hashes; on stderr, what
    would keep `gradlab train` from running it on this machine (a missing ROM, fp16-amp without
    CUDA, ...), which does not make the contract invalid (exit 0)."""
    resolved = resolve_or_exit(ref, overrides)
    if json_out:
        print_json(resolved.as_json())
    else:
        import yaml

        console.print(f"[bold]{resolved.ref}[/]")
        for name, value in resolved.hashes.as_dict().items():
            console.print(f"  {name}: {value}")
        console.print(escape(yaml.safe_dump(resolved.contract(), sort_keys=False)), highlight=False)
    problems = runnable_problems(resolved)
    if problems:
        err_console.print(f"[yellow]not runnable on this machine[/] ({len(problems)} problem(s); "
                          "`gradlab train` refuses it here):")
        for problem in problems:
            err_console.print(escape(problem.render()), highlight=False)


def runnable_or_exit(resolved) -> None:
    """Exit 1 naming every problem of :func:`runnable_problems`."""
    problems = runnable_problems(resolved)
    if problems:
        fail_with_problems(ConfigError(problems))


def runnable_problems(resolved) -> list:
    """Why ``resolved`` cannot train on this machine: its training environment cannot be built
    (unknown env id, bad provider arguments, missing ROM), or its recipe asks the learner for what
    it refuses here (:func:`gradlab.envs.preflight.training_problems`, and a minibatch larger than
    the rollout: :func:`gradlab.learn.backend_config.validate_backend_config`); found without
    starting an emulator. Empty when it can."""
    from gradlab.envs.preflight import cuda_present, start_problems, static_check, training_problems
    from gradlab.errors import ConfigProblem

    env, goal_env = resolved.environment, resolved.goal.train.environment
    same = (env.provider, env.env_id, env.provider_args) == (goal_env.provider, goal_env.env_id, goal_env.provider_args)
    experiments = _experiments()

    def blame(key: str, message: str) -> ConfigProblem:
        path = ("train", "environment", *key.split("."))
        if same:  # the goal's own environment: the fragment (and line) that set the key
            try:
                return experiments.goal_problem(resolved.goal.goal_id, path, message)
            except (ConfigError, NotFound):
                pass
        file = resolved.goal_file if same else ("--set" if resolved.overrides else resolved.recipe_file)
        return ConfigProblem(file=file, key_path=".".join(p for p in path if p), message=message)

    problems = [blame(key, message) for key, message in static_check(env)]
    problems += start_problems(experiments, resolved.goal.goal_id, resolved.goal)
    recipe_file = "--set" if resolved.overrides else resolved.recipe_file
    problems += [ConfigProblem(file=recipe_file, key_path=key, message=message)
                 for key, message in training_problems(resolved)]
    train = resolved.recipe.train
    if train.backend.id in ("sb3.ppo", "sb3.a2c", "gradlab.ppo"):  # the rollout's shape against the lanes
        from gradlab.learn.backend_config import validate_backend_config

        try:
            validate_backend_config(train, env.n_envs)
        except ConfigError as e:
            for line in str(e).splitlines():
                key, _, message = line.partition(": ")
                problems.append(ConfigProblem(file=recipe_file, key_path=key, message=message))
    if train.backend.id == "gradlab.ppo" and train.device == "cuda" and not cuda_present():
        # This machine only (so not in `validate`: a recipe for a GPU pool validates on a laptop);
        # gradlab.ppo's own message at set-up (sb3.* fall back to the CPU by themselves).
        problems.append(ConfigProblem(file=recipe_file, key_path="train.device",
                                      message="cuda asked for, but torch sees no CUDA device"))
    return problems


def resolve_or_exit(ref: str, overrides: list[str] | None):
    """Resolve GOAL/RECIPE or print every problem and exit 1."""
    experiments = _experiments()
    try:
        return experiments.resolve(ref, overrides or [])
    except ConfigError as e:
        fail_with_problems(e)
    except NotFound as e:
        fail(str(e))
