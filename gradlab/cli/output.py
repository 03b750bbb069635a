"""Shared CLI output helpers: rich console on stderr for humans, JSON on stdout for machines.

The consoles and :func:`print_json` are :mod:`gradlab.console`'s (below the CLI, so the benchmarks
print through them too); this module adds the error exits of the commands.
"""

from __future__ import annotations

from typing import Any, NoReturn

import typer

from gradlab.console import console, err_console, print_json

__all__ = ["console", "err_console", "fail", "fail_with_problems", "print_json", "say"]


def say(line: str) -> None:
    """Print one note on stderr as it is (rich markup, no highlighting): what a domain call's
    ``say``/``warn`` callback is given by the commands."""
    err_console.print(line, highlight=False)


def say_text(line: str) -> None:
    """Print one plain-text note on stderr (no markup, no highlighting), one line however long: a
    log that collects it stays greppable (the terminal wraps it for the eye)."""
    from rich.markup import escape

    err_console.print(escape(line), highlight=False, soft_wrap=True)


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
