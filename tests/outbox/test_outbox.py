"""The SQLite outbox: schema, idempotent appends, control, deliveries, crash safety."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gradlab.contracts.hashing import sha256_json
from gradlab.errors import ContractViolation
from gradlab.outbox import Outbox, event_id


def test_schema_and_pragmas(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "run" / "outbox.sqlite")
    conn = sqlite3.connect(tmp_path / "run" / "outbox.sqlite")
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"events", "control", "deliveries"} <= tables
    cols = [r[1] for r in conn.execute("PRAGMA table_info(events)")]
    assert cols == ["event_seq", "event_id", "kind", "step", "payload", "created_at", "attempt", "epoch"]
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # synchronous is per connection: FULL = 2 on the outbox's own connection.
    assert ob._conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    ob.close()


def test_replayed_insert_adds_no_row(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "outbox.sqlite")
    payload = {"metrics": {"train/global_step": 2048, "train/episode/length/mean": 21.5}}
    assert ob.append("metrics", 2048, payload) == 1
    # Same content, keys in another order: same event_id, ignored.
    assert ob.append("metrics", 2048, {"metrics": {"train/episode/length/mean": 21.5, "train/global_step": 2048}}) is None
    assert ob.count() == 1
    assert ob.append("metrics", 4096, payload) == 2  # a different step is a different event
    events = ob.read()
    assert [e.event_seq for e in events] == [1, 2]
    assert events[0].event_id == sha256_json({"kind": "metrics", "step": 2048, "payload": payload})
    assert events[0].event_id == event_id("metrics", 2048, payload)
    assert events[0].payload == payload and events[0].step == 2048 and events[0].kind == "metrics"
    # A second connection (another process's view) replaying the insert also adds nothing.
    other = Outbox(tmp_path / "outbox.sqlite")
    assert other.append("metrics", 2048, payload) is None
    assert other.count() == 2


def test_read_after_limit_and_kind(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "outbox.sqlite")
    for i in range(10):
        ob.append("metrics" if i % 2 else "checkpoint_ready", i * 100, {"i": i})
    assert [e.event_seq for e in ob.read(after_seq=3, limit=4)] == [4, 5, 6, 7]
    assert [e.payload["i"] for e in ob.read(kind="checkpoint_ready")] == [0, 2, 4, 6, 8]
    assert ob.last("metrics").payload == {"i": 9}
    assert ob.max_seq() == 10


def test_last_metric_is_the_newest_event_carrying_a_number_there_for_the_attempt(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "outbox.sqlite")
    name = "train/episode/return/raw/mean"
    assert ob.last_metric(name) is None
    ob.stamp = ("attempt-001", 1)
    ob.append("metrics", 512, {"metrics": {name: 0.25, "train/global_step": 512}})
    ob.append("metrics", 1024, {"metrics": {name: 3}})
    ob.append("metrics", 1536, {"metrics": {"train/global_step": 1536}})  # no episode ended: not carried
    ob.append("checkpoint", 2048, {"metrics": {name: 9.0}})  # another kind
    assert ob.last_metric(name) == (1024, 3.0)
    ob.stamp = ("attempt-002", 2)
    ob.append("metrics", 768, {"metrics": {name: 0.5}})
    assert ob.last_metric(name) == (768, 0.5)
    assert ob.last_metric(name, attempt="attempt-001") == (1024, 3.0)
    assert ob.last_metric(name, attempt="attempt-003") is None
    assert ob.last_metric("train/loss/value") is None


def test_payload_must_be_finite_json(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "outbox.sqlite")
    with pytest.raises(ContractViolation, match="metrics"):
        ob.append("metrics", 1, {"x": float("nan")})
    assert ob.count() == 0


def test_control_and_deliveries(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "outbox.sqlite")
    assert ob.stop_requested() is None
    ob.request_stop("accepted:000000002048")
    reader = Outbox(tmp_path / "outbox.sqlite")
    assert reader.stop_requested() == "accepted:000000002048"
    ob.clear_stop()
    assert reader.stop_requested() is None
    ob.request_stop("user")
    assert reader.stop_requested() == "user"
    ob.set_control("note", "a")
    ob.set_control("note", "b")
    assert reader.get_control("note") == "b"
    assert reader.get_control("missing") is None
    assert ob.high_water("journal") == 0
    ob.ack("journal", 7)
    ob.ack("journal", 5)  # never moves back
    assert reader.high_water("journal") == 7
    ob.ack("journal", 12)
    assert reader.high_water("journal") == 12


_WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from gradlab.outbox import Outbox
    ob = Outbox(Path(sys.argv[1]))
    print("ready", flush=True)
    i = 0
    while True:
        i += 1
        ob.append("metrics", i, {"metrics": {"train/global_step": i}, "pad": "x" * 4000})
""")


