"""Learning curves of runs, from their local metric journals (docs/ARCHITECTURE.md sections 10 and 12).

The data functions here are the single source of every curve gradlab draws: ``gradlab runs
curves`` (files, matplotlib Agg), the HTML reports and the web player. The journal is read only
through :class:`gradlab.metrics.journal.Journal` (its ``curve`` keeps the surviving lineage of a
resumed run).

Axes:
    ``steps``: ``train/global_step`` for training metrics, ``eval/checkpoint_step`` for evaluation
        ones (both env steps).
    ``seconds``: learner wall time, the running sum of each iteration's
        ``train/throughput/{rollout,update,bookkeeping}/seconds``; an evaluation point sits at the
        learner time its checkpoint step was reached (linear interpolation). Orchestration time
        (queueing, evaluation) is not counted.

Bands:
    ``eval/episode/return/mean``: 95% normal-approximation interval of the mean,
        ``mean ± 1.96 · std / sqrt(n - 1)`` (``std`` is the journal's ddof=0 standard deviation
        over ``n = eval/acceptance/episodes/completed`` episodes; ``std / sqrt(n-1)`` is the ddof=1
        standard error).
    success rates: the journal's Wilson 95% bounds (``..._ci95_low`` / ``..._ci95_high``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gradlab.errors import ContractViolation, NotFound

if TYPE_CHECKING:
    from gradlab.settings import Settings
    from gradlab.stores import Stores

STEP_AXIS = "train/global_step"
EVAL_AXIS = "eval/checkpoint_step"
X_AXES = ("steps", "seconds")
#: What ``gradlab runs curves`` draws without ``--metric``: returns, evaluation, success, losses, speed.
DEFAULT_METRICS = (
    "train/episode/return/shaped/mean",
    "eval/episode/return/mean",
    "eval/outcome/success/rate",
    "train/algorithm/{algorithm}/update/loss",
    "train/algorithm/{algorithm}/update/value_loss",
    "train/throughput/loop_fps",
)
_SECONDS_PARTS = ("train/throughput/rollout/seconds", "train/throughput/update/seconds",
                  "train/throughput/bookkeeping/seconds")
_Z_95 = 1.959963984540054


@dataclass(frozen=True)
class Curve:
    """The points of one metric of one run.

    Attributes:
        run_id, metric: whose and what (a concrete registered name, no template).
        x_axis: ``train/global_step``, ``eval/checkpoint_step`` or ``seconds``.
        x, y: (n,) float each, in journal order (x increasing for steps axes).
        low, high: (n,) float band bounds, or None when the metric has no band; ``band`` says which.
    """

    run_id: str
    metric: str
    x_axis: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    low: tuple[float, ...] | None = None
    high: tuple[float, ...] | None = None
    band: str | None = None

    def as_json(self) -> dict:
        return {"run_id": self.run_id, "metric": self.metric, "x_axis": self.x_axis, "x": list(self.x),
                "y": list(self.y), "low": None if self.low is None else list(self.low),
                "high": None if self.high is None else list(self.high), "band": self.band}


def mean_interval(mean: float, std: float | None, n: int | None) -> tuple[float, float] | None:
    """95% normal-approximation interval of an evaluation's return mean, ``mean ± 1.96 · std / sqrt(n-1)``.

    Args:
        mean: the return mean; std: the population (ddof=0) standard deviation over ``n`` episodes.

    Returns:
        (low, high), or None when ``n < 2`` or ``std`` is missing (undefined).
    """
    if std is None or n is None or n < 2:
        return None
    half = _Z_95 * float(std) / math.sqrt(n - 1)
    return mean - half, mean + half


def check_metrics(names: Sequence[str]) -> list[str]:
    """The names, each checked against the metric registry (exact or template).

    Raises:
        ContractViolation: a name is not registered (names it and the closest registered names).
    """
    import difflib

    from gradlab.metrics.registry import REGISTRY, lookup

    templates = {m.name for m in REGISTRY if m.is_template}
    for name in names:
        if name not in templates and lookup(name) is None:
            known = sorted(m.name for m in REGISTRY)
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            family = sorted({k for k in known if k.split("/")[0] == name.split("/")[0]})
            hint = (f"did you mean {' or '.join(close)}?" if close else
                    f"registered {name.split('/')[0]}/ names: {', '.join(family)}" if family else
                    "`gradlab runs curves --help` and METRICS.md list the registered names")
            raise ContractViolation(f"metric {name!r} is not registered; {hint}")
    return list(names)


def journal_label(settings: Settings, run_id: str, path: Path) -> str:
    """``path`` relative to the run's directory (``journal.jsonl``): what a published report may name."""
    try:
        return Path(path).relative_to(settings.run_dir(run_id)).as_posix()
    except ValueError:
        return Path(path).name


