"""The local metrics journal: one JSON line per delivered outbox event, always written.

Each line is ``{"event_seq": int, "metrics": {name: value}}`` (sorted keys), appended, flushed and
fsynced before :meth:`Journal.write` returns, so a delivery acknowledged to the outbox is on disk.
Writes are idempotent by ``event_seq``: an event at or below the journal's high-water mark is
skipped, so re-delivering after a crash adds nothing. A torn last line (a crash mid-append) is cut
off when the journal is opened. The journal holds enough to draw every curve offline
(:meth:`Journal.curve`); axis values (``train/global_step``, ``eval/checkpoint_step``) travel inside
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


@dataclass(frozen=True)
class JournalEntry:
    """One journal line."""

    event_seq: int
    metrics: dict[str, Any]


def _parse_lines(path: Path, data: bytes) -> list[JournalEntry]:
    entries = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            entries.append(JournalEntry(int(doc["event_seq"]), dict(doc["metrics"])))
        except (ValueError, KeyError, TypeError) as e:
            raise ContractViolation(f"{path}:{number}: expected a journal line {{event_seq, metrics}}: {e}") from None
    return entries


class Journal:
    """Append-only JSON-lines metrics journal of one run (see the module docstring).

    Args:
        path: the journal file (e.g. ``<run_dir>/metrics.jsonl``); created with its parent folders.

    Raises:
        ContractViolation: an existing journal has a malformed line before its last one.
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._high_water = 0
        self._size = -1
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
        self._high_water = max((e.event_seq for e in entries), default=0)
        self._size = len(data)

    @property
    def high_water(self) -> int:
        """The largest ``event_seq`` written (0 for an empty journal)."""
        return self._high_water

    def write(self, event_seq: int, metrics: Mapping[str, Any]) -> bool:
        """Append one event durably unless ``event_seq`` is at or below the high-water mark.

        Args:
            event_seq: the outbox event's sequence number (>= 1; increasing).
            metrics: metric name → JSON-compatible value (NaN/inf are written as JSON NaN/Infinity).

        Returns:
            True when written, False when skipped as already present.
        """
        return self.write_many([(event_seq, metrics)]) == 1

    def write_many(self, events: Iterable[tuple[int, Mapping[str, Any]]]) -> int:
        """Append several events with one fsync; skip those at or below the high-water mark.

        Returns:
            The number of events written.
        """
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
                    lines.append(
                        json.dumps({"event_seq": int(event_seq), "metrics": dict(metrics)}, sort_keys=True) + "\n"
                    )
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

    def read(self) -> list[JournalEntry]:
        """Every entry, in file order (increasing ``event_seq``)."""
        return _parse_lines(self.path, self.path.read_bytes()) if self.path.exists() else []

    def curve(self, name: str, axis: str = EVENT_SEQ_AXIS) -> list[tuple[float, float]]:
        """``(axis value, metric value)`` points of one metric, in journal order.

        ``axis`` is ``orchestration/event_seq`` (the line's event_seq) or a metric logged in the same
        event (``train/global_step``, ``eval/checkpoint_step``). Events without both are skipped, and so
        are non-finite values.
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
