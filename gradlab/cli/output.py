"""Shared CLI output helpers: rich console on stderr for humans, JSON on stdout for machines."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console

# No emoji codes (":abc:" in a message stays text); a wide page when output is not a terminal, so
# piped tables and hashes are not cut at 80 columns.
console = Console(emoji=False, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, emoji=False, width=None if sys.stderr.isatty() else 200)


def print_json(value: Any) -> None:
    """One JSON document on stdout, nothing else."""
    sys.stdout.write(json.dumps(value, indent=None, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def fail(message: str, code: int = 1) -> NoReturn:
    """Print an error to stderr and exit with ``code``."""
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(code)


def fail_with_problems(error: Any) -> NoReturn:
    """Print every problem of a ``ConfigError`` and exit 1.

    One line each, with the ``error:`` prefix of :func:`fail`: ``error: file: key path: message``
    (e.g. ``error: --set: train.timestepz: unknown key (did you mean timesteps?)``).
    """
    from rich.markup import escape

    for problem in error.problems:
        err_console.print(f"[bold red]error:[/] {escape(problem.render())}", highlight=False, markup=True,
                          soft_wrap=True)
    raise typer.Exit(1)
