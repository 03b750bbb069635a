"""The ``gradlab`` typer application: every command is registered here."""

from __future__ import annotations

import typer
from rich.markup import escape

from gradlab.cli import (
    benchmark_cmds,
    contracts_cmds,
    dataset_cmds,
    env_cmds,
    eval_cmds,
    experiment_cmds,
    play_cmds,
    pools_cmds,
    results_cmds,
    runs_cmds,
    server_cmds,
    share_cmds,
    train_cmds,
)

app = typer.Typer(
    name="gradlab",
    help="gradlab: train, evaluate, compare, inspect and publish game-playing agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command("validate")(contracts_cmds.validate)
app.add_typer(contracts_cmds.goals_app, name="goals")
app.add_typer(contracts_cmds.recipe_app, name="recipe")
app.add_typer(benchmark_cmds.benchmark_app, name="benchmark")
# Further command groups are registered below, one line each.
app.command("train")(train_cmds.train)
app.add_typer(runs_cmds.runs_app, name="runs")
app.add_typer(server_cmds.server_app, name="server")
app.add_typer(env_cmds.env_app, name="env")
app.add_typer(env_cmds.rom_app, name="rom")
app.command("eval")(eval_cmds.eval_command)
app.add_typer(pools_cmds.pools_app, name="pools")
app.add_typer(experiment_cmds.experiment_app, name="experiment")
app.command("play")(play_cmds.play_command)
runs_cmds.runs_app.command("curves")(results_cmds.curves)
app.command("sweep")(results_cmds.sweep)
app.command("compare")(results_cmds.compare)
app.add_typer(results_cmds.leaders_app, name="leaders")
app.add_typer(results_cmds.reports_app, name="reports")
app.command("export")(share_cmds.export_command)
app.command("publish")(share_cmds.publish_command)
app.add_typer(dataset_cmds.dataset_app, name="dataset")


def _secure_home() -> None:
    """Private files from the first write on (docs/ARCHITECTURE.md section 9); a broken config is
    reported by the command that reads it, not here."""
    from gradlab.errors import ConfigError
    from gradlab.settings import load_settings, secure_home

    try:
        secure_home(load_settings())
    except ConfigError:
        pass


def main() -> None:
    """The console script: a gradlab error anywhere ends as one clear line and exit 1, no traceback."""
    from gradlab.errors import GradlabError

    try:
        _secure_home()
        app()
    except GradlabError as e:
        from gradlab.cli.output import err_console

        err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