def open_journal(settings: Settings, stores: Stores | None, run_id: str, *, relative: bool = False):
    """The run's local journal, opened read-only and checked to be present and complete.

    Complete means it holds every event the run's latest terminal receipt says was delivered to
    the journal: ``metrics.sinks.journal`` is the high-water mark of the outbox that attempt
    recorded (``Attempt.outbox``; lines carry it), so it is compared with that outbox's highest
    ``event_seq`` in the journal, as the supervisor's writer counts it. A run still in progress
    has no receipt to check. The file is never modified (a torn last line is left out of the read).

    Args:
        relative: name the journal relative to the run's directory in errors (published reports).

    Raises:
        NotFound: no run ``run_id`` in the control store, or its journal file is missing.
        ContractViolation: the journal is truncated (fewer events than the receipt), or has a
            malformed line (names the run and the file).
    """
    from gradlab.metrics.journal import Journal
    from gradlab.runs.paths import RunPaths

    receipt = attempt = None
    if stores is not None:
        from gradlab.receipts import list_attempts, read_run, read_terminal

        try:
            read_run(stores, run_id)
        except NotFound:
            raise NotFound(f"no run {run_id} in {stores.control.base_url}; `gradlab runs list` lists the runs there") from None
        for candidate in reversed(list_attempts(stores, run_id)):
            receipt = read_terminal(stores, run_id, candidate.attempt_id)
            if receipt is not None:
                attempt = candidate
                break
    path = RunPaths(settings.run_dir(run_id)).journal
    shown = journal_label(settings, run_id, path) if relative else str(path)
    if not path.is_file():
        raise NotFound(f"run {run_id}: metric journal {shown} is missing (curves are drawn from the journal of the "
                       "machine that ran it)")
    try:
        journal = Journal(path, outbox=attempt.outbox if attempt is not None else None, readonly=True)
    except ContractViolation as e:
        raise ContractViolation(f"run {run_id}: unreadable metric journal: {str(e).replace(str(path), shown)}") from None
    except OSError as e:
        raise ContractViolation(f"run {run_id}: cannot read metric journal {shown}: {e.strerror or e}") from None
    expected = receipt.metrics.sinks.get("journal") if receipt is not None else None
    if expected is not None and journal.high_water < expected:
        held = (f"events up to {journal.high_water}" if journal.high_water else "no events")
        raise ContractViolation(f"run {run_id}: metric journal {shown} is truncated: it holds {held} of outbox "
                                f"{attempt.outbox or '(unrecorded)'}, the terminal receipt of {attempt.attempt_id} says "
                                f"events up to {expected} were delivered")
    return journal


class JournalSnapshot:
    """One read of a journal serving every curve drawn from it (the journal's own ``read``/``curve``
    logic, lineage rules included, applied to entries read once)."""

    def __init__(self, journal):
        self._journal = journal
        self._entries = journal.read()

    def read(self):
        return self._entries

    def curve(self, name: str, axis: str = STEP_AXIS):
        from gradlab.metrics.journal import Journal

        return Journal.curve(self, name, axis)

    def __getattr__(self, name: str):
        return getattr(self._journal, name)


