"""The SQLite WAL outbox between the learner and its supervisor (docs/ARCHITECTURE.md section 5).

The learner appends events; the supervisor reads them, writes control values (``stop_requested``,
the stop rule and each checkpoint's verdict) and records per-sink delivery high-water marks. The file lives at ``<run_dir>/outbox.sqlite``.

Public names:
    Outbox: one connection to an outbox file (one writer process and one reader process at a time).
    Event: one stored event row.
    event_id: the content hash that makes a replayed insert a no-op.
    EVENT_KINDS: the event kinds the learner emits.
    AT_CHECKPOINT: the stop rule "stop on acceptance only at checkpoint boundaries".
    OutboxError: the file could not be read or written (names it; errno ENOSPC for a full disk).
    OutboxBusy: an OutboxError: another process held the write lock past the busy timeout (transient).
"""

from gradlab.outbox.store import AT_CHECKPOINT, EVENT_KINDS, Event, Outbox, OutboxBusy, OutboxError, event_id

__all__ = ["AT_CHECKPOINT", "EVENT_KINDS", "Event", "Outbox", "OutboxBusy", "OutboxError", "event_id"]
