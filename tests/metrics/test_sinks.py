"""Metric sinks: the local journal and W&B (offline, for real; online only as the unreachable case)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from gradlab.errors import ConfigError, ContractViolation
from gradlab.metrics.journal import Journal, JournalEntry
from gradlab.metrics.wandb_sink import WandbSink, read_offline_history
from tests.s3server import free_port

RUN = "gradlab-20260102T030405-0123abcd"


def _train(step: int, ret: float) -> dict:
    return {"train/global_step": step, "train/episode/return/shaped/mean": ret}


# -- journal -----------------------------------------------------------------------------------
def test_journal_appends_and_skips_redelivered_event_seq(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "run" / "metrics.jsonl")
    assert journal.high_water == 0
    assert journal.write(1, _train(128, 10.0)) is True
    assert journal.write(2, _train(256, 20.5)) is True
    assert journal.write(2, _train(256, 99.0)) is False  # replay of an acknowledged event
    assert journal.write(1, _train(128, 99.0)) is False
    assert journal.write_many([(2, _train(256, 0)), (3, _train(384, 30.0)), (4, {"eval/checkpoint_step": 256})]) == 2
    assert journal.high_water == 4
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4
    assert json.loads(lines[1]) == {"event_seq": 2, "metrics": {"train/episode/return/shaped/mean": 20.5,
                                                                "train/global_step": 256}}
    # A new process (re-opened journal) keeps the mark: a replay after a crash adds nothing.
    reopened = Journal(tmp_path / "run" / "metrics.jsonl")
    assert reopened.high_water == 4
    assert reopened.write(3, _train(384, 1.0)) is False
    assert reopened.read() == [
        JournalEntry(1, _train(128, 10.0)), JournalEntry(2, _train(256, 20.5)), JournalEntry(3, _train(384, 30.0)),
        JournalEntry(4, {"eval/checkpoint_step": 256}),
    ]


def test_journal_curves(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "m.jsonl")
    journal.write(1, _train(128, 10.0))
    journal.write(2, {"eval/checkpoint_step": 128, "eval/episode/return/mean": 500.0})
    journal.write(3, _train(256, float("nan")))
    journal.write(5, _train(384, 30.0))
    assert journal.curve("train/episode/return/shaped/mean", "train/global_step") == [(128, 10.0), (384, 30.0)]
    assert journal.curve("train/episode/return/shaped/mean") == [(1, 10.0), (5, 30.0)]
    assert journal.curve("eval/episode/return/mean", "eval/checkpoint_step") == [(128, 500.0)]
    assert math.isnan(journal.read()[2].metrics["train/episode/return/shaped/mean"])


def test_journal_cuts_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    Journal(path).write(1, _train(128, 1.0))
    with open(path, "ab") as f:
        f.write(b'{"event_seq": 2, "metr')  # crash mid-append
    journal = Journal(path)
    assert journal.high_water == 1
    assert journal.write(2, _train(256, 2.0)) is True
    assert [e.event_seq for e in journal.read()] == [1, 2]


def test_journal_refuses_a_corrupt_middle_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"event_seq": 1, "metrics": {}}\nnot json\n{"event_seq": 3, "metrics": {}}\n')
    with pytest.raises(ContractViolation, match="m.jsonl:2"):
        Journal(path)


def test_two_journal_writers_share_the_mark(tmp_path: Path) -> None:
    a, b = Journal(tmp_path / "m.jsonl"), Journal(tmp_path / "m.jsonl")
    assert a.write(1, {"x/y": 1}) is True
    assert b.write(1, {"x/y": 1}) is False  # b sees a's line before deciding
    assert b.write(2, {"x/y": 2}) is True
    assert [e.event_seq for e in a.read()] == [1, 2]


# -- W&B ---------------------------------------------------------------------------------------
def test_wandb_offline_replay_adds_no_point(tmp_path: Path) -> None:
    wandb_dir = tmp_path / "run"
    sink = WandbSink(RUN, "offline", wandb_dir, "gradlab-tests", {"seed": 0})
    assert sink.status == "ok", sink.error
    assert [sink.log(seq, _train(128 * seq, float(seq))) for seq in (1, 2, 3)] == [True, True, True]
    assert sink.log(2, _train(256, 99.0)) is False  # replay
    assert sink.log(3, _train(384, 99.0)) is False
    assert sink.log(4, {"eval/checkpoint_step": 384, "eval/episode/return/mean": 500.0}) is True
    assert sink.high_water == 4
    sink.finish()
    assert sink.status == "ok", sink.error

    rows = read_offline_history(wandb_dir, RUN)
    assert [r["orchestration/event_seq"] for r in rows] == [1, 2, 3, 4]
    assert [r["_step"] for r in rows] == [1, 2, 3, 4]
    assert [r.get("train/episode/return/shaped/mean") for r in rows] == [1.0, 2.0, 3.0, None]
    assert rows[3]["eval/episode/return/mean"] == 500.0

    # The supervisor restarts: the new sink starts from the outbox's acknowledged mark (4), the same
    # W&B run id, and a full replay of events 1..5 adds only event 5.
    again = WandbSink(RUN, "offline", wandb_dir, "gradlab-tests", {"seed": 0}, high_water=4)
    delivered = [again.log(seq, _train(128 * seq, float(seq))) for seq in (1, 2, 3, 4, 5)]
    again.finish()
    assert delivered == [False, False, False, False, True]
    rows = read_offline_history(wandb_dir, RUN)
    assert [r["orchestration/event_seq"] for r in rows] == [1, 2, 3, 4, 5]
    assert len(list(wandb_dir.glob(f"wandb/offline-run-*-{RUN}*"))) == 2  # W&B makes one folder per init


def test_wandb_disabled_imports_nothing_and_reports_none(tmp_path: Path) -> None:
    sink = WandbSink(RUN, "disabled", tmp_path, "p")
    assert (sink.status, sink.high_water, sink.log(1, {"x/y": 1})) == ("disabled", None, False)
    sink.finish()
    assert not (tmp_path / "wandb").exists()


def test_wandb_bad_mode_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected one of disabled, offline, online, found 'onlin'"):
        WandbSink(RUN, "onlin", tmp_path, "p")


def test_wandb_online_unreachable_is_pending_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B cloud is unreachable here: online with no key and a dead base URL must report pending."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    started = time.monotonic()
    sink = WandbSink(RUN, "online", tmp_path, "p", init_timeout_s=10, finish_timeout_s=5)
    assert sink.log(1, _train(128, 1.0)) is False
    sink.finish()
    assert time.monotonic() - started < 60  # bounded by init_timeout_s (10 s) + finish, far below W&B's 90 s
    assert sink.status == "pending"
    assert sink.error.startswith(f"wandb init (online, run {RUN}): ")
    assert sink.high_water == 0


def test_wandb_online_with_key_but_no_network_is_pending(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a key but no reachable server, init gives up after init_timeout_s, not W&B's 90 s default."""
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{free_port()}")
    started = time.monotonic()
    sink = WandbSink(RUN, "online", tmp_path, "p", init_timeout_s=3, finish_timeout_s=3)
    delivered = sink.log(1, _train(128, 1.0))
    sink.finish()
    assert time.monotonic() - started < 60  # init_timeout_s (3 s) + finish, with a loaded machine's slack; not 90 s
    assert (delivered, sink.status, sink.high_water) == (False, "pending", 0)


