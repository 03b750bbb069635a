"""``gradlab benchmark ...``: speed is measured by these commands, never by timed tests.

Each sub-command lives in ``gradlab/benchmarks/<name>.py`` and is registered here.
"""

from __future__ import annotations

import typer

benchmark_app = typer.Typer(help="Measure speed against the bare libraries (prints a table of ratios).",
                            no_args_is_help=True)
