"""Shared CLI output helpers: rich console on stderr for humans, JSON on stdout for machines."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)


def print_json(value: Any) -> None:
    """One JSON document on stdout, nothing else."""
    sys.stdout.write(json.dumps(value, indent=None, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def fail(message: str, code: int = 1) -> NoReturn:
    """Print an error to stderr and exit with ``code``."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(code)
