"""The local metrics journal: one JSON line per delivered outbox event, always written.

Each line is ``{"event_seq": int, "metrics": {name: value}, "attempt": str, "outbox": str}``
(sorted keys; ``attempt`` is the attempt whose learner or supervisor wrote the event, ``outbox``
the identity nonce of the outbox it came from; both absent on lines written before they were
recorded), appended, flushed and fsynced before :meth:`Journal.write` returns, so a delivery
acknowledged to the outbox is on disk. Writes are idempotent by (outbox, ``event_seq``): an event
at or below that outbox's high-water mark is skipped, so re-delivering after a crash adds
nothing, while a new outbox (lost or replaced: its ``event_seq`` starts at 1 again) never collides
with an old one. A torn last line (a crash mid-append) is cut off when a writer opens the
journal; a read-only open (``readonly=True``: what commands that only read use) never writes,
creates or cuts anything, and every read leaves an incomplete last line out.

Readers see the surviving lineage (docs/ARCHITECTURE.md section 10): every line is kept in the
file, but after a resume the lines an earlier attempt logged at or past the first training step
the next attempt logged belong to an abandoned lineage (the next attempt continued from an
earlier checkpoint) and are left out of :meth:`Journal.read` and :meth:`Journal.curve`, as W&B's
rewind does; :meth:`Journal.read_all` gives every line. The journal holds enough to draw every
curve offline; axis values (``train/global_step``, ``eval/checkpoint_step``) travel inside
``metrics`` and ``orchestration/event_seq`` is the line's ``event_seq``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradlab.errors import ContractViolation

logger = logging.getLogger(__name__)

EVENT_SEQ_AXIS = "orchestration/event_seq"
STEP_AXIS = "train/global_step"


@dataclass(frozen=True)
class JournalEntry:
    """One journal line: ``attempt`` and ``outbox`` are None on lines written before they were recorded."""

    event_seq: int
    metrics: dict[str, Any]
    attempt: str | None = None
    outbox: str | None = None


def _complete(data: bytes) -> bytes:
    """``data`` up to its last newline: a torn last line (no newline: a crash or a writer mid-append) is left out."""
    return data if not data or data.endswith(b"\n") else data[: data.rfind(b"\n") + 1]


def _parse_lines(path: Path, data: bytes) -> list[JournalEntry]:
    entries = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            entries.append(JournalEntry(int(doc["event_seq"]), dict(doc["metrics"]), doc.get("attempt"),
                                        doc.get("outbox")))
        except (ValueError, KeyError, TypeError) as e:
            raise ContractViolation(f"{path}:{number}: expected a journal line {{event_seq, metrics}}: {e}") from None
    return entries


def surviving_lineage(entries: list[JournalEntry]) -> list[JournalEntry]:
    """The lines of the surviving learner lineage, in file order (see the module docstring).

    When an attempt's first line with ``train/global_step`` = x arrives, earlier attempts' lines
    with ``train/global_step >= x`` are dropped: that attempt resumed from a checkpoint below x,
    so what they logged from x on was never continued. Lines without a training step (evaluation
    and orchestration metrics) are always kept, and a line without an attempt (written before
    lines recorded one) never starts a lineage of its own.
    """
    kept: list[JournalEntry] = []
    seen: set[str | None] = set()
    current: str | None = None
    for entry in entries:
        step = entry.metrics.get(STEP_AXIS)
        if (entry.attempt is not None and entry.attempt != current and isinstance(step, int | float)
                and entry.attempt not in seen):
            if current is not None or kept:
                kept = [e for e in kept if not (isinstance(s := e.metrics.get(STEP_AXIS), int | float) and s >= step
                                                and e.attempt not in (entry.attempt, None))]
            current = entry.attempt
            seen.add(entry.attempt)
        kept.append(entry)
    return kept


class Journal:
    """Append-only JSON-lines metrics journal of one run (see the module docstring).

    Args:
        path: the journal file (e.g. ``<run_dir>/metrics.jsonl``); created with its parent folders.
        outbox: the identity of the outbox whose events this writer delivers (recorded per line;
            the high-water mark is this outbox's).
        attempt: the attempt recorded on lines written without one of their own.
        readonly: open for reading only: nothing is created or written (a torn last line is left
            out of what is read, not cut from the file), and :meth:`write_many` is refused.

    Raises:
        ContractViolation: an existing journal has a malformed line before its last one; or
            ``write`` on a read-only journal.
        FileNotFoundError: ``readonly`` and there is no such file.
    """

    def __init__(self, path: Path | str, *, outbox: str | None = None, attempt: str | None = None,
                 readonly: bool = False):
        self.path = Path(path)
        self.outbox = outbox
        self.attempt = attempt
        self.readonly = readonly
        self._lock = threading.Lock()
        self._high_water = 0
        self._size = -1
        if readonly:
            entries = _parse_lines(self.path, _complete(self.path.read_bytes()))
            self._high_water = max((e.event_seq for e in entries if e.outbox == self.outbox), default=0)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                self._sync(f)
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def _sync(self, f) -> None:
        """Bring the high-water mark up to date with the file (another writer, or a torn tail)."""
        size = os.fstat(f.fileno()).st_size
        if size == self._size:
            return
        f.seek(0)
        data = f.read()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            logger.warning("%s: cutting a torn last line (%d bytes)", self.path, len(data) - keep)
            f.truncate(keep)
            os.fsync(f.fileno())
            data = data[:keep]
        entries = _parse_lines(self.path, data)
        self._high_water = max((e.event_seq for e in entries if e.outbox == self.outbox), default=0)
        self._size = len(data)

    @property
    def high_water(self) -> int:
        """The largest ``event_seq`` written from this writer's outbox (0 when none)."""
        return self._high_water

    def count(self, outbox: str | None = None) -> int:
        """Lines delivered from ``outbox`` (default: this writer's)."""
        wanted = self.outbox if outbox is None else outbox
        return sum(1 for e in self.read_all() if e.outbox == wanted)

    def write(self, event_seq: int, metrics: Mapping[str, Any]) -> bool:
        """Append one event durably unless ``event_seq`` is at or below the high-water mark.

        Args:
            event_seq: the outbox event's sequence number (>= 1; increasing).
            metrics: metric name → JSON-compatible value (NaN/inf are written as JSON NaN/Infinity).

        Returns:
            True when written, False when skipped as already present.
        """
        return self.write_many([(event_seq, metrics)]) == 1

    def write_many(self, events: Iterable[tuple[int, Mapping[str, Any]]],
                   attempts: Mapping[int, str | None] | None = None) -> int:
        """Append several events with one fsync; skip those at or below the high-water mark.

        Args:
            events: (event_seq, metrics) in increasing event_seq.
            attempts: event_seq → the attempt that wrote it (default: this writer's ``attempt``).

        Returns:
            The number of events written.

        Raises:
            ContractViolation: the journal was opened read-only.
        """
        if self.readonly:
            raise ContractViolation(f"{self.path}: the journal was opened read-only")
        with self._lock, open(self.path, "a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                self._sync(f)
                lines = []
                high = self._high_water
                for event_seq, metrics in events:
                    if event_seq <= high:
                        continue
                    high = event_seq
                    doc: dict[str, Any] = {"event_seq": int(event_seq), "metrics": dict(metrics)}
                    attempt = (attempts or {}).get(event_seq, self.attempt)
                    if attempt is not None:
                        doc["attempt"] = attempt
                    if self.outbox is not None:
                        doc["outbox"] = self.outbox
                    lines.append(json.dumps(doc, sort_keys=True) + "\n")
                if not lines:
                    return 0
                payload = "".join(lines).encode()
                f.seek(0, os.SEEK_END)
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
                self._high_water = high
                self._size += len(payload)
                return len(lines)
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def read_all(self) -> list[JournalEntry]:
        """Every complete line, in file order, abandoned lineages included (a torn last line is left out)."""
        return _parse_lines(self.path, _complete(self.path.read_bytes())) if self.path.exists() else []

    def read(self) -> list[JournalEntry]:
        """The surviving lineage's entries, in file order (:func:`surviving_lineage`)."""
        return surviving_lineage(self.read_all())

    def curve(self, name: str, axis: str = EVENT_SEQ_AXIS) -> list[tuple[float, float]]:
        """``(axis value, metric value)`` points of one metric, in journal order.

        ``axis`` is ``orchestration/event_seq`` (the line's event_seq) or a metric logged in the same
        event (``train/global_step``, ``eval/checkpoint_step``). Events without both are skipped, and so
        are non-finite values. Only the surviving lineage is read (:meth:`read`), so after a resume
        the ``train/global_step`` axis stays monotonic.
        """
        points = []
        for entry in self.read():
            if name not in entry.metrics:
                continue
            x = entry.event_seq if axis == EVENT_SEQ_AXIS else entry.metrics.get(axis)
            y = entry.metrics[name]
            if x is None or not isinstance(y, int | float) or not math.isfinite(y):
                continue
            points.append((x, y))
        return points
