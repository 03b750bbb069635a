"""The command line itself: every subcommand answers ``--help`` (exit 0, its usage), and a malformed
command line (unknown option, missing argument, a non-number where a number goes) exits 2 with the
command's usage, before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from gradlab.cli.app import app

REPO = Path(__file__).resolve().parents[2]


def _commands(group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path under ``group`` (typer's groups carry their subcommands in ``commands``)."""
    found = []
    for name, command in sorted(group.commands.items()):
        path = (*prefix, name)
        found.append(path)
        if isinstance(getattr(command, "commands", None), dict):
            found += _commands(command, path)
    return found


COMMANDS = _commands(typer.main.get_command(app))


def test_the_command_tree_is_the_documented_one() -> None:
    """The walk below really covers the app (so a command added later gets its --help checked)."""
    top = {path[0] for path in COMMANDS}
    assert {"validate", "train", "eval", "runs", "experiment", "env", "server", "pools", "benchmark"} <= top
    assert ("experiment", "retry") in COMMANDS and ("runs", "reconcile") in COMMANDS and ("env", "inspect") in COMMANDS
    assert len(COMMANDS) >= 30


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_subcommand_has_help(path: tuple[str, ...]) -> None:
    out = CliRunner().invoke(app, [*path, "--help"])
    assert out.exit_code == 0, out.output
    assert f"Usage: gradlab {' '.join(path)}" in " ".join(out.output.split()), out.output  # rich may wrap
    command = typer.main.get_command(app)
    for part in path:
        command = command.commands[part]  # type: ignore[attr-defined]
    assert (command.help or command.short_help or "").strip(), f"gradlab {' '.join(path)} has no help text"


MALFORMED = [
    ["validate", "--no-such-option"],
    ["train"],                                            # GOAL/RECIPE missing
    ["train", "gradlab__bandit/ppo", "--seed", "two"],    # not a number
    ["eval", "some-run", "--episodes", "many"],
    ["runs", "retry"],
    ["experiment", "wait", "--run", "x", "--until", "terminal", "--bogus"],
    ["nonexistent-command"],
]


@pytest.mark.parametrize("args", MALFORMED, ids=" ".join)
def test_a_malformed_command_line_exits_2_with_usage(args: list[str]) -> None:
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 2, out.output
    assert "Usage: gradlab" in " ".join(out.output.split())


@pytest.mark.parametrize("args", [MALFORMED[2], MALFORMED[6]], ids=" ".join)
def test_the_console_script_exits_2_on_a_malformed_command_line(args: list[str], tmp_path: Path) -> None:
    """The installed ``gradlab`` script, as a user runs it: usage on stderr, nothing on stdout, nothing created."""
    home = tmp_path / "home"
    script = Path(sys.executable).with_name("gradlab")  # the installed console script (project.scripts)
    out = subprocess.run([str(script), *args], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "GRADLAB_HOME": str(home)}, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Usage: gradlab" in out.stderr and out.stdout == ""
    assert not home.exists()
