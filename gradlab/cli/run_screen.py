"""The live screen of a run on a terminal (``gradlab train``, ``runs retry``, ``experiment follow``):
one rich renderable redrawn in place by :class:`rich.live.Live` (docs/ARCHITECTURE.md section 8).

It shows step and steps/s, time left, the recent return with a sparkline of its history, the
latest update losses, the checkpoints ready/published/evaluated/accepted, the evaluations table
(checkpoint step, return mean with its 95% interval, success rate with its Wilson interval,
verdict, seconds), and the stop reason. Presentation only: every reading is
:class:`gradlab.runs.progress.RunProgress`'s; off a terminal the run shows change-only lines
instead (:mod:`gradlab.cli.run_display`).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from gradlab.runs.progress import LOSS_METRICS

#: Eight levels, lowest first.
SPARK = "▁▂▃▄▅▆▇█"
#: Characters of return history on the screen, and evaluation rows (the newest).
SPARK_WIDTH = 48
EVAL_ROWS = 8


def sparkline(values: Sequence[float], width: int = SPARK_WIDTH) -> str:
    """The last ``width`` values as one character each, scaled between their min and max (all at
    the middle level when they are equal); "" for no values."""
    values = list(values)[-width:]
    if not values:
        return ""
    low, high = min(values), max(values)
    if high - low <= 1e-12:
        return SPARK[3] * len(values)
    top = len(SPARK) - 1
    return "".join(SPARK[round((v - low) / (high - low) * top)] for v in values)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


def _rate(progress) -> str:
    rate = progress.steps_per_s
    if rate:
        return f"{rate:,.0f}"
    mean = progress.mean_steps_per_s
    if mean:
        return f"{mean:,.0f} (mean)" if progress.finished else f"{mean:,.0f}"
    return "-"


def _time_left(progress) -> str:
    if progress.finished:
        left, each = progress.evaluations_left, progress.eval_seconds_mean
        if not left:
            return "learner done"
        expected = f", ~{_duration(left * each)}" if each is not None else ""
        return f"learner done; {left} evaluation{'s' if left != 1 else ''} left{expected}"
    eta = progress.eta_s
    return _duration(eta) if eta is not None else "-"


def _interval(low: float | None, high: float | None) -> str:
    return f"[{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""


def evaluations_table(progress) -> Table:
    """The newest :data:`EVAL_ROWS` evaluations, one row each (oldest first)."""
    table = Table(title="evaluations", title_justify="left", expand=False)
    for name, justify in (("step", "right"), ("return mean ± 95%", "right"), ("success [95%]", "right"),
                          ("verdict", "left"), ("seconds", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    rows = list(progress.evaluations)[-EVAL_ROWS:]
    for row in rows:
        ret = "" if row.return_mean is None else f"{row.return_mean:.2f}" + (
            f" ± {row.return_ci95:.2f}" if row.return_ci95 is not None else "")
        success = "" if row.success_rate is None else f"{row.success_rate:.2f} {_interval(row.success_low, row.success_high)}"
        colour = {"accepted": "green", "rejected": "red"}.get(row.verdict or "", "yellow")
        table.add_row(f"{row.checkpoint_step:,}", ret, success, f"[{colour}]{row.verdict or 'no result'}[/]",
                      f"{row.seconds:.1f}" if row.seconds is not None else "")
    if not rows:
        left = progress.evaluations_left
        table.add_row("", "none yet" + (f" ({left} waiting)" if left else ""), "", "", "")
    return table


def run_screen(progress, waiting: str | None = None) -> RenderableType:
    """The whole screen for ``progress`` (a :class:`gradlab.runs.progress.RunProgress` after a
    refresh); ``waiting``: what the run waits for before its first step (shown first)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    if waiting:
        grid.add_row("starting", escape(waiting))
    frac = min(1.0, progress.step / progress.timesteps) if progress.timesteps else 0.0
    grid.add_row("step", f"{progress.step:,} / {progress.timesteps:,} ({frac:.0%})")
    grid.add_row("steps/s", _rate(progress))
    grid.add_row("time left", _time_left(progress))
    ret = progress.recent_return
    grid.add_row("return", "-" if ret is None else f"{ret:.2f}  [cyan]{sparkline(progress.returns)}[/]")
    losses = [(label, progress.losses[label]) for label in LOSS_METRICS.values() if label in progress.losses]
    grid.add_row("losses", "  ".join(f"{label} {value:.4g}" for label, value in losses) or "-")
    grid.add_row("checkpoints", f"{progress.checkpoints} ready, {progress.published} published, "
                                f"{progress.evaluated} evaluated, {progress.accepted} accepted")
    grid.add_row("stop", escape(progress.stop) if progress.stop else "-")
    title = f"run {escape(progress.outbox_path.parent.name)}"
    return Panel(Group(grid, "", evaluations_table(progress)), title=title, title_align="left", expand=False)
