"""A learner started before its supervisor watches (``gradlab train`` starts it while Prefect
starts) takes no step until the driver's loop says so: every event it writes carries the attempt's
fence, and a stop while it waits ends it with no checkpoint."""

from __future__ import annotations

import threading
from pathlib import Path

from gradlab.learn.learner import OUTBOX_FILE, run_learner
from gradlab.outbox import Outbox
from tests.learn.conftest import BANDIT, make_spec
from tests.runs.conftest import wait_for

PPO = {"id": "gradlab.ppo", "config": {"n_steps": 16, "batch_size": 64, "n_epochs": 1}}


def _start(tmp_path: Path) -> tuple[threading.Thread, dict]:
    spec = make_spec(BANDIT, PPO, timesteps=512, checkpoint_freq=256)
    out: dict = {}

    def learn() -> None:
        out["result"] = run_learner(spec, tmp_path, watch_parent=False, await_supervisor=True)

    thread = threading.Thread(target=learn, daemon=True)
    thread.start()
    return thread, out


def _waiting(tmp_path: Path) -> Outbox:
    outbox = wait_for(lambda: (tmp_path / OUTBOX_FILE).exists() and Outbox(tmp_path / OUTBOX_FILE), 120,
                      "the learner's outbox")
    log_ready = wait_for(lambda: outbox.fence() is None and outbox.identity(), 60, "the outbox schema")
    assert log_ready
    return outbox


def test_the_first_step_waits_for_the_supervisor_and_every_event_is_fenced(tmp_path: Path) -> None:
    thread, out = _start(tmp_path)
    outbox = _waiting(tmp_path)
    outbox.set_fence("attempt-001", 1)  # the attempt is opened: still no step until its loop watches
    thread.join(timeout=1.5)
    assert thread.is_alive() and outbox.count() == 0, [e.kind for e in outbox.read(0)]
    outbox.mark_supervised("attempt-001")
    thread.join(timeout=300)
    assert not thread.is_alive()
    assert out["result"].final_step == 512 and out["result"].stop_reason == "budget"
    events = outbox.read(0, 10_000)
    assert events[0].kind == "learner_started"
    assert {e.fence for e in events} == {("attempt-001", 1)}
    assert sum(e.kind == "checkpoint_ready" for e in events) == 2


def test_a_stop_while_waiting_ends_the_learner_at_its_start_with_no_checkpoint(tmp_path: Path) -> None:
    thread, out = _start(tmp_path)
    outbox = _waiting(tmp_path)
    outbox.request_stop("the supervising flow could not start")
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert (out["result"].final_step, out["result"].stop_reason, out["result"].checkpoints) == (0, "stop_requested", ())
    assert [e.kind for e in outbox.read(0)] == ["learner_finished"]
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())
