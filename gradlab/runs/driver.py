"""One attempt of a training run, end to end: the order of the phases lives here.

``flows/training_run.py`` hands the driver its Prefect tasks as callables; tests hand it plain
functions. The driver loops (``tick_s`` ≤ 1 s) over the :class:`~gradlab.runs.supervisor.Supervisor`
until the learner has exited and everything is drained, then promotes, delivers the last
metrics and seals the terminal receipt. Cancellation (``cancel_requested()``, Ctrl-C, a
termination signal) stops the learner within the grace period and seals ``cancelled``; every
checkpoint already published stays published and no checkpoint is published after the cancel.

Superseded (docs/ARCHITECTURE.md section 9): when any write for this attempt is refused because a
newer attempt took the lease (``LeaseLost``: a renewal, a publication, an evaluation, a stop
request, a metric delivery), the driver stops its learner within the grace period and writes
nothing more: no receipt (its successor sealed it ``superseded``), no release, no metrics. It
returns that receipt, or raises :class:`Superseded` while the successor has not sealed it yet.

A learner that has not exited ``stop_wait_s`` after the supervisor asked it to stop (an accepted
checkpoint) is stopped as a cancel stops it (SIGTERM, then SIGKILL of its group at the end of the
grace period); the receipt's reason and ``learner.stop_reason`` say so, and the run is judged on
what was published and evaluated as if the learner had stopped.

Lease time is measured on ``CLOCK_BOOTTIME``, which counts a suspended machine (a closed laptop
lid) and a stopped process alike: after a pause the first thing a tick does is confirm the lease.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gradlab.contracts.run_spec import RunSpec
from gradlab.errors import GradlabError, IntegrityError, describe_failure
from gradlab.outbox import Outbox
from gradlab.receipts.lease import LeaseLost, release_lease, renew_lease
from gradlab.receipts.models import LearnerExit, TerminalMetrics, TerminalReceipt, TrainingObjective
from gradlab.runs.operations.evaluating import record_unusable
from gradlab.runs.operations.opening import AttemptPlan
from gradlab.runs.paths import RunPaths
from gradlab.runs.process import LearnerProcess
from gradlab.runs.supervisor import CheckpointTrack, Future, JournalSink, Supervisor, WandbMetricSink
from gradlab.runs.timeouts import stop_wait_s
from gradlab.stores import Stores

#: Set by ``gradlab train``'s Ctrl-C handler (:func:`cancel_by_user`): the attempt supervised in
#: this process is cancelled at the next tick (a clean ``cancelled`` receipt) instead of being
#: interrupted wherever it is.
USER_CANCEL = threading.Event()
_user_cancel_reason = ["interrupted by the user (Ctrl-C)"]
#: Set while the attempt supervised in this process seals its receipt: a Ctrl-C then only stops
#: the wait on W&B (its metrics stay pending for it) and the receipt is sealed at once.
SEALING = threading.Event()


def cancel_by_user(reason: str = "interrupted by the user (Ctrl-C)") -> None:
    """Cancel the attempt supervised in this process at its next tick; ``reason`` is the receipt's
    (after the outcome ``cancelled``, so it does not repeat the word)."""
    _user_cancel_reason[0] = reason
    USER_CANCEL.set()

log = logging.getLogger(__name__)

#: ``learner.stop_reason`` of a learner stopped by signals after ignoring its stop request.
KILLED_AFTER_STOP_REQUEST = "killed_after_stop_request"
#: The stop reason a drain records when the earlier attempt's learner ended without ``learner_finished``
#: (killed after one of its checkpoints was accepted): the run is judged on what it published.
ENDED_UNFINISHED = "ended_unfinished"


#: Free bytes below which the run directory's filesystem counts as full (one checkpoint does not fit).
_FULL_BELOW_BYTES = 64 * 1024


class Cancelled(GradlabError):
    """The run was cancelled (Prefect cancellation, Ctrl-C or a termination signal)."""


class Superseded(GradlabError):
    """A newer attempt took the run's lease over; this attempt wrote nothing after learning it."""