def expand_metric(journal, name: str) -> list[str]:
    """The concrete names a registered ``name`` stands for in this journal (a template expands to every
    matching name logged; an exact name stands for itself)."""
    from gradlab.metrics.registry import REGISTRY, lookup

    spec = next((m for m in REGISTRY if m.name == name and m.is_template), None)
    if spec is None:
        return [name] if lookup(name) is not None else []
    pattern = spec.pattern()
    seen: dict[str, None] = {}
    for entry in journal.read():
        for key in entry.metrics:
            if pattern.match(key):
                seen.setdefault(key, None)
    return sorted(seen)


def _learner_seconds(journal) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps, cumulative learner seconds) from the per-iteration timings, or None without them."""
    per_step: dict[float, float] = {}
    for part in _SECONDS_PARTS:
        for step, seconds in journal.curve(part, axis=STEP_AXIS):
            per_step[step] = per_step.get(step, 0.0) + float(seconds)
    if not per_step:
        return None
    steps = np.array(sorted(per_step), dtype=np.float64)
    return steps, np.cumsum([per_step[s] for s in steps])


def metric_curve(journal, run_id: str, metric: str, x: str = "steps", *, seconds=None) -> Curve:
    """One concrete metric of one journal as a :class:`Curve` (see the module docstring for axes and bands).

    Args:
        journal: an open :class:`gradlab.metrics.journal.Journal`.
        metric: a concrete registered name. x: ``steps`` or ``seconds``.
        seconds: the journal's learner-time table when already computed (internal).

    Raises:
        ContractViolation: ``x`` is not ``steps`` or ``seconds``.
    """
    if x not in X_AXES:
        raise ContractViolation(f"--x: expected one of {', '.join(X_AXES)}, found {x!r}")
    axis = EVAL_AXIS if metric.startswith("eval/") else STEP_AXIS
    points = journal.curve(metric, axis=axis)
    xs = np.array([p[0] for p in points], dtype=np.float64)
    ys = tuple(float(p[1]) for p in points)
    low = high = band = None
    if metric == "eval/episode/return/mean":
        std = dict(journal.curve("eval/episode/return/std", axis=axis))
        n = dict(journal.curve("eval/acceptance/episodes/completed", axis=axis))
        lows, highs = [], []
        for step, mean in points:
            interval = mean_interval(mean, std.get(step), int(n[step]) if step in n else None)
            lows.append(interval[0] if interval else math.nan)
            highs.append(interval[1] if interval else math.nan)
        low, high, band = tuple(lows), tuple(highs), "95% interval of the mean (normal approximation)"
    elif metric.endswith("/success/rate") and metric.startswith("eval/"):
        lo = dict(journal.curve(metric + "_ci95_low", axis=axis))
        hi = dict(journal.curve(metric + "_ci95_high", axis=axis))
        low = tuple(float(lo.get(step, math.nan)) for step, _ in points)
        high = tuple(float(hi.get(step, math.nan)) for step, _ in points)
        band = "Wilson 95% interval"
    x_axis = axis
    if x == "seconds":
        table = seconds if seconds is not None else _learner_seconds(journal)
        if table is None:
            xs = np.full(xs.shape, np.nan)
        else:
            xs = np.interp(xs, table[0], table[1])
        x_axis = "seconds"
    return Curve(run_id=run_id, metric=metric, x_axis=x_axis, x=tuple(float(v) for v in xs), y=ys, low=low,
                 high=high, band=band)


def run_curves(settings: Settings, stores: Stores | None, run_ids: Sequence[str],
               metrics: Sequence[str] = DEFAULT_METRICS, x: str = "steps", *, relative: bool = False) -> list[Curve]:
    """Every requested curve of every run (templates expanded per journal; empty curves dropped).

    ``stores`` None skips the check against the terminal receipt; ``relative``: see :func:`open_journal`.

    Raises:
        ContractViolation: an unregistered metric name, a bad ``x``, a truncated or malformed journal.
        NotFound: an unknown run or a missing journal.
    """
    check_metrics(metrics)
    if x not in X_AXES:
        raise ContractViolation(f"--x: expected one of {', '.join(X_AXES)}, found {x!r}")
    curves = []
    for run_id in run_ids:
        journal = JournalSnapshot(open_journal(settings, stores, run_id, relative=relative))
        seconds = _learner_seconds(journal) if x == "seconds" else None
        for name in metrics:
            for concrete in expand_metric(journal, name):
                curve = metric_curve(journal, run_id, concrete, x, seconds=seconds)
                if curve.y:
                    curves.append(curve)
    return curves


def median_band(curves: Sequence[Curve], points: int = 50) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Median and interquartile band across seeds of one metric, on a common x grid.

    Each curve is linearly interpolated on ``points`` x values spanning the range every curve
    covers (the shortest run bounds it); a curve with one point counts only at its x.

    Returns:
        (x, median, q25, q75): each (points,) float64; empty arrays when no curve has points.
    """
    usable = [c for c in curves if c.x and np.isfinite(c.x).all()]
    if not usable:
        empty = np.array([])
        return empty, empty, empty, empty
    lo = max(min(c.x) for c in usable)
    hi = min(max(c.x) for c in usable)
    if hi <= lo:
        grid = np.array([hi])
    else:
        grid = np.linspace(lo, hi, points)
    ys = np.stack([np.interp(grid, np.array(c.x), np.array(c.y)) for c in usable])
    q25, med, q75 = np.percentile(ys, [25, 50, 75], axis=0)
    return grid, med, q25, q75