def test_sigkill_mid_write_leaves_readable_outbox(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 20
        while Outbox(path).max_seq() < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    ob = Outbox(path)
    assert ob._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    events = ob.read(limit=1_000_000)
    n = len(events)
    assert n >= 50
    # Every committed event is whole: seqs 1..n without gaps, step i has payload i.
    assert [e.event_seq for e in events] == list(range(1, n + 1))
    assert all(e.payload["metrics"]["train/global_step"] == e.step == e.event_seq for e in events)
    # And the file is writable again by the next writer.
    assert ob.append("learner_started", n, {"pid": 1, "step": n}) == n + 1


def test_held_events_commit_together_in_call_order(tmp_path: Path) -> None:
    """Events appended with hold_s inside the window wait (another reader sees none of them) and
    commit in one transaction, in call order, ahead of the next event that is not held."""
    path = tmp_path / "outbox.sqlite"
    writer, reader = Outbox(path), Outbox(path, readonly=True)
    first = writer.append("metrics", 1, {"metrics": {"m": 1.0}}, hold_s=3600)
    assert first is not None  # the connection's first commit: nothing to share a batch with yet
    held = [writer.append("metrics", s, {"metrics": {"m": float(s)}}, hold_s=3600) for s in (2, 3, 4)]
    assert held == [None, None, None] and reader.count() == 1
    seq = writer.append("checkpoint_ready", 4, {"sha256": "ab"})
    events = reader.read(0)
    assert [(e.kind, e.step) for e in events] == [("metrics", 1), ("metrics", 2), ("metrics", 3), ("metrics", 4),
                                                  ("checkpoint_ready", 4)]
    assert seq == events[-1].event_seq
    writer.append("metrics", 5, {"metrics": {"m": 5.0}}, hold_s=3600)
    assert reader.count("metrics") == 4
    writer.flush()
    assert reader.count("metrics") == 5
    writer.append("metrics", 6, {"metrics": {"m": 6.0}}, hold_s=3600)
    writer.close()  # commits what is held
    assert [e.step for e in reader.read(0, kind="metrics")] == [1, 2, 3, 4, 5, 6]
    reader.close()


def test_a_held_event_after_the_window_commits_at_once(tmp_path: Path) -> None:
    """A stream slower than hold_s is not delayed: each event finds the last commit old enough."""
    path = tmp_path / "outbox.sqlite"
    writer, reader = Outbox(path), Outbox(path, readonly=True)
    for step in range(3):
        assert writer.append("metrics", step, {"metrics": {"m": float(step)}}, hold_s=1e-9) is not None
        assert reader.count("metrics") == step + 1
    writer.close()
    reader.close()


def test_a_held_event_is_committed_by_the_timer_when_nothing_follows(tmp_path: Path) -> None:
    """A held event after which the writer goes quiet (a slow rollout after a fast one, a paused
    learner) is committed about hold_s later by the outbox's timer, not at the next append."""
    path = tmp_path / "outbox.sqlite"
    writer, reader = Outbox(path), Outbox(path, readonly=True)
    writer.append("metrics", 1, {"metrics": {"m": 1.0}}, hold_s=0.5)  # committed: the first commit
    held_at = time.monotonic()
    assert writer.append("metrics", 2, {"metrics": {"m": 2.0}}, hold_s=0.5) is None
    while reader.count("metrics") < 2:
        assert time.monotonic() - held_at < 60, "the held event was never committed"
        time.sleep(0.01)
    assert time.monotonic() - held_at >= 0.45  # held for its window, not committed at once
    writer.close()
    assert [e.step for e in reader.read(0)] == [1, 2]
    reader.close()