def lease_clock() -> float:
    """Seconds on a clock that keeps counting while the machine is suspended (``CLOCK_BOOTTIME``
    on Linux; ``time.monotonic`` elsewhere), so a lease is never believed held across a pause."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return time.monotonic()


@dataclass
class AttemptDriver:
    """Drive one attempt (see the module docstring).

    Args:
        submit_publish(track) / submit_evaluate(track): start work, return futures.
        record_stop(reason): record the stop request in the receipt store.
        promote(track): promote a track's accepted checkpoint (returns the Promotion).
        seal(fields): seal the terminal receipt with these fields (returns the TerminalReceipt).
        cancel_requested(): polled every ``cancel_poll_s``; True cancels the attempt.
        learner: None in drain mode (the learner already finished in an earlier attempt).
        wandb: a ``WandbSink`` or None.
        grace_s: seconds the learner gets to stop when cancelled or failed.
    """

    spec: RunSpec
    paths: RunPaths
    stores: Stores
    plan: AttemptPlan
    learner: LearnerProcess | None
    submit_publish: Callable[[CheckpointTrack], Future]
    submit_evaluate: Callable[[CheckpointTrack], Future]
    record_stop: Callable[[str], None]
    promote: Callable[[CheckpointTrack], Any]
    seal: Callable[[dict[str, Any]], TerminalReceipt]
    evaluate: bool = True
    wandb: Any = None
    cancel_requested: Callable[[], bool] = lambda: False
    #: Seconds between ticks: each polls the outbox (one SQLite read, a few microseconds) and hands
    #: out what is ready, so a new checkpoint waits at most this long for its publication (the lease
    #: and the cancel probe have their own clocks). A submitted task that ends wakes the loop at once
    #: (its future's done callback), so the evaluation after a publication and the stop after an
    #: accepted result do not wait for a tick (docs/ARCHITECTURE.md section 11).
    tick_s: float = 0.02
    #: Seconds between metric deliveries while the learner runs (each is durable writes: the journal
    #: and the outbox's acknowledgements); once it has exited, metrics are delivered when the rest is done.
    deliver_every_s: float = 0.5
    cancel_poll_s: float = 2.0
    grace_s: float = 10.0
    #: Seconds the learner gets to act on a stop request before it is stopped by signals (:func:`stop_wait_s`).
    stop_wait_s: float = field(default_factory=stop_wait_s)
    max_parallel_evals: int = 1
    supervisor: Supervisor = field(init=False)

    def __post_init__(self) -> None:
        self.outbox = Outbox(self.paths.outbox)
        sinks: list[Any] = [JournalSink(self.paths.journal, outbox=self.outbox.identity(),
                                        attempt=self.plan.attempt.attempt_id)]
        if self.wandb is not None and self.wandb.mode != "disabled":
            sinks.append(WandbMetricSink(self.wandb))
        evaluated = self.evaluate and self.spec.goal.evaluation_mode == "evaluated"
        #: Set by a submitted task's future when it ends: the loop's wait between ticks ends at once.
        self._wake = threading.Event()
        self.supervisor = Supervisor(
            spec=self.spec, attempt_id=self.plan.attempt.attempt_id, outbox=self.outbox,
            submit_publish=self._waking(self.submit_publish), submit_evaluate=self._waking(self.submit_evaluate),
            sinks=sinks,
            evaluate=evaluated, stop_on_acceptance=self.spec.goal.stops_on_acceptance,
            max_parallel_evals=self.max_parallel_evals, request_stop=self.record_stop, first_seq=self.plan.first_seq,
            fence=self.plan.fence, opened_seq=self.plan.opened_seq,
            on_unusable=lambda t, why: record_unusable(self.stores, self.spec, t.publication, why,
                                                       fence=self.plan.fence),
            confirm_lease=self._confirm_lease,
        )
        self.outbox.stamp = self.plan.fence  # the supervisor's own events carry its attempt and epoch
        # Checkpoints published by earlier attempts keep their results; unevaluated ones are evaluated now.
        records = {rec.checkpoint_sha256: rec for rec in self.plan.records}
        self.supervisor.adopt_published(list(self.plan.publications), records)
        for track in self.supervisor.tracks.values():
            local = self.paths.checkpoints / _checkpoint_name(track.step, track.sha256)
            track.path = local
            track.unusable = self.plan.unusable.get(track.sha256)  # failed verification at opening
        # Verified checkpoints an earlier attempt wrote but never published (the one this attempt
        # resumes from among them): published now, like the new learner's own.
        for local_ckpt in self.plan.unpublished:
            self.supervisor.adopt_local(local_ckpt.step, local_ckpt.sha256, local_ckpt.path, local_ckpt.purpose)
        self._lease = self.plan.lease
        self._lease_renewed_at = lease_clock()
        self._cancel_checked_at = 0.0
        self._delivered_at = 0.0
        self.cancelled_reason: str | None = None
        self.lease_lost: str | None = None
        #: Set when the learner ignored its stop request and was stopped by signals: what the receipt says.
        self.learner_killed: str | None = None

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> TerminalReceipt:
        """Supervise until drained (or cancelled), then promote and seal. Returns the receipt.

        A ``BaseException`` from inside the loop (KeyboardInterrupt, a termination signal) is
        treated as a cancellation: the learner is stopped, ``cancelled`` is sealed, and the
        exception is raised again for the caller (Prefect) to record.
        """
        sup = self.supervisor
        learner_exit: int | None = None if self.learner is not None else 0
        if self.learner is None:
            sup.freeze()
        try:
            # From here on every checkpoint is seen within a tick: a learner waiting with
            # ``--await-supervisor`` takes its first step now (docs/ARCHITECTURE.md section 8),
            # knowing whether to wait at checkpoint boundaries for verdicts (section 5).
            sup.announce_stop_rule()
            self.outbox.mark_supervised(self.plan.attempt.attempt_id)
            while True:
                self._check_cancel()
                self._renew_lease()
                sup.poll_outbox()
                sup.advance()
                if learner_exit is None and time.monotonic() - self._delivered_at >= self.deliver_every_s:
                    sup.deliver_metrics()
                    self._delivered_at = time.monotonic()
                if learner_exit is None:
                    self._enforce_stop()
                if learner_exit is None and (code := self.learner.exit_code()) is not None:  # type: ignore[union-attr]
                    learner_exit = code
                    sup.freeze()
                    self.learner.kill()  # type: ignore[union-attr]  # stray workers of the group
                    if not self._learner_finished_cleanly(code):
                        sup.abandon_evaluations("the learner did not finish cleanly")
                    continue
                if learner_exit is not None:
                    sup.advance()
                    if sup.work_done():  # metrics last: each delivery is durable writes (fsync)
                        sup.poll_outbox()  # the supervisor's own metrics of this tick
                        sup.deliver_metrics()
                        if sup.drained():
                            break
                self._wake.wait(self.tick_s)
                self._wake.clear()  # before the next tick: a task ending during it wakes the wait after it
        except BaseException as e:
            if isinstance(e, LeaseLost) or self.lease_lost:
                return self._superseded(self.lease_lost or str(e))
            if self.cancelled_reason or not isinstance(e, Exception):
                # A cancel, Ctrl-C, or a termination signal (Prefect's are BaseExceptions).
                outcome, reason = "cancelled", self.cancelled_reason or f"interrupted: {type(e).__name__}"
            else:  # the attempt itself failed (a full disk, a store error the task retries gave up on...)
                outcome, reason = "failed", f"the attempt failed: {self._first_cause(e)}"
                log.error("run %s: %s", self.spec.run_id, reason)
                log.debug("run %s: the attempt's failure", self.spec.run_id, exc_info=e)
            receipt = self._end_early(outcome, reason)
            if isinstance(e, Exception):
                return receipt  # sealed with its first cause: the caller reads the receipt
            raise
        try:
            return self._finish(learner_exit)
        except LeaseLost as e:  # the promotion (or a last delivery) was refused: superseded
            return self._superseded(str(e))

    def _waking(self, submit: Callable[[CheckpointTrack], Future]) -> Callable[[CheckpointTrack], Future]:
        """``submit``, with the future it returns waking the loop when it is done (a future without
        ``add_done_callback`` is seen at the next tick instead)."""
        def submit_and_wake(track: CheckpointTrack) -> Future:
            future = submit(track)
            add_done_callback = getattr(future, "add_done_callback", None)
            if callable(add_done_callback):
                add_done_callback(lambda _: self._wake.set())
            return future

        return submit_and_wake

    def _enforce_stop(self) -> None:
        """Stop a learner by signals that has not exited ``stop_wait_s`` after its stop request."""
        sup = self.supervisor
        asked = sup.stop_asked_at
        if asked is None or self.learner is None or self.learner_killed is not None:
            return
        waited = sup.clock() - asked
        if waited < self.stop_wait_s or self.learner.exit_code() is not None:
            return
        log.warning("run %s: the learner did not act on its stop request (%s) within %.0f s: stopping it by signals",
                    self.spec.run_id, sup.stop_reason, waited)
        code = self.learner.stop(sup.stop_reason, grace_s=self.grace_s, request=False)
        how = "SIGTERM" if code == -15 else "SIGKILL of its process group" if code == -9 else f"exit code {code}"
        self.learner_killed = (f"the learner ignored its stop request ({sup.stop_reason}) for {waited:.0f} s and "
                               f"was stopped by {how} within the {self.grace_s:.0f} s grace period")

    def _check_cancel(self) -> None:
        if USER_CANCEL.is_set():
            self.cancelled_reason = _user_cancel_reason[0]
            raise Cancelled(self.cancelled_reason)
        now = time.monotonic()
        if now - self._cancel_checked_at < self.cancel_poll_s:
            return
        self._cancel_checked_at = now
        if self.cancel_requested():
            self.cancelled_reason = "the flow run was cancelled (Prefect)"
            raise Cancelled(self.cancelled_reason)

    def _renew_lease(self, *, strict: bool = False) -> None:
        """Renew the lease every ttl/3 (of :func:`lease_clock`). ``strict``: the caller is about to
        write, so a lease not confirmed within its ttl (a pause, a store outage) must be confirmed
        now or the write is refused.

        Raises:
            LeaseLost: the lease was taken over (or released by a reconciler), or, ``strict``, it
                could not be confirmed within its ttl.
        """
        ttl = self._lease.lease.ttl_s
        since = lease_clock() - self._lease_renewed_at
        if since < ttl / 3:
            return
        try:
            self._lease = renew_lease(self.stores.control, self._lease)
            self._lease_renewed_at = lease_clock()
        except LeaseLost as e:
            self.lease_lost = f"superseded: lease lost ({e})"
            raise
        except GradlabError as e:  # store briefly down: try again next tick; the TTL leaves room
            log.warning("run %s: lease renewal failed: %s", self.spec.run_id, e)
            if strict and since >= ttl:
                raise LeaseLost(f"run {self.spec.run_id}: lease of {self.plan.attempt.attempt_id} not confirmed for "
                                f"{since:.0f} s (ttl {ttl:.0f} s): {e}") from e

    def _confirm_lease(self) -> None:
        """Before a write that carries no store-side epoch check (metric deliveries)."""
        self._renew_lease(strict=True)

    def _superseded(self, why: str) -> TerminalReceipt:
        """A newer attempt holds the run: stop the learner within the grace period, write nothing
        more, and return the receipt the successor sealed for this attempt (see the module docstring).

        Raises:
            Superseded: the successor has not sealed this attempt within the grace period.
        """
        from gradlab.receipts.terminal import read_terminal

        sup = self.supervisor
        sup.frozen = True
        sup.abandon_evaluations(why)
        attempt_id = self.plan.attempt.attempt_id
        log.warning("run %s: %s was superseded (%s): stopping its learner, writing nothing more", self.spec.run_id,
                    attempt_id, why)
        if self.learner is not None:
            try:
                ours = self.outbox.fence() in (None, self.plan.fence)
            except OSError:
                ours = False
            self.learner.stop("superseded", grace_s=self.grace_s, request=ours)
        if self.wandb is not None:
            try:
                self.wandb.finish(timeout_s=0.0)
            except Exception as e:  # noqa: BLE001 - nothing more is delivered anyway
                log.debug("run %s: closing W&B after supersession: %s", self.spec.run_id, e)
        deadline = lease_clock() + self.grace_s
        while True:
            try:
                receipt = read_terminal(self.stores, self.spec.run_id, attempt_id)
            except GradlabError:
                receipt = None
            if receipt is not None or lease_clock() >= deadline:
                break
            time.sleep(0.2)
        if receipt is None:
            raise Superseded(f"run {self.spec.run_id}: {attempt_id} epoch {self.plan.fence[1]} was superseded ({why}); "
                             "its successor seals its receipt")
        return receipt

    def _learner_finished_cleanly(self, code: int) -> bool:
        return code == 0 and self.supervisor.learner_finished is not None

    # -- the end ----------------------------------------------------------------------------------
    def _finish(self, learner_exit: int | None) -> TerminalReceipt:
        sup = self.supervisor
        finished = sup.learner_finished or self._earlier_finish()
        killed = self.learner_killed
        if killed is not None and finished is None:  # stopped as asked, by signals: judged on what it published
            finished = {"stop_reason": KILLED_AFTER_STOP_REQUEST, "final_step": sup.last_step or None}
        drained_unfinished = finished is None and self.learner is None
        if drained_unfinished:
            # A drain (no learner of its own) after a learner that never finished: a checkpoint of its was
            # accepted (docs/ARCHITECTURE.md section 8), so the run is judged on what it published.
            finished = {"stop_reason": ENDED_UNFINISHED, "final_step": sup.last_step or None}
        stop_reason = finished.get("stop_reason") if finished else None
        final_step = finished.get("final_step") if finished else (sup.last_step or None)
        failures = sup.publish_failures()
        evaluated = sup.evaluate
        if finished is None or (learner_exit not in (0, None) and killed is None):
            outcome, reason = "failed", (f"the learner exited with code {learner_exit} before finishing"
                                         f"{self._disk_full()}{self._learner_said(learner_exit)}")
        elif failures:
            steps = ", ".join(str(t.step) for t in failures)
            outcome, reason = "failed", f"checkpoints at steps {steps} could not be published: {failures[0].publish_error}"
        elif not evaluated:
            why = "the goal is training-only" if self.spec.goal.evaluation_mode == "training_only" else "evaluation was turned off"
            outcome, reason = "succeeded", f"trained to step {final_step} ({stop_reason}); {why}: nothing to promote"
        elif (candidate := sup.promotion_candidate()) is not None:
            try:
                promotion = self.promote(candidate)
            except IntegrityError as e:  # the store's copy changed after evaluation: never promoted
                outcome, reason = "failed", f"checkpoint at step {candidate.step} was accepted but not promoted: {e}"
            else:
                outcome = "succeeded"
                reason = (f"checkpoint at step {promotion.checkpoint_step} accepted "
                          f"(return mean {promotion.return_mean}) and promoted")
        elif errors := [t for t in sup.tracks.values() if t.eval_error is not None]:
            steps = ", ".join(str(t.step) for t in errors)
            outcome, reason = "failed", f"evaluations of steps {steps} could not run: {errors[0].eval_error}"
        elif stop_reason and str(stop_reason).startswith("early_stop"):
            outcome, reason = "stopped", f"stopped by {stop_reason} at step {final_step}; no checkpoint was accepted"
        else:
            outcome, reason = "failed", f"no checkpoint met the acceptance rule by step {final_step} ({stop_reason})"
        if killed is not None:
            reason = f"{reason}; {killed}"
        if drained_unfinished:
            reason = f"{reason}; drained after the learner of an earlier attempt ended without finishing"
        return self._seal(outcome, reason, final_step, drained=sup.drained(),
                          learner=LearnerExit(exit_code=learner_exit, stop_reason=stop_reason))

    def _learner_said(self, code: int | None = None) -> str:
        """The learner log's last line (its error for a bad spec or checkpoint), for the receipt's reason.

        For a learner killed by a signal (``code`` < 0, as ``subprocess`` reports it), the signal
        instead: a killed process writes nothing, so its last line would explain nothing."""
        if code is not None and code < 0:
            import signal

            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f" (killed by {name}, not by an error of its own; its log: {self.paths.learner_log})"
        try:
            lines = [line for line in self.paths.learner_log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return ""
        return f" ({lines[-1].strip()[:300]}; see {self.paths.learner_log})" if lines else ""

    def _first_cause(self, error: BaseException) -> str:
        """:func:`describe_failure`, naming the run directory when the cause is a full disk there that
        the error itself does not name (a write to an open file carries no path)."""
        import errno

        described = describe_failure(error)
        cause, seen = error, {id(error)}
        while (nxt := cause.__cause__ or cause.__context__) is not None and id(nxt) not in seen:
            seen.add(id(nxt))
            cause = nxt
        if isinstance(cause, OSError) and cause.errno == errno.ENOSPC and cause.filename is None:
            full = self._disk_full()
            if full:
                return full.removeprefix(": ")
        return described

    def _disk_full(self) -> str:
        """``": no space left on device: <run dir>"`` when the run directory's filesystem is full (a
        learner that crashed there cannot even log why), else ``""``."""
        import os

        try:
            st = os.statvfs(self.paths.root)
        except OSError:
            return ""
        return f": no space left on device: {self.paths.root}" if st.f_bavail * st.f_frsize < _FULL_BELOW_BYTES else ""

    def _earlier_finish(self) -> dict[str, Any] | None:
        event = self.outbox.last("learner_finished")
        return dict(event.payload) if event else None

    def _end_early(self, outcome: str, reason: str) -> TerminalReceipt:
        """Cancellation, a lost lease or a failure: stop the learner, keep what is published, seal."""
        sup = self.supervisor
        sup.frozen = True  # nothing written after the cancel is published
        code = self.learner.stop(outcome, grace_s=self.grace_s) if self.learner is not None else None
        sup.abandon_evaluations(reason)
        try:
            _wait_futures(sup, timeout_s=self.grace_s)
        except Exception as e:  # noqa: BLE001 - a failing outbox (full disk): seal with the first cause anyway
            log.warning("run %s: collecting work after %s failed: %s", self.spec.run_id, outcome, describe_failure(e))
        finished = None
        try:  # what the learner wrote while stopping; a full disk or a broken outbox must not hide the first cause
            sup.poll_outbox()
            sup.deliver_metrics()
            finished = sup.learner_finished or self._earlier_finish()
        except Exception as e:  # noqa: BLE001 - the journal catches up on the next drain
            log.warning("run %s: metric delivery after %s failed: %s", self.spec.run_id, outcome, describe_failure(e))
            finished = sup.learner_finished
        return self._seal(outcome, reason, (finished or {}).get("final_step", sup.last_step or None), drained=False,
                          learner=LearnerExit(exit_code=code, stop_reason=(finished or {}).get("stop_reason")),
                          wandb_wait_s=self.grace_s)

    def _seal(self, outcome: str, reason: str, final_step: int | None, *, drained: bool, learner: LearnerExit,
              wandb_wait_s: float | None = None) -> TerminalReceipt:
        """Seal the receipt. ``wandb_wait_s`` bounds the wait for W&B (a cancelled run should not wait
        on an unreachable W&B: what it did not take is reported pending)."""
        wandb_hw = None
        pending: list[str] = []
        SEALING.set()
        if self.wandb is not None:
            self.wandb.interrupt_when(USER_CANCEL.is_set)
            wait_s = self.wandb.init_timeout_s if wandb_wait_s is None else wandb_wait_s
            if self.wandb.mode != "disabled" and not self.wandb.ready:
                log.warning("run %s: W&B has not started yet; the seal waits up to %.0f s more for it (Ctrl-C stops "
                            "the wait: its metrics stay pending for W&B)", self.spec.run_id,
                            min(wait_s, self.wandb.wait_left_s))
            if self.wandb.mode != "disabled" and self.wandb.wait_ready(wait_s):
                try:  # events kept back while W&B was starting
                    self.supervisor.deliver_metrics()
                except Exception as e:  # noqa: BLE001 - reported below as pending
                    log.warning("run %s: last W&B delivery failed: %s", self.spec.run_id, e)
            self.wandb.finish(timeout_s=wandb_wait_s)
            wandb_hw = self.wandb.high_water
        try:
            local = self.outbox.high_water("journal")
        except OSError as e:  # the outbox cannot be read (a full disk): the journal's mark is unknown
            log.warning("run %s: cannot read the journal's high-water mark: %s", self.spec.run_id, describe_failure(e))
            local = 0
        if wandb_hw is not None and not self.wandb.complete(local):
            pending.append("wandb")  # behind, failed, or split over several offline segments
        metrics = TerminalMetrics(local_high_water=local, sinks={"journal": local, "wandb": wandb_hw}, pending=pending,
                                  objective=self._training_objective())
        try:
            receipt = self.seal({"outcome": outcome, "reason": reason, "final_step": final_step, "metrics": metrics,
                                 "drained": drained, "learner": learner})
        except LeaseLost as e:  # superseded while sealing: the successor seals this attempt
            return self._superseded(str(e))
        except BaseException:
            if self._receipt_stored():  # stored, then something after it failed: the attempt is over
                self._release_lease()
            raise
        self._release_lease()
        return receipt

    def _training_objective(self) -> TrainingObjective | None:
        """The goal's objective as this attempt's training last reported it, when it is a ``train/``
        metric (how a training-only goal's runs are ranked); None otherwise or when unreadable."""
        metric = self.spec.goal.objective.rank
        if not metric.startswith("train/"):
            return None
        try:
            last = self.outbox.last_metric(metric, attempt=self.plan.attempt.attempt_id)
        except (OSError, sqlite3.Error) as e:  # a broken outbox: the seed is left unscored, the seal goes on
            log.warning("run %s: cannot read %s from the outbox: %s", self.spec.run_id, metric, describe_failure(e))
            return None
        return None if last is None else TrainingObjective(metric=metric, value=last[1], step=last[0])

    def _receipt_stored(self) -> bool:
        from gradlab.receipts.terminal import read_terminal

        try:
            return read_terminal(self.stores, self.spec.run_id, self.plan.attempt.attempt_id) is not None
        except Exception:  # noqa: BLE001 - unknown: keep the lease (it expires by itself)
            return False

    def _release_lease(self) -> None:
        try:
            release_lease(self.stores.control, self._lease)
        except GradlabError as e:  # it expires by itself
            log.warning("run %s: lease release failed: %s", self.spec.run_id, e)


def _wait_futures(sup: Supervisor, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sup.advance_collect_only()
        if all(t.publish_future is None and t.eval_future is None for t in sup.tracks.values()):
            return
        time.sleep(0.1)


def _checkpoint_name(step: int, sha256: str) -> str:
    from gradlab.stores import keys

    return keys.checkpoint_name(step, sha256)
