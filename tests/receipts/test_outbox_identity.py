"""A lost outbox is detected and loses no metrics silently; readers keep the surviving lineage
(issue: run integrity). Store parts run against the file store and moto's S3 server."""

from __future__ import annotations

import functools
import gc
from pathlib import Path

from gradlab import receipts as rules
from gradlab.metrics.journal import Journal
from gradlab.outbox import Outbox
from gradlab.receipts.lease import release_lease
from gradlab.runs import operations
from gradlab.runs.paths import RunPaths
from gradlab.runs.supervisor import JournalSink, Supervisor
from gradlab.stores import Stores

RUN = "gradlab-20260102T030405-00ba0b0c"
RETURN = "train/episode/return/shaped/mean"


@functools.cache
def _spec():
    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec

    return RunSpec.from_resolved(Experiments().resolve("gradlab__bandit/ppo"), seed=0, run_id=RUN, evaluate=False)


class _Never:
    def done(self) -> bool:
        return False


def _attempt(stores: Stores, paths: RunPaths, steps: list[int], value: float):
    """Open the next attempt; its 'learner' logs ``steps``; its supervisor delivers them to the journal."""
    plan = operations.open_attempt(stores, _spec(), paths)
    learner = Outbox(paths.outbox)
    learner.adopt_fence(starting=True)
    for step in steps:
        learner.append("metrics", step, {"metrics": {"train/global_step": float(step), RETURN: value + step / 1e4}})
    supervisor_outbox = Outbox(paths.outbox)
    sink = JournalSink(paths.journal, outbox=supervisor_outbox.identity(), attempt=plan.attempt.attempt_id)
    sup = Supervisor(spec=_spec(), attempt_id=plan.attempt.attempt_id, outbox=supervisor_outbox,
                     submit_publish=lambda t: _Never(), submit_evaluate=lambda t: _Never(), sinks=[sink],
                     evaluate=False, fence=plan.fence, opened_seq=plan.opened_seq, first_seq=plan.first_seq)
    sup.poll_outbox()
    sup.deliver_metrics()
    learner.close()
    release_lease(stores.control, plan.lease)
    return plan, supervisor_outbox, sink


def test_a_truncated_outbox_is_detected_and_the_counts_match_the_journal(stores: Stores, tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / RUN).ensure()
    operations.write_local_spec(paths, _spec())
    first, ob1, _ = _attempt(stores, paths, [2048, 4096, 6144, 8192], 0.0)
    old = ob1.identity()
    assert first.attempt.outbox == old and first.attempt.outbox_replaced is None
    ob1.close()
    gc.collect()  # open_attempt's own connection too: nothing holds the file when it is lost
    for suffix in ("", "-wal", "-shm"):  # the outbox is lost mid-run (truncated, its WAL gone)
        path = paths.outbox.with_name(paths.outbox.name + suffix)
        if path.exists():
            path.write_bytes(b"") if suffix == "" else path.unlink()
    second, ob2, sink = _attempt(stores, paths, [6144, 8192, 10240], 1.0)
    new = ob2.identity()
    assert new != old
    stored = next(a for a in rules.list_attempts(stores, RUN) if a.attempt_id == "attempt-002")
    assert stored.outbox == new
    assert stored.outbox_replaced == (f"{paths.outbox}: outbox {new} is not outbox {old} that attempt-001 recorded "
                                      "(lost, truncated or replaced); its events not yet delivered are lost")
    # event_seq restarted at 1, yet nothing of the new outbox was skipped as "already present".
    journal = Journal(paths.journal)
    lines = journal.read_all()
    assert [(e.attempt, e.outbox, e.event_seq) for e in lines] == (
        [("attempt-001", old, n) for n in (1, 2, 3, 4)] + [("attempt-002", new, n) for n in (1, 2, 3)])
    # What a receipt of attempt-002 reports (the outbox's journal mark) is exactly what the journal holds.
    assert ob2.high_water("journal") == sink.journal.high_water == journal.count(outbox=new) == 3


def test_curves_of_a_resumed_run_keep_the_surviving_lineage(stores: Stores, tmp_path: Path) -> None:
    """Attempt 1 logged up to 8192; attempt 2 resumed from the checkpoint at 4096."""
    paths = RunPaths(tmp_path / RUN).ensure()
    operations.write_local_spec(paths, _spec())
    _attempt(stores, paths, [2048, 4096, 6144, 8192], 0.0)
    _attempt(stores, paths, [6144, 8192, 10240], 1.0)
    journal = Journal(paths.journal)
    assert len(journal.read_all()) == 7  # every line is kept in the file
    curve = journal.curve(RETURN, axis="train/global_step")
    assert [x for x, _ in curve] == [2048, 4096, 6144, 8192, 10240]  # monotonic: no zig-zag
    assert [round(y, 4) for _, y in curve] == [0.2048, 0.4096, 1.6144, 1.8192, 2.024]  # attempt 2 from 6144 on
    assert [e.attempt for e in journal.read()] == ["attempt-001"] * 2 + ["attempt-002"] * 3