def test_wandb_starting_in_the_background_loses_no_event(tmp_path: Path) -> None:
    """The flow starts W&B in the background (``wandb.init`` takes seconds); events the supervisor
    delivers before it is ready stay in its backlog and reach W&B once it is, each exactly once."""
    from gradlab.outbox import Outbox
    from gradlab.runs.supervisor import JournalSink, Supervisor, WandbMetricSink
    from tests.learn.conftest import BANDIT, make_spec

    run_id = "gradlab-20260102T030405-b4c6a0d1"  # W&B refuses a run id still in use in this process

    outbox = Outbox(tmp_path / "outbox.sqlite")
    for seq in range(1, 6):
        outbox.append("metrics", 128 * seq, {"metrics": _train(128 * seq, float(seq))})
    wandb = WandbSink(run_id, "offline", tmp_path / "run", "gradlab-tests", background=True)
    sup = Supervisor(spec=make_spec(BANDIT, {"id": "sb3.ppo", "config": {}}, timesteps=1024, checkpoint_freq=512,
                                     run_id=run_id),
                     attempt_id="attempt-001", outbox=outbox, submit_publish=None, submit_evaluate=None,
                     sinks=[JournalSink(tmp_path / "journal.jsonl"), WandbMetricSink(wandb)])
    assert not wandb.ready  # W&B's service process takes far longer than this to start
    sup.poll_outbox()
    sup.deliver_metrics()
    assert (outbox.high_water("journal"), outbox.high_water("wandb")) == (5, 0)
    assert wandb.wait_ready(60) and wandb.status == "ok", wandb.error
    outbox.append("metrics", 768, {"metrics": _train(768, 6.0)})
    sup.poll_outbox()
    sup.deliver_metrics()
    assert (outbox.high_water("journal"), outbox.high_water("wandb")) == (6, 6)
    wandb.finish()
    rows = read_offline_history(tmp_path / "run", run_id)
    assert [r["orchestration/event_seq"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["train/episode/return/shaped/mean"] for r in rows] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    outbox.close()


def test_wandb_offline_segments_of_several_attempts_are_reported_pending(tmp_path: Path) -> None:
    """Each attempt's wandb.init writes its own offline folder; syncing them as they are keeps only the
    last one, so the receipt may not call W&B complete (issue: run integrity)."""
    run_id = "gradlab-20260102T030405-5e65e575"  # its own W&B run id: no other test's run is in use
    wandb_dir = tmp_path / "run"
    first = WandbSink(run_id, "offline", wandb_dir, "gradlab-tests")
    assert [first.log(seq, _train(128 * seq, 1.0)) for seq in (1, 2)] == [True, True]
    first.finish()
    assert len(first.segments) == 1 and first.complete(2)  # one attempt: one history
    assert not first.complete(3)  # behind the journal
    second = WandbSink(run_id, "offline", wandb_dir, "gradlab-tests", high_water=2)
    assert second.log(3, _train(384, 2.0))
    second.finish()
    assert second.status == "ok", second.error
    assert len(second.segments) == 2
    assert not second.complete(3)  # every point is on disk, but as two segments: pending
    rows = read_offline_history(wandb_dir, run_id)
    assert [r["orchestration/event_seq"] for r in rows] == [1, 2, 3]


def test_runs_sync_rebuilds_one_history_from_the_surviving_lineage(tmp_path: Path) -> None:
    """The journal of a resumed run (attempt 2 resumed below attempt 1's last step) becomes one
    offline W&B run whose rows are the surviving lineage in order (the upload itself needs W&B cloud)."""
    from gradlab.metrics.wandb_sync import rebuild_history

    run_id = "gradlab-20260102T030405-5c0c0a11"  # its own W&B run id: no other test's run is in use
    run_dir = tmp_path / run_id
    first = Journal(run_dir / "journal.jsonl", outbox="a" * 16, attempt="attempt-001")
    first.write_many([(n, _train(2048 * n, float(n))) for n in (1, 2, 3, 4)])
    second = Journal(run_dir / "journal.jsonl", outbox="b" * 16, attempt="attempt-002")
    second.write_many([(n, _train(2048 * (n + 2), 10.0 + n)) for n in (1, 2, 3)])  # resumed from 4096
    with open(run_dir / "journal.jsonl", "ab") as f:  # a live writer half-way through its next line
        f.write(b'{"event_seq": 4, "metr')
    before = (run_dir / "journal.jsonl").read_bytes()
    folder, points = rebuild_history(run_dir, run_id, "gradlab-tests")
    assert points == 5 and folder.is_dir()
    assert (run_dir / "journal.jsonl").read_bytes() == before  # read only: the writer's half line is its own
    rows = read_offline_history(run_dir / "wandb-sync", run_id)
    assert [r["train/global_step"] for r in rows] == [2048, 4096, 6144, 8192, 10240]
    assert [r["train/episode/return/shaped/mean"] for r in rows] == [1.0, 2.0, 11.0, 12.0, 13.0]
    assert [r["_step"] for r in rows] == [1, 2, 3, 4, 5]


def test_lines_without_an_attempt_never_start_a_lineage(tmp_path: Path) -> None:
    """A drained backlog line without an attempt (an older journal, an unstamped first rollout) does
    not make the lines before it look abandoned."""
    path = tmp_path / "journal.jsonl"
    Journal(path, outbox="a" * 16, attempt="attempt-001").write_many([(n, _train(2048 * n, 1.0)) for n in (1, 2, 3)])
    Journal(path, outbox="a" * 16).write_many([(4, _train(2048, 9.0))], attempts={4: None})
    Journal(path, outbox="b" * 16, attempt="attempt-002").write_many([(1, _train(6144, 2.0))])
    lines = Journal(path).read()
    assert [(e.attempt, e.metrics["train/global_step"]) for e in lines] == [
        ("attempt-001", 2048), ("attempt-001", 4096), (None, 2048), ("attempt-002", 6144)]
