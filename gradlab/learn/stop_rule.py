"""The stop on acceptance at checkpoint boundaries: where a learner waits for a verdict, and why it ends.

Rule (``at_checkpoint``, docs/ARCHITECTURE.md section 5), announced by the supervisor in the
outbox (:meth:`gradlab.outbox.Outbox.set_stop_rule`) when it evaluates checkpoints and stops on
acceptance:

* a stop request for an acceptance (reason ``accepted:<step>``) takes effect only at a checkpoint
  boundary, never between two;
* at each checkpoint boundary after the first checkpoint of the lineage (the one resumed from
  counts), before writing the new checkpoint, the learner waits for the verdict on the checkpoint
  before it (:meth:`gradlab.outbox.Outbox.set_verdict`); ``accepted`` stops it there (a ``final``
  checkpoint at that step), and so does ``deferred`` (a lower step was accepted already: a retry
  resumed past the accepted checkpoint); ``rejected`` or ``failed`` lets it go on.

So with checkpoint k accepted a run stops at checkpoint k+1's step whatever the speed of
evaluation: the same seed stops at the same step on a cold or a loaded machine as on a warm one,
and when evaluation keeps up with training the verdict is there already and the wait costs nothing.
The wait also ends on every stop the learner obeys anyway: another stop request (cancel), SIGTERM,
the supervisor gone (``supervisor_lost``), a newer attempt's fence (``fenced``), and when the
supervisor withdraws the rule. Without an announced rule (``--no-eval``, a goal that does not stop
on acceptance, a learner run by hand) the learner never waits and obeys a stop request at once.

Both learners (``sb3.*`` through the callback path and ``gradlab.ppo``) reach this module through
the one loop of :func:`gradlab.learn.learner.run_learner`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gradlab.learn.watch import ProcessWatch
from gradlab.outbox import AT_CHECKPOINT, Outbox

logger = logging.getLogger(__name__)

SUPERVISOR_LOST = "supervisor_lost"
FENCED = "fenced"
"""Stop reason of a learner whose attempt was superseded by a newer one (its lease epoch is no longer current)."""
ACCEPTED_PREFIX = "accepted:"
"""How a stop request for an acceptance is worded by the supervisor (``accepted:<step>``)."""
#: Seconds between readings of the outbox while a learner waits for a verdict (a lost supervisor
#: ends the wait at once through its pidfd). A reading costs microseconds; the interval is on a
#: run's critical path (the stop after an accepted checkpoint), so it is short.
VERDICT_POLL_S = 0.01
#: The metric that records one wait (registered in gradlab.metrics.registry, METRICS.md).
EVAL_WAIT_METRIC = "orchestration/learner/eval_wait_seconds"


@dataclass(frozen=True)
class VerdictWait:
    """How one wait at a checkpoint boundary ended.

    Attributes:
        checkpoint_step: the step of the checkpoint whose verdict was awaited.
        verdict: its verdict, or None when the wait ended otherwise.
        stop_reason: the learner's stop reason (``stop_requested``, ``sigterm``, ``supervisor_lost``,
            ``fenced``), or None to go on training.
        observed: the ``stop_observed`` reason when stopping (``accepted:<step>`` on acceptance).
        wait_s: wall seconds spent waiting (0 when the verdict was already there).
    """

    checkpoint_step: int
    verdict: str | None
    stop_reason: str | None
    observed: str | None
    wait_s: float

    def as_json(self) -> dict[str, object]:
        return {"checkpoint_step": self.checkpoint_step, "verdict": self.verdict, "wait_s": self.wait_s}


def defers_acceptance(outbox: Outbox, requested: str) -> bool:
    """True when stop request ``requested`` waits for the next checkpoint boundary (an acceptance
    under the announced ``at_checkpoint`` rule), False when the learner obeys it at once."""
    return requested.startswith(ACCEPTED_PREFIX) and outbox.stop_rule() == AT_CHECKPOINT


def await_verdict(outbox: Outbox, checkpoint_step: int, *, signalled: Callable[[], str | None],
                  supervisor: ProcessWatch | None, poll_s: float = VERDICT_POLL_S) -> VerdictWait:
    """Wait at a checkpoint boundary for the verdict on the checkpoint at ``checkpoint_step``.

    Args:
        outbox: the learner's outbox (stamped with its fence).
        checkpoint_step: the previous checkpoint of this lineage.
        signalled: returns the pending signal's stop reason (``sigterm``) or None.
        supervisor: the supervising process, or None when not watched.
        poll_s: seconds between readings of the outbox.

    Returns:
        How the wait ended (see :class:`VerdictWait`); an absent rule ends it at once with no verdict.
    """
    started = time.monotonic()
    logged = False
    while True:
        waited = time.monotonic() - started
        if outbox.stop_rule() != AT_CHECKPOINT:
            return VerdictWait(checkpoint_step, None, None, None, waited)
        if (verdict := outbox.verdict(checkpoint_step)) is not None:
            if verdict == "accepted":
                return VerdictWait(checkpoint_step, verdict, "stop_requested", f"{ACCEPTED_PREFIX}{checkpoint_step}",
                                   waited)
            if verdict == "deferred":  # a lower step was accepted already (a retry resumed past it): stop here
                return VerdictWait(checkpoint_step, verdict, "stop_requested", f"deferred:{checkpoint_step}", waited)
            return VerdictWait(checkpoint_step, verdict, None, None, waited)
        if (requested := outbox.stop_requested()) is not None:
            # An acceptance before its verdict reached us can only be this checkpoint's (every
            # earlier one had its verdict at an earlier boundary); any other request stops as asked.
            return VerdictWait(checkpoint_step, None, "stop_requested", requested, waited)
        if (superseded := outbox.superseded()) is not None:
            logger.warning("fenced out while waiting for a verdict: %s", superseded)
            return VerdictWait(checkpoint_step, None, FENCED, f"{FENCED}: {superseded}", waited)
        if (sig := signalled()) is not None:
            return VerdictWait(checkpoint_step, None, sig, None, waited)
        if supervisor is not None and not supervisor.alive():
            logger.warning("supervisor (pid %d) is gone while waiting for a verdict: stopping", supervisor.pid)
            return VerdictWait(checkpoint_step, None, SUPERVISOR_LOST, SUPERVISOR_LOST, waited)
        if not logged:
            logger.info("at a checkpoint boundary: waiting for the verdict on step %d", checkpoint_step)
            logged = True
        if supervisor is not None:
            supervisor.wait(poll_s)
        else:
            time.sleep(poll_s)
