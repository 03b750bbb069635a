"""The terminal's rich consoles and the one-JSON-document writer, below every package that prints.

The CLI (:mod:`gradlab.cli.output`, which adds its error exits) and the benchmarks print through
these, so a command and a benchmark it runs share one console per stream.

Public names:
    console: rich console on stdout. err_console: rich console on stderr (progress, notes, errors).
    print_json(value): one JSON document on stdout, nothing else.
    plural(n, word): ``1 run``, ``3 runs`` (every count a person reads).

Both consoles size their page by whether their stream is a terminal when this module is first
imported, so a process that takes over another's descriptors before it runs a command (the warm
flow's child, ``gradlab.cli.warm_flow``) imports it only after it has taken them.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

# No emoji codes (":abc:" in a message stays text); a wide page when output is not a terminal, so
# piped tables and hashes are not cut at 80 columns.
console = Console(emoji=False, width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, emoji=False, width=None if sys.stderr.isatty() else 200)


def print_json(value: Any) -> None:
    """One JSON document on stdout, nothing else.

    Args:
        value: anything ``json.dumps`` takes; other objects are written as their ``str``.
    """
    sys.stdout.write(json.dumps(value, indent=None, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def plural(n: int, word: str) -> str:
    """``1 seed``, ``3 seeds``: a count with its noun in the right number (``word`` is the singular)."""
    return f"{n} {word}{'' if n == 1 else 's'}"
