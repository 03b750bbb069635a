"""A learner frozen inside its outbox write (SIGSTOP, a swapping host) keeps SQLite's write lock: the
outbox says so (``OutboxBusy``), and the supervisor keeps its writes for later instead of failing
the attempt, losing none of them and delivering nothing twice."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gradlab.outbox import Outbox, OutboxBusy, OutboxError
from gradlab.outbox import store as outbox_store
from gradlab.runs.supervisor import BUSY_BACKOFF_S, SUPERVISOR_METRICS, CheckpointTrack, Supervisor
from tests.receipts.test_run_integrity import _Pending, _spec


class _Recorder:
    """A metric sink that keeps what it was given."""

    name = "recorder"

    def __init__(self) -> None:
        self.seqs: list[int] = []

    def deliver(self, events: list[tuple[int, dict]]) -> int:
        self.seqs += [seq for seq, _ in events]
        return max(seq for seq, _ in events)


def test_a_learner_frozen_inside_its_write_delays_the_supervisors_writes_and_loses_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox_store, "BUSY_TIMEOUT_S", 0.3)  # each refused write waits this long
    path = tmp_path / "outbox.sqlite"
    box, learner = Outbox(path), Outbox(path)
    sink, now = _Recorder(), [0.0]
    sup = Supervisor(spec=_spec(), attempt_id="attempt-001", outbox=box, submit_publish=lambda t: _Pending(),
                     submit_evaluate=lambda t: _Pending(), sinks=[sink], clock=lambda: now[0])
    # A checkpoint that could not be published: its verdict ("failed") is for the learner to read.
    sup.tracks[64] = CheckpointTrack(step=64, sha256="ab" * 32, path=Path(), purpose="periodic", ready_at=0.0,
                                     publish_error="Conflict: the model store is read-only")
    first = learner.append("metrics", 32, {"metrics": {"train/episode/count": 1}})
    sup.poll_outbox()

    frozen = sqlite3.connect(str(path), isolation_level=None)
    frozen.execute("BEGIN IMMEDIATE")  # the learner, stopped inside its transaction
    try:
        with pytest.raises(OutboxBusy, match=f"{path}: OperationalError: database is locked") as busy:
            box.request_stop("direct")
        assert isinstance(busy.value, OutboxError)  # what every caller that handles outbox errors catches
        sup.advance()  # the verdict is kept for later
        sup.ask_stop("accepted:64")  # decided now; the grace period runs from now, written or not
        sup._emit({"orchestration/eval/seconds": 1.5}, 64)  # the supervisor's own metrics, kept in order
        sup.deliver_metrics()  # delivered; the mark is kept for later
        assert sup.stop_asked_at == 0.0 and sup.stop_reason == "accepted:64"
        assert sink.seqs == [first]
    finally:
        frozen.execute("ROLLBACK")  # the learner goes on, or is killed: its lock goes with it
        frozen.close()
    reader = Outbox(path, readonly=True)
    assert (reader.verdict(64), reader.stop_requested(), reader.high_water(sink.name)) == (None, None, 0)

    now[0] += BUSY_BACKOFF_S
    sup.advance()
    second = learner.append("metrics", 96, {"metrics": {"train/episode/count": 2}})
    sup.poll_outbox()
    sup.deliver_metrics()
    assert reader.verdict(64) == "failed"
    assert reader.stop_requested() == "accepted:64"
    [emitted] = reader.read(0, 100, kind=SUPERVISOR_METRICS)
    assert (emitted.step, emitted.payload["metrics"]) == (64, {"orchestration/eval/seconds": 1.5})
    assert first < emitted.event_seq < second
    assert sink.seqs == [first, emitted.event_seq, second]  # each once, in order
    assert reader.high_water(sink.name) == second