#: How each x axis is labelled on a figure (name and unit).
X_LABELS = {STEP_AXIS: "env steps (train/global_step)", EVAL_AXIS: "env steps of the checkpoint (eval/checkpoint_step)",
            "seconds": "learner wall time (s)"}


def metric_label(metric: str) -> str:
    """A y-axis label: the metric's last path segments and its registered unit, e.g. ``return/mean (reward)``."""
    from gradlab.metrics.registry import lookup

    spec = lookup(metric)
    unit = spec.unit if spec is not None else ""
    short = "/".join(metric.split("/")[-2:])
    return f"{short} ({unit})" if unit else short


def sensible_limits(ax, xs: Sequence[float], ys: Sequence[float]) -> None:
    """Give an axis a readable range when its points leave none: a single x (one evaluation) is shown
    from 0 to 125% of it, a single y value ±10% of it (at least ±0.5), instead of matplotlib's
    range of a millionth around the point with an offset label."""
    fx = [v for v in xs if math.isfinite(v)]
    fy = [v for v in ys if math.isfinite(v)]
    if fx and max(fx) == min(fx):
        x = fx[0]
        ax.set_xlim(*((0.0, 1.25 * x) if x > 0 else (x - 1.0, x + 1.0)))
    if fy and max(fy) == min(fy):
        y = fy[0]
        half = max(0.1 * abs(y), 0.5)
        ax.set_ylim(y - half, y + half)


def empty_reasons(stores: Stores | None, run_ids: Sequence[str], metrics: Sequence[str],
                  curves: Sequence[Curve]) -> dict[str, str]:
    """Why each exact requested metric has no points: evaluation turned off (``--no-eval``), no
    evaluation recorded yet, or nothing logged (yet) in the journals. Templates are left out.

    Returns:
        metric -> one sentence, for the metrics with no curve.
    """
    from gradlab.metrics.registry import REGISTRY

    templates = {m.name for m in REGISTRY if m.is_template}
    drawn = {c.metric for c in curves}
    out: dict[str, str] = {}
    for metric in metrics:
        if metric in drawn or metric in templates:
            continue
        if not metric.startswith("eval/"):
            out[metric] = "not logged yet"
            continue
        out[metric] = "no evaluation yet"
        if stores is None:
            continue
        from gradlab import receipts as rules
        from gradlab.errors import GradlabError

        specs = []
        for run_id in run_ids:
            try:
                specs.append(rules.read_run_spec(stores, run_id))
            except GradlabError:  # no spec to read the reason from: "no evaluation yet" stands
                continue
        if specs and all(spec.get("evaluate") is False for spec in specs):
            out[metric] = f"evaluation is off for {'this run' if len(specs) == 1 else 'these runs'} (--no-eval)"
        elif specs and all(not spec.get("goal", {}).get("eval", {}).get("acceptance") for spec in specs):
            out[metric] = "the goal is training only (no acceptance rule, nothing evaluated)"
    return out


