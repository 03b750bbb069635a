"""A run's progress and outcome on the terminal: the live progress of ``train``, ``runs retry`` and
``experiment follow`` (one live screen on a terminal, :mod:`gradlab.cli.run_screen`; else a line
when something changed) and the summary table of its terminal receipt.

Presentation only: the readings are :class:`gradlab.runs.progress.RunProgress`'s (the run's
outbox); everything goes to stderr.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rich.markup import escape

from gradlab.cli.output import err_console


def print_summary(receipt: dict, elapsed_s: float) -> None:
    """The summary of a finished run on stderr, one ``name  value`` line each: outcome, final step,
    checkpoints, evaluations, promotion, metrics delivery, wall time and where the receipt is kept.

    Lines carry no trailing padding and are never broken by gradlab (the terminal wraps a long one
    visually; copied, the receipt's URL is one piece).

    Args:
        receipt: the terminal receipt JSON (``TerminalReceipt`` dumped with ``mode="json"``).
        elapsed_s: the command's wall time, in seconds.
    """
    colour = {"succeeded": "green", "cancelled": "yellow", "stopped": "yellow"}.get(receipt["outcome"], "red")
    evals = receipt["evaluations"]
    promo = receipt.get("promotion")
    metrics = receipt["metrics"]
    pending = f"; pending remotely: {', '.join(metrics['pending'])}" if metrics.get("pending") else ""
    rows = [
        ("run", escape(receipt["run_id"] + f" ({receipt['attempt_id']})")),
        ("outcome", f"[{colour}]{receipt['outcome']}[/]: {escape(receipt['reason'])}"),
        ("final step", "unknown (the learner reported no step)" if receipt["final_step"] is None
         else str(receipt["final_step"])),
        ("checkpoints", str(len(receipt["checkpoints"]))),
        ("evaluations", ", ".join(f"{e['checkpoint_step']}: {e['status']}"
                                  + (f" ({e['return_mean']:.1f})" if e.get("return_mean") is not None else "")
                                  for e in evals) or "none"),
        ("promotion", f"step {promo['checkpoint_step']} ({promo['sha256'][:16]})" if promo else "none"),
        # local_high_water is the outbox's highest event number, not a count of journal lines.
        ("metrics", f"delivered locally up to event {metrics['local_high_water']}{pending}"),
        ("wall time", f"{elapsed_s:.1f} s"),
        ("receipt", _receipt_url(receipt)),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        err_console.print(f"{name:<{width}}  {value}", soft_wrap=True, highlight=False)


def _receipt_url(receipt: dict) -> str:
    """Where the receipt is kept: its object in the control store (`gradlab runs show RUN` reads it)."""
    from gradlab.errors import GradlabError
    from gradlab.stores import keys, open_stores

    try:
        return escape(open_stores().control.url(keys.terminal(receipt["run_id"], receipt["attempt_id"])))
    except GradlabError as e:  # the stores' settings cannot be read here: the command that reads it
        return f"`gradlab runs show {receipt['run_id']}` ({escape(str(e))})"


class Starting:
    """What a run is waiting for before its first step, and since when: the command sets the phase
    it knows (the Prefect server); the outbox says the rest (the flow watching, the learner's
    first step). Thread-safe enough for one writer and the display thread (one tuple swapped)."""

    def __init__(self) -> None:
        self._phase: tuple[str, float, float | None] | None = None

    def set(self, what: str, expected_s: float | None = None, *, since: float | None = None) -> None:
        """Waiting for ``what`` from now (or from ``since``, a ``time.monotonic()``); ``expected_s``:
        how long it took last time here, seconds."""
        if self._phase is None or self._phase[0] != what:
            self._phase = (what, time.monotonic() if since is None else since, expected_s)

    def line(self, progress) -> str | None:
        """The line for the user while the learner has not started, else None."""
        if progress.started or progress.finished or progress.step:
            return None
        if progress.supervised:
            self.set("the learner's first step (importing torch, building its envs; the supervising flow is watching)")
        if self._phase is None:
            return None
        what, since, expected = self._phase
        usual = f"; it took {expected:,.0f} s last time here" if expected else ""
        waited = time.monotonic() - since
        return f"starting: {what}" + (f": {waited:,.0f} s so far" if waited >= 1 else "") + usual

    @property
    def what(self) -> str | None:
        return self._phase[0] if self._phase else None


def _finishing(progress) -> str:
    """What a finished learner's run still waits for: the evaluations left and their expected time."""
    left, each = progress.evaluations_left, progress.eval_seconds_mean
    if not left:
        return "learner done, finishing"
    expected = f", ~{left * each:,.0f} s at {each:,.1f} s each" if each is not None else ""
    return f"learner done, {left} evaluation{'s' if left != 1 else ''} left{expected}"


def _progress_line(progress) -> str:
    """One line, most important first (so a narrow terminal cuts the least useful part)."""
    rate = progress.steps_per_s
    return " · ".join(filter(None, [
        f"step {progress.step:,}/{progress.timesteps:,}",
        f"accepted {progress.accepted}" + (f" (stop: {progress.stop})" if progress.stop else ""),
        _finishing(progress) if progress.finished else (f"{rate:,.0f} steps/s" if rate else None),
        f"return {progress.recent_return:.1f}" if progress.recent_return is not None else None,
        f"checkpoints {progress.checkpoints}, published {progress.published}, evaluated {progress.evaluated}",
    ]))


class _LinePrinter:
    """Progress off a terminal (a log file, CI): a line only when something changed. A milestone
    (checkpoint, publication, evaluation, stop, the learner's end) prints at once; steps and
    rate alone at most every ``every_s`` seconds; the same line is never printed twice."""

    def __init__(self, every_s: float = 10.0, out=None):
        self.every_s = every_s
        self.out = out or (lambda line: err_console.print(line, highlight=False))
        self.last_line: str | None = None
        self.last_milestones: tuple | None = None
        self.printed_at = float("-inf")

    def offer(self, progress, now: float, starting: Starting | None = None) -> bool:
        """Print ``progress``'s line (or, before the first step, what is starting) if it says
        something new; True when printed."""
        waiting = starting.line(progress) if starting is not None else None
        line = waiting or _progress_line(progress)
        milestones = ("starting", starting.what) if waiting else progress.milestones
        if line == self.last_line:
            return False
        if milestones == self.last_milestones and now - self.printed_at < self.every_s:
            return False
        self.out(line)
        self.last_line, self.last_milestones, self.printed_at = line, milestones, now
        return True


class LiveProgress:
    """A run's progress on stderr from ``start()`` until ``stop()`` (:func:`_show_progress` in a
    thread); off a terminal, ``stop()`` prints the final line (the last periodic one may be 10 s
    old). ``stop()`` twice is harmless.

    Args:
        outbox_path: the run's ``outbox.sqlite`` (read only; it may not exist yet).
        timesteps: the run's total env steps (the bar's length).
        starting: what the run waits for before its first step (shown, with for how long, instead
            of the step until the learner has started).
    """

    def __init__(self, outbox_path: Path, timesteps: int, starting: Starting | None = None) -> None:
        self.outbox_path, self.timesteps = outbox_path, timesteps
        self._stop = threading.Event()
        self._printer = _LinePrinter()
        self._thread = threading.Thread(target=_show_progress,
                                        args=(outbox_path, timesteps, self._stop, self._printer, starting), daemon=True)

    def start(self) -> LiveProgress:
        """Start showing the progress (a daemon thread); returns ``self``."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop showing it (waits up to 2 s for the thread); off a terminal, print the final line."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=2)
        if not err_console.is_terminal:
            _print_final_progress(self.outbox_path, self.timesteps, self._printer)


def _print_final_progress(outbox_path, timesteps: int, printer: _LinePrinter) -> None:
    from gradlab.runs.progress import RunProgress

    try:
        printer.offer(RunProgress(outbox_path, timesteps).refresh(), float("inf"))
    except Exception:  # noqa: BLE001 - the display must never disturb the run
        pass


def _show_progress(outbox_path, timesteps: int, stop: threading.Event, printer: _LinePrinter | None = None,
                   starting: Starting | None = None) -> None:
    """Live progress on stderr: on a terminal one screen redrawn in place (rich's Live,
    :func:`gradlab.cli.run_screen.run_screen`), else a line when something changed; before the
    first step, what is starting and for how long."""
    from gradlab.runs.progress import RunProgress

    progress = RunProgress(outbox_path, timesteps)
    if not err_console.is_terminal:  # readings every second (for steps/s); a line only when it says something new
        printer = printer or _LinePrinter()
        while not stop.wait(1.0):
            try:
                printer.offer(progress.refresh(), time.monotonic(), starting)
            except Exception:  # noqa: BLE001 - the display must never disturb the run
                continue
        return
    from rich.live import Live

    from gradlab.cli.run_screen import run_screen

    def screen():
        return run_screen(progress, starting.line(progress) if starting is not None else None)

    try:
        with Live(screen(), console=err_console, refresh_per_second=4, transient=False) as live:
            while True:
                stopping = stop.wait(0.5)
                try:  # once more after stop(): the last screen shows the run's end
                    progress.refresh()
                    live.update(screen())
                except Exception:  # noqa: BLE001 - the display must never disturb the run
                    pass
                if stopping:
                    return
    except Exception:  # noqa: BLE001 - the display must never disturb the run
        return
