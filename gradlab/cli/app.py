"""The ``gradlab`` typer application: every command is registered here."""

from __future__ import annotations

import typer

from gradlab.cli import benchmark_cmds, contracts_cmds

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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
