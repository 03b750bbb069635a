"""The at_checkpoint stop rule's wait, against a real outbox: a late verdict is waited for, a lost
supervisor ends the wait, and with no announced rule (``--no-eval``) nothing waits."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gradlab.learn.stop_rule import await_verdict, defers_acceptance
from gradlab.learn.watch import ProcessWatch
from gradlab.outbox import AT_CHECKPOINT, Outbox


def test_a_late_verdict_is_waited_for_and_an_accepted_one_stops(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite")
    outbox.set_stop_rule(AT_CHECKPOINT)
    polls = []

    def signalled() -> None:  # called once per poll: the verdict arrives on the third
        polls.append(1)
        if len(polls) == 3:
            outbox.set_verdict(2048, "accepted")

    wait = await_verdict(outbox, 2048, signalled=signalled, supervisor=None, poll_s=0.01)
    assert (wait.verdict, wait.stop_reason, wait.observed) == ("accepted", "stop_requested", "accepted:2048")
    assert len(polls) == 3 and wait.wait_s > 0
    outbox.set_verdict(4096, "rejected")
    assert await_verdict(outbox, 4096, signalled=lambda: None, supervisor=None).stop_reason is None
    assert defers_acceptance(outbox, "accepted:2048") and not defers_acceptance(outbox, "user cancel")
    # A retry resumed past its accepted checkpoint: the next one is deferred, and the learner stops there.
    outbox.set_verdict(6144, "deferred")
    deferred = await_verdict(outbox, 6144, signalled=lambda: None, supervisor=None)
    assert (deferred.stop_reason, deferred.observed) == ("stop_requested", "deferred:6144")
    outbox.set_verdict(8192, "failed")
    assert await_verdict(outbox, 8192, signalled=lambda: None, supervisor=None).stop_reason is None


def test_a_lost_supervisor_ends_the_wait(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite")
    outbox.set_stop_rule(AT_CHECKPOINT)
    proc = subprocess.Popen(["sleep", "60"])
    watch = ProcessWatch(proc.pid)

    def signalled() -> None:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    wait = await_verdict(outbox, 2048, signalled=signalled, supervisor=watch, poll_s=0.05)
    assert (wait.verdict, wait.stop_reason) == (None, "supervisor_lost")


def test_no_rule_means_no_wait(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite")
    wait = await_verdict(outbox, 2048, signalled=lambda: None, supervisor=None)
    assert (wait.verdict, wait.stop_reason, wait.wait_s < 0.5) == (None, None, True)
    assert not defers_acceptance(outbox, "accepted:2048")
