"""The outbox file: schema, appends, reads, control values and delivery marks.

Schema (docs/ARCHITECTURE.md section 5)::

    events(event_seq INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT UNIQUE, kind, step,
           payload JSON, created_at, attempt, epoch)
    control(key PRIMARY KEY, value, updated_at)
    deliveries(sink PRIMARY KEY, high_water)

Fencing (docs/ARCHITECTURE.md section 5): the supervisor writes its attempt id and lease epoch to
``control`` (key ``fence``) when it opens the attempt; the learner adopts the first fence it sees
and stamps every event it writes with it (``attempt``, ``epoch``). A learner whose fence is no
longer the current one has been superseded by a newer attempt and stops at its next safe
boundary; the supervisor accepts only events stamped with its own fence.

The database runs in WAL mode with ``synchronous=FULL``: a committed event survives a crash or a
SIGKILL of the writer, and a reader never sees a half-written transaction. Every write is one
transaction; ``busy_timeout`` makes a writer wait for the other process instead of failing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gradlab.contracts.hashing import canonical_json, sha256_bytes
from gradlab.errors import ContractViolation, GradlabError

logger = logging.getLogger(__name__)

EVENT_KINDS = ("learner_started", "metrics", "checkpoint_ready", "stop_observed", "learner_finished")
"""Event kinds the learner writes (payloads: docs/ARCHITECTURE.md section 5)."""

STOP_KEY = "stop_requested"
FENCE_KEY = "fence"
#: Control key: the attempt whose supervisor loop is watching (:meth:`Outbox.mark_supervised`).
SUPERVISED_KEY = "supervised"
IDENTITY_KEY = "identity"
#: Control key: the stop rule the supervisor announces to its learner (:meth:`Outbox.set_stop_rule`).
STOP_RULE_KEY = "stop_rule"
#: The stop rule under which the learner stops on acceptance only at checkpoint boundaries, waiting
#: at each for the verdict on the checkpoint before (docs/ARCHITECTURE.md section 5).
AT_CHECKPOINT = "at_checkpoint"
#: Control key prefix of one checkpoint's verdict (:meth:`Outbox.set_verdict`): ``verdict:<step:012d>``.
VERDICT_PREFIX = "verdict:"
BUSY_TIMEOUT_S = 30.0
#: SQLite's result code for "database or disk is full" (https://sqlite.org/rescode.html#full).
_SQLITE_FULL = 13
#: SQLite's primary result codes for a lock another connection holds: SQLITE_BUSY, SQLITE_LOCKED
#: (https://sqlite.org/rescode.html#busy); extended codes carry them in their low byte.
_SQLITE_BUSY_CODES = (5, 6)


class OutboxError(GradlabError, OSError):
    """The outbox file could not be read or written: names the file, and the errno when SQLite's
    error is one (a full disk is ``ENOSPC``)."""


class OutboxBusy(OutboxError):
    """Another process held the outbox's write lock past the busy timeout (:data:`BUSY_TIMEOUT_S`):
    a learner frozen inside its write (SIGSTOP, a swapping host). Transient: the same write may
    succeed later, and does once that process goes on or is killed."""


@contextlib.contextmanager
def _named(path: Path) -> Iterator[None]:
    """Turn SQLite's errors into :class:`OutboxError` naming ``path`` (SQLite's own names no file;
    its message is kept in the new one, which is the first cause a receipt's reason names)."""
    try:
        yield
    except sqlite3.Error as e:
        full = getattr(e, "sqlite_errorcode", None) == _SQLITE_FULL or "disk is full" in str(e)
        if full:
            raise OutboxError(errno.ENOSPC, f"No space left on device (SQLite: {e})", str(path)) from None
        code = getattr(e, "sqlite_errorcode", None)
        if (code is not None and code & 0xFF in _SQLITE_BUSY_CODES) or "database is locked" in str(e):
            raise OutboxBusy(f"{path}: {type(e).__name__}: {e}") from None
        raise OutboxError(f"{path}: {type(e).__name__}: {e}") from None

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events(
    event_seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    step INTEGER NOT NULL,
    payload TEXT NOT NULL,
    created_at TEXT NOT NULL,
    attempt TEXT,
    epoch INTEGER
);
CREATE INDEX IF NOT EXISTS events_kind ON events(kind, event_seq);
CREATE TABLE IF NOT EXISTS control(
    key TEXT PRIMARY KEY,
    value TEXT,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS deliveries(
    sink TEXT PRIMARY KEY,
    high_water INTEGER NOT NULL
);
"""


@dataclass(frozen=True)
class Event:
    """One row of ``events``.

    Attributes:
        event_seq: position in the outbox, 1-based, strictly increasing (W&B's step).
        event_id: sha256 hex of the event's content (see :func:`event_id`).
        kind: one of :data:`EVENT_KINDS` (others are stored as given).
        step: env steps (``train/global_step``) when the event was written.
        payload: the event's JSON object.
        created_at: ISO-8601 UTC time of the insert.
    """

    event_seq: int
    event_id: str
    kind: str
    step: int
    payload: dict[str, Any]
    created_at: str
    attempt: str | None = None
    epoch: int | None = None

    @property
    def fence(self) -> tuple[str, int] | None:
        """(attempt id, lease epoch) the event was stamped with, or None (written before any fence)."""
        return (self.attempt, self.epoch) if self.attempt is not None and self.epoch is not None else None

    def as_json(self) -> dict[str, Any]:
        return {"event_seq": self.event_seq, "event_id": self.event_id, "kind": self.kind, "step": self.step,
                "payload": self.payload, "created_at": self.created_at, "attempt": self.attempt,
                "epoch": self.epoch}


def event_id(kind: str, step: int, payload: dict[str, Any], fence: tuple[str, int] | None = None) -> str:
    """Content hash of an event: sha256 hex of canonical JSON ``{"kind", "step", "payload"}`` (plus
    ``"attempt"`` and ``"epoch"`` when stamped, so another attempt's event never collides).

    Two inserts with the same kind, step, payload and stamp have the same id, so the second is ignored.

    Raises:
        ContractViolation: the payload is not JSON-serialisable (or holds NaN/inf).
    """
    content: dict[str, Any] = {"kind": kind, "step": int(step), "payload": payload}
    if fence is not None:
        content.update(attempt=fence[0], epoch=int(fence[1]))
    try:
        return sha256_bytes(canonical_json(content))
    except (TypeError, ValueError) as e:
        raise ContractViolation(f"outbox event {kind!r} at step {step}: payload is not canonical JSON: {e}") from None


def _event(r: Any) -> Event:
    return Event(int(r[0]), r[1], r[2], int(r[3]), json.loads(r[4]), r[5],
                 r[6] if r[6] is not None else None, int(r[7]) if r[7] is not None else None)


def _now() -> str:
    return datetime.now(UTC).isoformat()


class Outbox:
    """One connection to ``outbox.sqlite``; creates the file and schema when missing.

    Safe for one writer process and one reader process at a time (SQLite WAL); within a process the
    connection is guarded by a lock, so threads may share one ``Outbox``.

    Args:
        path: the outbox file (``<run_dir>/outbox.sqlite``); its folder is created if needed.
        readonly: open without creating or writing (a reader that must not create a file).

    Raises:
        NotFound: ``readonly`` and the file does not exist.
    """

    def __init__(self, path: Path, *, readonly: bool = False):
        self.path = Path(path)
        self._lock = threading.RLock()  # re-entered by a held append that commits its batch
        if readonly:
            if not self.path.is_file():
                from gradlab.errors import NotFound

                raise NotFound(f"{self.path}: no outbox file")
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        with _named(self.path):
            cols = self._open(readonly)
        self._select = ("SELECT event_seq, event_id, kind, step, payload, created_at, "
                        + ("attempt, epoch" if {"attempt", "epoch"} <= cols else "NULL, NULL") + " FROM events")
        #: The fence this connection stamps its events with (see the module docstring).
        self.stamp: tuple[str, int] | None = None
        self._held: list[tuple[Any, ...]] = []  # events appended with hold_s, not yet committed
        self._committed_at = float("-inf")  # time.monotonic() of this connection's last commit
        self._timer: threading.Timer | None = None  # commits held events hold_s after the first was held
        self._closed = False

    def _open(self, readonly: bool) -> set[str]:
        """Connect and (unless ``readonly``) set WAL and the schema; returns the events columns.

        Two processes opening a new outbox at once (the learner creating it, the driver fencing it)
        can meet a ``database is locked`` that SQLite's busy handler does not wait out: switching
        to WAL and the WAL index's first set-up answer busy at once. Such an open is retried, with
        a growing pause, for up to :data:`BUSY_TIMEOUT_S`.

        Raises:
            sqlite3.Error: anything else, or still busy after :data:`BUSY_TIMEOUT_S`.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        pause = 0.01
        while True:
            try:
                return self._connect(readonly)
            except sqlite3.OperationalError as e:
                busy = "locked" in str(e) or "busy" in str(e)
                with contextlib.suppress(AttributeError, sqlite3.Error):
                    self._conn.close()
                if not busy or time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.5)

    def _connect(self, readonly: bool) -> set[str]:
        self._conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                     check_same_thread=False)
        self._conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        if not readonly:
            mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                logger.warning("%s: journal_mode is %s, not wal", self.path, mode)
        self._conn.execute("PRAGMA synchronous=FULL")
        if not readonly:
            with self._lock:
                self._conn.executescript(_SCHEMA)
                cols = {r[1] for r in self._conn.execute("PRAGMA table_info(events)")}
                for name, kind in (("attempt", "TEXT"), ("epoch", "INTEGER")):
                    if name not in cols:  # an outbox written before events were stamped
                        self._conn.execute(f"ALTER TABLE events ADD COLUMN {name} {kind}")
                # The outbox's identity: a random nonce fixed when the file is created, so a lost
                # or replaced outbox (its event_seq restarting at 1) is told apart from this one.
                self._conn.execute("INSERT OR IGNORE INTO control(key, value, updated_at) VALUES (?, ?, ?)",
                                   (IDENTITY_KEY, secrets.token_hex(8), _now()))
        with self._lock:
            return {r[1] for r in self._conn.execute("PRAGMA table_info(events)")}

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Commit the held events, then close the connection.

        A commit that fails here is logged, not raised: close runs in ``finally`` blocks, where
        raising would replace the error that is on its way out (a full disk, a bug) with this one;
        what is lost is at most the held ``metrics`` events, as a SIGKILL would lose them.
        """
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            try:
                if self._held:
                    self._commit([])
            except Exception as e:  # noqa: BLE001 - see the docstring
                logger.warning("%s: %d held event(s) not committed at close: %s", self.path, len(self._held), e)
            finally:
                self._conn.close()

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- events ------------------------------------------------------------------------------
    def append(self, kind: str, step: int, payload: dict[str, Any], *, hold_s: float = 0.0) -> int | None:
        """Insert one event, committed at once, or held for a batch (``hold_s > 0``).

        A held event is checked and stamped now and committed at once if this outbox's last
        commit is ``hold_s`` seconds old or more; otherwise it waits, and is committed in one
        transaction with the events held beside it by the first later append that finds the last
        commit that old, by the next append that is not held (ahead of it, so the order of calls
        is the order of ``event_seq``), by :meth:`flush` / :meth:`close`, or by a timer thread
        ``hold_s`` seconds after the first of them was held, whichever comes first. So events that
        come less than ``hold_s`` apart share a commit, none waits much more than ``hold_s``, and a
        slower stream is not delayed. The learner
        holds its per-rollout ``metrics`` events this way: one fsync per batch instead of one per
        rollout (docs/ARCHITECTURE.md section 5); it flushes before it waits on anything.

        Args:
            kind: event kind (:data:`EVENT_KINDS`).
            step: env steps at the event.
            payload: JSON object (finite numbers only).
            hold_s: seconds the event may wait for a batch; 0 commits it now.

        Returns:
            The new ``event_seq``; None when an event with the same content already existed or
            the event is still held.

        Raises:
            ContractViolation: the payload is not a JSON object of finite values.
        """
        if not isinstance(payload, dict):
            raise ContractViolation(f"outbox event {kind!r}: payload must be a JSON object, found {type(payload).__name__}")
        stamp = self.stamp
        eid = event_id(kind, step, payload, stamp)
        body = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
        row = (eid, kind, int(step), body, _now(), *(stamp if stamp else (None, None)))
        if hold_s > 0:
            with self._lock:
                self._held.append(row)
                if time.monotonic() - self._committed_at < hold_s:
                    if self._timer is None:
                        self._timer = threading.Timer(hold_s, self._commit_held)
                        self._timer.daemon = True
                        self._timer.start()
                    return None
                return self._commit([])
        return self._commit([row])

    def _commit_held(self) -> None:
        """The hold timer: commit what is held (a failure is logged; the next append or close retries)."""
        with self._lock:
            self._timer = None
            if self._closed or not self._held:
                return
            try:
                self._commit([])
            except Exception as e:  # noqa: BLE001 - a thread has no caller to raise to
                logger.warning("%s: held events not committed yet: %s", self.path, e)

    def flush(self) -> None:
        """Commit the held events (:meth:`append` with ``hold_s``), if any."""
        with self._lock:
            if self._held:
                self._commit([])

    def _commit(self, rows: list[tuple[Any, ...]]) -> int | None:
        """Insert the held events, then ``rows``, in one write transaction; the last one's ``event_seq``."""
        last: int | None = None
        with self._lock, _named(self.path):
            rows = self._held + rows
            # Look up and insert in one write transaction: a plain INSERT OR IGNORE would burn an
            # AUTOINCREMENT number on the ignored row and leave a gap in event_seq.
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for row in rows:
                    if self._conn.execute("SELECT 1 FROM events WHERE event_id = ?", (row[0],)).fetchone():
                        last = None
                        continue
                    cur = self._conn.execute(
                        "INSERT INTO events(event_id, kind, step, payload, created_at, attempt, epoch) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)", row)
                    last = int(cur.lastrowid)  # type: ignore[arg-type]
                self._conn.execute("COMMIT")
                self._committed_at = time.monotonic()
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
            except BaseException:
                # SQLite may have rolled back already (a full disk does): a second ROLLBACK would
                # raise "no transaction is active" and hide the first error. The held events stay
                # held, so a later commit can still write them.
                if self._conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._conn.execute("ROLLBACK")
                raise
            self._held = []
            return last

    def read(self, after_seq: int = 0, limit: int = 1000, *, kind: str | None = None) -> list[Event]:
        """Events with ``event_seq > after_seq`` in order, at most ``limit`` of them (optionally one kind)."""
        sql = self._select + " WHERE event_seq > ?"
        args: list[Any] = [int(after_seq)]
        if kind is not None:
            sql += " AND kind = ?"
            args.append(kind)
        sql += " ORDER BY event_seq LIMIT ?"
        args.append(int(limit))
        with self._lock, _named(self.path):
            rows = self._conn.execute(sql, args).fetchall()
        return [_event(r) for r in rows]

    def last(self, kind: str) -> Event | None:
        """The most recent event of ``kind``, or None."""
        with self._lock, _named(self.path):
            r = self._conn.execute(self._select + " WHERE kind = ? ORDER BY event_seq DESC LIMIT 1", (kind,)).fetchone()
        return None if r is None else _event(r)

    def last_metric(self, name: str, *, attempt: str | None = None) -> tuple[int, float] | None:
        """(step, value) of metric ``name`` in the most recent ``metrics`` event that carries it.

        Args:
            name: a metric name (a key of the event's ``payload["metrics"]``).
            attempt: only events stamped with this attempt (unstamped events also count: an outbox
                written before events carried their fence).

        Returns:
            (env steps, the value as a float), or None when no such event carries a number there.
        """
        path = '$.metrics."' + name.replace('"', '\\"') + '"'
        sql = ("SELECT step, json_extract(payload, ?) FROM events WHERE kind = 'metrics' "
               "AND json_type(payload, ?) IN ('integer', 'real')")
        args: list[Any] = [path, path]
        if attempt is not None and "attempt" in self._select:
            sql += " AND (attempt = ? OR attempt IS NULL)"
            args.append(attempt)
        sql += " ORDER BY event_seq DESC LIMIT 1"
        with self._lock, _named(self.path):
            r = self._conn.execute(sql, args).fetchone()
        return None if r is None else (int(r[0]), float(r[1]))

    def max_seq(self) -> int:
        """The highest ``event_seq`` written so far (0 when empty)."""
        with self._lock, _named(self.path):
            r = self._conn.execute("SELECT COALESCE(MAX(event_seq), 0) FROM events").fetchone()
        return int(r[0])

    def count(self, kind: str | None = None) -> int:
        with self._lock, _named(self.path):
            if kind is None:
                r = self._conn.execute("SELECT COUNT(*) FROM events").fetchone()
            else:
                r = self._conn.execute("SELECT COUNT(*) FROM events WHERE kind = ?", (kind,)).fetchone()
        return int(r[0])

    # -- control -----------------------------------------------------------------------------
    def set_control(self, key: str, value: str | None) -> None:
        """Upsert one control value (the supervisor's side)."""
        with self._lock, _named(self.path):
            self._conn.execute(
                "INSERT INTO control(key, value, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                (key, value, _now()),
            )

    def get_control(self, key: str) -> str | None:
        with self._lock, _named(self.path):
            r = self._conn.execute("SELECT value FROM control WHERE key = ?", (key,)).fetchone()
        return None if r is None else r[0]

    def request_stop(self, reason: str) -> None:
        """Ask the learner to stop at its next safe boundary; ``reason`` is recorded (non-empty)."""
        if not reason:
            raise ContractViolation("request_stop: reason must be a non-empty string")
        self.set_control(STOP_KEY, reason)

    def clear_stop(self) -> None:
        """Withdraw a stop request (a new attempt that resumes in the same run directory must, or
        its learner stops after its first update)."""
        self.set_control(STOP_KEY, None)

    def stop_requested(self) -> str | None:
        """The stop reason if a stop was requested, else None."""
        value = self.get_control(STOP_KEY)
        return value or None

    def mark_supervised(self, attempt: str) -> None:
        """The supervisor's side: its loop is watching this outbox for ``attempt`` (the driver's
        first act); a learner started with ``--await-supervisor`` takes its first step only then."""
        self.set_control(SUPERVISED_KEY, attempt)

    def supervised(self) -> str | None:
        """The attempt whose supervisor is watching this outbox, or None before any is."""
        return self.get_control(SUPERVISED_KEY) or None

    def set_stop_rule(self, rule: str | None) -> None:
        """The supervisor's side: announce how its learner stops on acceptance (:data:`AT_CHECKPOINT`),
        or withdraw the rule (None: a learner waits for no verdict and stops as soon as asked)."""
        self.set_control(STOP_RULE_KEY, rule)

    def stop_rule(self) -> str | None:
        """The announced stop rule, or None (no evaluation, no stop on acceptance, no supervisor yet)."""
        return self.get_control(STOP_RULE_KEY) or None

    def set_verdict(self, step: int, status: str) -> None:
        """The supervisor's side: the checkpoint at ``step`` has its final evaluation status
        (``accepted``, ``rejected``, ``failed``, ``deferred``): no other verdict will come for it."""
        if not status:
            raise ContractViolation(f"set_verdict: step {step}: status must be a non-empty string")
        self.set_control(f"{VERDICT_PREFIX}{int(step):012d}", status)

    def verdict(self, step: int) -> str | None:
        """The verdict recorded for the checkpoint at ``step``, or None while it has none."""
        return self.get_control(f"{VERDICT_PREFIX}{int(step):012d}") or None

    def identity(self) -> str | None:
        """The outbox's identity nonce (16 hex), fixed when the file was created; None for an
        outbox created before outboxes had one (opened read-only)."""
        return self.get_control(IDENTITY_KEY)

    # -- fencing -----------------------------------------------------------------------------
    def set_fence(self, attempt: str, epoch: int) -> None:
        """The supervisor's side: make (attempt, epoch) the current fence, and stamp this
        connection's own events (``supervisor_metrics``) with it."""
        self.set_control(FENCE_KEY, json.dumps({"attempt": attempt, "epoch": int(epoch)}))
        self.stamp = (attempt, int(epoch))

    def fence(self) -> tuple[str, int] | None:
        """The current fence (attempt id, lease epoch), or None when no supervisor has set one."""
        raw = self.get_control(FENCE_KEY)
        if not raw:
            return None
        try:
            data = json.loads(raw)
            return str(data["attempt"]), int(data["epoch"])
        except (ValueError, KeyError, TypeError):
            raise ContractViolation(f"{self.path}: control '{FENCE_KEY}': expected {{attempt, epoch}}, "
                                    f"found {raw[:80]!r}") from None

    def adopt_fence(self, *, starting: bool = False) -> tuple[str, int] | None:
        """The learner's side: stamp events with the current fence if none yet; returns the stamp.

        A learner started by its supervisor (``starting``) adopts whatever fence it finds: the
        supervisor wrote it first. Later (a learner started before its run's first attempt was
        opened, as ``gradlab train`` does) only the run's first epoch is adopted: an unstamped
        learner that finds a later epoch belongs to no attempt of that epoch and is superseded.
        """
        if self.stamp is None:
            current = self.fence()
            if current is not None and (starting or current[1] == 1):
                self.stamp = current
        return self.stamp

    def superseded(self) -> str | None:
        """Why this connection's stamp is no longer current (a newer attempt fenced it out), or None."""
        current = self.fence()
        if self.stamp is None:
            return None if current is None or current[1] == 1 else \
                f"an unstamped learner superseded by {current[0]} epoch {current[1]}"
        if current == self.stamp:
            return None
        found = f"{current[0]} epoch {current[1]}" if current else "no fence"
        return f"attempt {self.stamp[0]} epoch {self.stamp[1]} superseded by {found}"

    # -- deliveries --------------------------------------------------------------------------
    def ack(self, sink: str, event_seq: int) -> None:
        """Record that ``sink`` has everything up to ``event_seq``; the mark never moves back."""
        with self._lock, _named(self.path):
            self._conn.execute(
                "INSERT INTO deliveries(sink, high_water) VALUES (?, ?) "
                "ON CONFLICT(sink) DO UPDATE SET high_water = MAX(high_water, excluded.high_water)",
                (sink, int(event_seq)),
            )

    def high_water(self, sink: str) -> int:
        """The highest acknowledged ``event_seq`` of ``sink`` (0 when none)."""
        with self._lock, _named(self.path):
            r = self._conn.execute("SELECT high_water FROM deliveries WHERE sink = ?", (sink,)).fetchone()
        return 0 if r is None else int(r[0])