def plot_curves(curves: Sequence[Curve], out: Path | str | None = None, *, title: str | None = None,
                empty: dict[str, str] | None = None):
    """Draw curves with matplotlib's Agg canvas: one panel per metric, one line per run, bands shaded.

    Every panel has its x label (axis and unit) and y label (metric and unit); a single point gets a
    readable range (:func:`sensible_limits`).

    Args:
        curves: what :func:`run_curves` returned.
        out: a ``.png`` or ``.svg`` file to write (None: only return the figure).
        empty: metric -> why it has no points (:func:`empty_reasons`): drawn as a panel saying so.

    Returns:
        The :class:`matplotlib.figure.Figure`.

    Raises:
        ContractViolation: ``out`` has another suffix, or there is nothing to draw.
        PermanentError: ``out`` cannot be written (names it and the OS's reason).
    """
    from matplotlib.figure import Figure

    if out is not None and Path(out).suffix.lower() not in (".png", ".svg"):
        raise ContractViolation(f"--out {out}: expected a .png or .svg file")
    if not curves:
        raise ContractViolation("no points to draw: the journals hold none of the requested metrics"
                                + (f" ({'; '.join(f'{m}: {why}' for m, why in empty.items())})" if empty else ""))
    empty = {m: why for m, why in (empty or {}).items() if m not in {c.metric for c in curves}}
    metrics = list(dict.fromkeys(c.metric for c in curves)) + list(empty)
    cols = min(3, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    fig = Figure(figsize=(5.2 * cols, 3.4 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    runs = list(dict.fromkeys(c.run_id for c in curves))
    handles: dict[str, object] = {}
    for ax, metric in zip(axes, metrics, strict=False):
        mine = [c for c in curves if c.metric == metric]
        if not mine:  # an empty panel says why
            ax.text(0.5, 0.5, empty[metric], ha="center", va="center", wrap=True, fontsize=9, color="0.35",
                    transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(metric, fontsize=9)
            ax.set_xlabel(X_LABELS[EVAL_AXIS if metric.startswith("eval/") else STEP_AXIS], fontsize=8)
            ax.set_ylabel(metric_label(metric), fontsize=8)
            continue
        for c in mine:
            i = runs.index(c.run_id)  # one colour and marker per run across panels
            # hollow markers shrinking run by run and distinct dashes: coinciding runs stay visible
            (line,) = ax.plot(c.x, c.y, marker="osD^v"[i % 5] if len(c.x) < 30 else None,
                              markersize=max(3.0, 8.0 - 1.5 * i), markerfacecolor="none",
                              linestyle=("-", "--", "-.", ":")[i % 4], color=f"C{i % 10}", label=c.run_id[-8:])
            handles.setdefault(c.run_id[-8:], line)
            if c.low is not None and c.high is not None:
                if len(c.x) < 3:  # a band needs a width: show the interval as error bars
                    ax.errorbar(c.x, c.y, yerr=[np.subtract(c.y, c.low), np.subtract(c.high, c.y)],
                                fmt="none", ecolor=line.get_color(), capsize=3)
                else:
                    ax.fill_between(c.x, c.low, c.high, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel(X_LABELS.get(mine[0].x_axis, mine[0].x_axis), fontsize=8)
        ax.set_ylabel(metric_label(metric), fontsize=8)
        sensible_limits(ax, [x for c in mine for x in c.x],
                        [y for c in mine for y in (*c.y, *(c.low or ()), *(c.high or ()))])
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[len(metrics):]:
        ax.set_visible(False)
    if len(runs) > 1:  # below the panels, never over a curve
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=min(6, len(handles)),
                   fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    if out is not None:
        try:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(out)
        except OSError as e:
            from gradlab.errors import PermanentError

            raise PermanentError(f"--out {out}: cannot write the figure: {e.strerror or e}") from None
    return fig
