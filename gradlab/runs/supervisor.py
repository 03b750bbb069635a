"""The supervisor's state machine: what to publish, evaluate, stop, promote and deliver next.

The training-run flow drives one :class:`Supervisor` in a loop of at most one second per tick.
Work is handed out through two submit callbacks (Prefect tasks in the flow, a thread pool in
tests) that return futures; the supervisor only decides and records:

* every ``checkpoint_ready`` event is published once (in step order);
* every published checkpoint is evaluated once, at most ``max_parallel_evals`` at a time, lowest
  step first, unless a lower-step checkpoint was already accepted (then it is ``deferred``: it can
  never be promoted, since promotion takes the lowest accepted step);
* the first accepted result asks the learner to stop (when the goal stops on acceptance);
* when it evaluates and stops on acceptance it announces the ``at_checkpoint`` stop rule
  (:meth:`Supervisor.announce_stop_rule`) and writes each checkpoint's verdict to the outbox once
  it is final (accepted, rejected, failed, deferred, or a publication that failed), so the learner,
  which waits at checkpoint k+1 for the verdict on k, stops at the same step however fast
  evaluation runs (:mod:`gradlab.learn.stop_rule`);
* metrics events are delivered to every sink and acknowledged in the outbox per sink, only while
  this attempt still holds the run (its outbox fence is its own and ``confirm_lease`` passes);
* a fenced write refused for a superseded epoch (``LeaseLost``, from any task) is raised, never
  recorded as a checkpoint's failure: the attempt is over (docs/ARCHITECTURE.md section 9);
* once the learner has exited, the checkpoint set is frozen; the run is drained when every member
  is published (or failed) and evaluated (or deferred).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from gradlab.contracts.run_spec import RunSpec
from gradlab.errors import IntegrityError, NotFound
from gradlab.outbox import AT_CHECKPOINT, Event, Outbox, OutboxBusy
from gradlab.receipts.lease import LeaseLost
from gradlab.receipts.models import CheckpointPublication, EvaluationRecord

log = logging.getLogger(__name__)

#: Seconds after a write found the outbox busy during which no other write is tried: each would
#: wait out the outbox's busy timeout, while the driver's ticks (lease renewal, stop enforcement)
#: run freely in between.
BUSY_BACKOFF_S = 10.0

#: Outbox event kind the supervisor appends for its own metrics (evaluations, orchestration).
SUPERVISOR_METRICS = "supervisor_metrics"
METRIC_KINDS = ("metrics", SUPERVISOR_METRICS)


class Future(Protocol):
    def done(self) -> bool: ...

    def result(self) -> Any: ...


@dataclass
class CheckpointTrack:
    """One checkpoint's way through publication and evaluation."""

    step: int
    sha256: str
    path: Path
    purpose: str
    ready_at: float
    publish_future: Future | None = None
    publication: CheckpointPublication | None = None
    publish_error: str | None = None
    eval_future: Future | None = None
    eval_submitted_at: float | None = None
    evaluation: EvaluationRecord | None = None
    eval_error: str | None = None
    deferred: bool = False
    #: Why the published checkpoint is not usable (it fails verification against its publication
    #: receipt): never evaluated, never promoted, whatever an earlier evaluation said.
    unusable: str | None = None

    @property
    def evaluation_done(self) -> bool:
        return self.evaluation is not None or self.eval_error is not None or self.deferred or self.unusable is not None

    @property
    def accepted(self) -> bool:
        return self.evaluation is not None and self.evaluation.status == "accepted" and self.unusable is None


class MetricSink(Protocol):
    name: str

    def deliver(self, events: list[tuple[int, dict[str, Any]]]) -> int:
        """Deliver (event_seq, metrics) pairs in order; return the highest seq delivered (0 if none)."""
        ...


class JournalSink:
    """The local metrics journal (always on): every event, durably, idempotent by (outbox, event_seq).

    Each line records the attempt that wrote its event (``attempts``, filled by the supervisor;
    ``attempt`` otherwise) and the outbox's identity, so a new outbox never collides with an old one.
    """

    name = "journal"

    def __init__(self, path: Path, *, outbox: str | None = None, attempt: str | None = None):
        from gradlab.metrics.journal import Journal

        self.journal = Journal(path, outbox=outbox, attempt=attempt)
        #: event_seq → the attempt stamped on the event (events of earlier attempts drained now).
        self.attempts: dict[int, str | None] = {}

    def deliver(self, events: list[tuple[int, dict[str, Any]]]) -> int:
        self.journal.write_many(events, self.attempts)
        for seq, _ in events:
            self.attempts.pop(seq, None)
        return max(seq for seq, _ in events)


class WandbMetricSink:
    """W&B: ``event_seq`` is W&B's step, so a replayed event adds no point."""

    name = "wandb"

    def __init__(self, sink: Any):
        self.sink = sink

    @property
    def accepting(self) -> bool:
        """False once W&B has failed for this attempt (status ``pending``): keeping a backlog is pointless."""
        return self.sink.status != "pending"

    def deliver(self, events: list[tuple[int, dict[str, Any]]]) -> int:
        delivered = 0
        for seq, metrics in events:
            mark = self.sink.high_water or 0
            if seq <= mark:  # W&B has it already (delivered before a crash, not yet acknowledged)
                delivered = seq
                continue
            if not self.sink.log(seq, metrics):
                break  # disabled or pending: the outbox keeps the rest for a later drain
            delivered = seq
        return delivered


@dataclass
class Supervisor:
    """Decisions and bookkeeping of one attempt (see the module docstring).

    Args:
        spec: the run spec. attempt_id: this attempt.
        outbox: the run's outbox (read for events; written for stop requests and own metrics).
        submit_publish: starts publishing a checkpoint folder; returns a future of CheckpointPublication.
        submit_evaluate: starts evaluating a published checkpoint; returns a future of EvaluationRecord.
        sinks: metric sinks; the journal first.
        evaluate: False for ``--no-eval`` and training-only goals.
        stop_on_acceptance: ask the learner to stop at the first accepted checkpoint.
        max_parallel_evals: evaluations in flight at once.
        request_stop: called once with the reason when the supervisor decides to stop the learner.
        on_unusable: records a checkpoint with no verified copy to evaluate as a failed evaluation.
        confirm_lease: called before each metric delivery; raises ``LeaseLost`` when this attempt
            no longer holds the run (the driver's lease check).
    """

    spec: RunSpec
    attempt_id: str
    outbox: Outbox
    submit_publish: Callable[[CheckpointTrack], Future]
    submit_evaluate: Callable[[CheckpointTrack], Future]
    sinks: list[MetricSink]
    evaluate: bool = True
    stop_on_acceptance: bool = True
    max_parallel_evals: int = 1
    request_stop: Callable[[str], None] | None = None
    #: Records a published checkpoint found not usable (fails verification) as a failed evaluation;
    #: returns the record (``gradlab.runs.operations.evaluating.record_unusable``).
    on_unusable: Callable[[CheckpointTrack, str], EvaluationRecord] | None = None
    confirm_lease: Callable[[], None] | None = None
    clock: Callable[[], float] = time.monotonic
    tracks: dict[int, CheckpointTrack] = field(default_factory=dict)
    after_seq: int = 0
    first_seq: int = 0
    #: (attempt id, lease epoch) of this attempt; events from ``opened_seq`` on stamped otherwise
    #: are a superseded learner's and refused (fencing, docs/ARCHITECTURE.md section 5).
    fence: tuple[str, int] | None = None
    opened_seq: int = 0
    refused_events: int = 0
    learner_finished: dict[str, Any] | None = None
    learner_started: dict[str, Any] | None = None
    stop_reason: str | None = None
    frozen: bool = False
    last_step: int = 0
    _pending_metrics: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    #: Per sink, events it has not taken yet (a W&B run still initialising); delivered on the next call.
    _backlog: dict[str, list[tuple[int, dict[str, Any]]]] = field(default_factory=dict)
    _first_accept_at: float | None = None
    #: Steps whose verdict is in the outbox (written once each).
    _verdicts_written: set[int] = field(default_factory=set)
    _stop_written_at: float = 0.0
    #: The stop request is decided but not yet in the outbox (it was busy): written on the next tick.
    _stop_unwritten: bool = False
    #: Supervisor metrics not yet in the outbox (it was busy), in order: appended on the next tick.
    _unemitted: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    _busy_logged_at: float | None = None
    #: Until then (on :attr:`clock`) no write waits out the busy timeout again: the outbox was just
    #: found busy, and the driver's tick (lease renewal, stop enforcement) must go on.
    _busy_until: float = float("-inf")
    #: Per sink, a delivery mark a busy outbox did not take yet (the highest event_seq delivered).
    _unacked: dict[str, int] = field(default_factory=dict)

    # -- inputs ------------------------------------------------------------------------------
    def adopt_published(self, publications: list[CheckpointPublication], records: dict[str, EvaluationRecord]) -> None:
        """Seed state from earlier attempts: published checkpoints (and their recorded results)."""
        for pub in publications:
            track = CheckpointTrack(step=pub.step, sha256=pub.sha256, path=Path(), purpose=pub.purpose,
                                    ready_at=self.clock(), publication=pub)
            track.evaluation = records.get(pub.sha256)
            self.tracks[pub.step] = track

    def adopt_local(self, step: int, sha256: str, path: Path, purpose: str) -> None:
        """Seed an unpublished, verified checkpoint of an earlier attempt: it is published like a new one."""
        if step not in self.tracks:
            self.tracks[step] = CheckpointTrack(step=step, sha256=sha256, path=path, purpose=purpose,
                                                ready_at=self.clock())

    def poll_outbox(self) -> list[Event]:
        """Read new outbox events and fold them into the state."""
        events = self.outbox.read(self.after_seq, 1000)
        while events:
            for event in events:
                self._ingest(event)
                self.after_seq = event.event_seq
            if len(events) < 1000:
                break
            events = self.outbox.read(self.after_seq, 1000)
        return events

    def _ingest(self, event: Event) -> None:
        if (self.fence is not None and event.fence is not None and event.fence != self.fence
                and event.event_seq >= self.opened_seq):
            if not self.refused_events:
                log.warning("run %s: refusing events of %s epoch %s (superseded by %s epoch %s), from event_seq %d",
                            self.spec.run_id, event.attempt, event.epoch, *self.fence, event.event_seq)
            self.refused_events += 1
            return
        if event.event_seq < self.first_seq and event.kind in ("checkpoint_ready", "learner_finished",
                                                               "learner_started", "stop_observed"):
            return  # an abandoned learner lineage: its metrics are still delivered, nothing else
        self.last_step = max(self.last_step, event.step)
        if event.kind == "checkpoint_ready":
            p = event.payload
            step, sha = int(p["step"]), str(p["sha256"])
            if self.frozen:
                log.warning("run %s: checkpoint step %d arrived after the set was frozen; not published",
                            self.spec.run_id, step)
                return
            existing = self.tracks.get(step)
            if existing is None or existing.sha256 != sha:
                self.tracks[step] = CheckpointTrack(step=step, sha256=sha, path=Path(p["path"]),
                                                    purpose=str(p.get("purpose", "periodic")), ready_at=self.clock())
            elif existing.publication is not None and existing.path == Path():
                existing.path = Path(p["path"])
        elif event.kind in METRIC_KINDS:
            metrics = event.payload.get("metrics", {})
            if event.attempt is not None or event.event_seq < self.opened_seq:
                # An earlier attempt's unstamped event keeps no attempt rather than taking this one's.
                for sink in self.sinks:
                    if isinstance(sink, JournalSink):
                        sink.attempts[event.event_seq] = event.attempt
            self._pending_metrics.append((event.event_seq, {**metrics, "orchestration/event_seq": event.event_seq}))
        elif event.kind == "learner_finished":
            self.learner_finished = dict(event.payload)
        elif event.kind == "learner_started":
            self.learner_started = dict(event.payload)

    # -- decisions -----------------------------------------------------------------------------
    def _written(self, what: str, write: Callable[[], object]) -> bool:
        """Make one outbox write unless the outbox was just found busy; False when it was not made
        (the caller keeps it for a later tick).

        A write that finds the outbox locked by another process past the busy timeout (a learner
        frozen inside its write) starts :data:`BUSY_BACKOFF_S` without writes, while the driver's
        stop grace period goes on (a killed learner frees the lock); said at most every 30 s.
        """
        if self.clock() < self._busy_until:
            return False
        try:
            write()
        except OutboxBusy as e:
            now = self.clock()
            self._busy_until = now + BUSY_BACKOFF_S
            if self._busy_logged_at is None or now - self._busy_logged_at >= 30.0:
                self._busy_logged_at = now
                log.warning("run %s: %s not written yet, the outbox is locked by another process (a learner "
                            "frozen inside its write?); trying again: %s", self.spec.run_id, what, e)
            return False
        return True

    def _write_pending(self) -> None:
        """Write what a busy outbox refused earlier: the stop request, then supervisor metrics in order."""
        if self._stop_unwritten:
            if not self._written("the stop request", partial(self.outbox.request_stop, self.stop_reason)):
                return
            self._stop_unwritten = False
        while self._unemitted:
            step, metrics = self._unemitted[0]
            if not self._written("the supervisor's metrics", partial(
                    self.outbox.append, SUPERVISOR_METRICS, step, {"metrics": metrics, "attempt_id": self.attempt_id})):
                return
            self._unemitted.pop(0)

    def advance(self) -> None:
        """Collect finished work and start what is ready (publications, evaluations, stop).

        A write the outbox refuses as busy (:class:`gradlab.outbox.OutboxBusy`) is kept and tried
        again on a later call: a verdict, the stop request, the supervisor's metrics. Once a write
        found it busy, the others wait :data:`BUSY_BACKOFF_S` instead of each waiting out the busy
        timeout (so the driver's tick, its lease renewal and its stop enforcement go on).
        """
        self._write_pending()
        for track in sorted(self.tracks.values(), key=lambda t: t.step):
            self._collect_publication(track)
            self._collect_evaluation(track)
        for track in sorted(self.tracks.values(), key=lambda t: t.step):
            if track.publication is None and track.publish_future is None and track.publish_error is None:
                track.publish_future = self.submit_publish(track)
        if self.evaluate:
            self._defer_above_accepted()
            in_flight = sum(1 for t in self.tracks.values() if t.eval_future is not None)
            for track in sorted(self.tracks.values(), key=lambda t: t.step):
                if in_flight >= self.max_parallel_evals:
                    break
                if track.publication is None and track.publish_error is None:
                    break  # lowest step first: a lower checkpoint still publishing goes before the rest
                if track.publication is not None and track.eval_future is None and not track.evaluation_done:
                    try:
                        track.eval_future = self.submit_evaluate(track)
                    except (IntegrityError, NotFound) as e:  # no verified copy to evaluate: not usable
                        self._unusable(track, f"step {track.step}: {e}")
                        continue
                    track.eval_submitted_at = self.clock()
                    in_flight += 1
        self._write_verdicts()
        self._maybe_stop()

    @property
    def stop_rule(self) -> str | None:
        """The stop rule this attempt's learner follows: ``at_checkpoint`` when it evaluates and
        stops on acceptance, else None (the learner waits for no verdict)."""
        return AT_CHECKPOINT if self.evaluate and self.stop_on_acceptance else None

    def announce_stop_rule(self) -> None:
        """Write :attr:`stop_rule` to the outbox (before the learner's first step)."""
        self.outbox.set_stop_rule(self.stop_rule)

    def _write_verdicts(self) -> None:
        """Tell the learner each checkpoint's final status, once: no other will come for it."""
        if self.stop_rule is None:
            return
        for track in sorted(self.tracks.values(), key=lambda t: t.step):
            if track.step in self._verdicts_written:
                continue
            if track.accepted:
                verdict = "accepted"
            elif track.eval_error is not None or track.unusable is not None or track.publish_error is not None:
                verdict = "failed"  # no (usable) evaluation will come: the learner goes on
            elif track.evaluation is not None:
                verdict = track.evaluation.status
            elif track.deferred:
                verdict = "deferred"
            else:
                continue
            if not self._written(f"the verdict on step {track.step}", partial(self.outbox.set_verdict, track.step, verdict)):
                return
            self._verdicts_written.add(track.step)

    def advance_collect_only(self) -> None:
        """Collect finished work without starting any (used while winding down)."""
        for track in sorted(self.tracks.values(), key=lambda t: t.step):
            self._collect_publication(track)
            self._collect_evaluation(track)

    def _collect_publication(self, track: CheckpointTrack) -> None:
        future = track.publish_future
        if future is None or not future.done():
            return
        track.publish_future = None
        try:
            track.publication = future.result()
        except LeaseLost:
            raise
        except Exception as e:  # noqa: BLE001 - recorded; the task already retried transient errors
            track.publish_error = f"{type(e).__name__}: {e}"
            log.error("run %s: publishing step %d failed: %s", self.spec.run_id, track.step, track.publish_error)
            return
        self._emit({"orchestration/checkpoint/publish_seconds": self.clock() - track.ready_at,
                    "orchestration/checkpoints/published": self.count("published")}, track.step)

    def _collect_evaluation(self, track: CheckpointTrack) -> None:
        future = track.eval_future
        if future is None or not future.done():
            return
        track.eval_future = None
        try:
            track.evaluation = future.result()
        except LeaseLost:
            raise
        except Exception as e:  # noqa: BLE001 - recorded as a failed evaluation in the receipt
            track.eval_error = f"{type(e).__name__}: {e}"
            log.error("run %s: evaluating step %d failed: %s", self.spec.run_id, track.step, track.eval_error)
            return
        record = track.evaluation
        metrics: dict[str, Any] = {}
        if record.result is not None:
            metrics.update({k: v for k, v in record.result.get("aggregates", {}).items()})
        metrics["eval/checkpoint_step"] = track.step
        if track.eval_submitted_at is not None:
            metrics["orchestration/eval/seconds"] = self.clock() - track.eval_submitted_at
        metrics["orchestration/checkpoints/evaluated"] = self.count("evaluated")
        metrics["orchestration/checkpoints/accepted"] = self.count("accepted")
        if record.status == "accepted" and self._first_accept_at is None:
            self._first_accept_at = self.clock()
        self._emit(metrics, track.step)

    def _unusable(self, track: CheckpointTrack, why: str) -> None:
        """Mark a published checkpoint that fails verification not usable; record it (``on_unusable``)."""
        track.unusable = why
        log.error("run %s: checkpoint at step %d is not usable (not evaluated nor promoted): %s",
                  self.spec.run_id, track.step, why)
        try:
            track.evaluation = self.on_unusable(track, why) if self.on_unusable is not None else None
        except LeaseLost:
            raise
        except Exception as e:  # noqa: BLE001 - the store is down: the receipt's reason names it instead
            log.warning("run %s: recording step %d as not usable failed: %s", self.spec.run_id, track.step, e)
        if track.evaluation is None:
            track.eval_error = why

    def _defer_above_accepted(self) -> None:
        accepted = [t.step for t in self.tracks.values() if t.accepted]
        if not accepted:
            return
        lowest = min(accepted)
        for track in self.tracks.values():
            if track.step > lowest and track.eval_future is None and not track.evaluation_done:
                track.deferred = True

    def _maybe_stop(self) -> None:
        if self.stop_reason is not None or not self.stop_on_acceptance or self._first_accept_at is None:
            return
        step = min(t.step for t in self.tracks.values() if t.accepted)
        self.ask_stop(f"accepted:{step}")
        self._emit({"orchestration/eval/result_to_stop_seconds": self._stop_written_at - self._first_accept_at}, step)

    @property
    def stop_asked_at(self) -> float | None:
        """When (on :attr:`clock`) the learner was asked to stop; None while it was not."""
        return self._stop_written_at if self.stop_reason is not None else None

    def ask_stop(self, reason: str) -> None:
        """Ask the learner to stop at its next safe boundary (once; the first reason wins)."""
        if self.stop_reason is not None:
            return
        self.stop_reason = reason
        self._stop_written_at = self.clock()  # the stop grace period runs from here, written or not
        # What the learner reads: the stop takes effect from here (a busy outbox takes it later).
        self._stop_unwritten = not self._written("the stop request", partial(self.outbox.request_stop, reason))
        if self.request_stop is not None:
            self.request_stop(reason)
        log.info("run %s: stop requested (%s)", self.spec.run_id, reason)

    def _emit(self, metrics: dict[str, Any], step: int) -> None:
        """Append the supervisor's own metrics to the outbox, so they get an event_seq like any other
        (after any still waiting for a busy outbox, in order)."""
        self._unemitted.append((step, metrics))
        self._write_pending()

    # -- metrics ----------------------------------------------------------------------------------
    def deliver_metrics(self) -> None:
        """Deliver pending metric events to every sink and acknowledge each sink's high-water mark.

        Raises:
            LeaseLost: a newer attempt fenced this outbox, or ``confirm_lease`` found the lease lost;
                nothing is delivered (the successor delivers from the outbox).
        """
        self._ack_pending()
        if not self._pending_metrics and not any(self._backlog.values()):
            return
        self._require_fence()
        batch, self._pending_metrics = self._pending_metrics, []
        for sink in self.sinks:
            queue = self._backlog.get(sink.name, []) + batch
            if not queue:
                continue
            mark = self.outbox.high_water(sink.name)
            todo = [(seq, m) for seq, m in queue if seq > mark]
            delivered = sink.deliver(todo) if todo else 0
            if delivered:
                self._unacked[sink.name] = max(delivered, self._unacked.get(sink.name, 0))
                self._ack_pending()
            # A sink that took only part (W&B still starting) gets the rest next time; one that has
            # given up (W&B failed) keeps nothing: the outbox has it for a later attempt's drain.
            keep = getattr(sink, "accepting", True)
            self._backlog[sink.name] = [(seq, m) for seq, m in todo if seq > delivered] if keep else []

    def _ack_pending(self) -> None:
        """Write each sink's delivery mark not yet in the outbox (one a busy outbox refused waits for
        the next call; nothing is delivered twice meanwhile: the backlog holds only what is not)."""
        for name, seq in list(self._unacked.items()):
            if not self._written(f"{name}'s delivery mark", partial(self.outbox.ack, name, seq)):
                return
            del self._unacked[name]

    def _require_fence(self) -> None:
        if self.fence is not None and (current := self.outbox.fence()) not in (None, self.fence):
            raise LeaseLost(f"{self.outbox.path}: fenced by {current[0]} epoch {current[1]}; "
                            f"{self.fence[0]} epoch {self.fence[1]} delivers nothing more")
        if self.confirm_lease is not None:
            self.confirm_lease()

    # -- the end ----------------------------------------------------------------------------------
    def freeze(self) -> None:
        """The learner has exited: read its last events; no checkpoint joins the set after this."""
        self.poll_outbox()
        self.frozen = True

    def work_done(self) -> bool:
        """Every frozen checkpoint published (or failed) and evaluated (or deferred / not evaluating)."""
        if not self.frozen:
            return False
        for track in self.tracks.values():
            if track.publish_future is not None or track.eval_future is not None:
                return False
            if track.publication is None and track.publish_error is None:
                return False
            if self.evaluate and track.publication is not None and not track.evaluation_done:
                return False
        return True

    def drained(self) -> bool:
        """:meth:`work_done`, and every metric event read and delivered."""
        return (self.work_done() and not self._pending_metrics and not self._unemitted and not self._unacked
                and self.outbox.max_seq() <= self.after_seq)

    def abandon_evaluations(self, reason: str) -> None:
        """Cancelled or failed attempt: unevaluated checkpoints stay deferred (a retry evaluates them)."""
        for track in self.tracks.values():
            if track.eval_future is None and not track.evaluation_done:
                track.deferred = True
        self._write_verdicts()
        log.info("run %s: unevaluated checkpoints deferred (%s)", self.spec.run_id, reason)

    def promotion_candidate(self) -> CheckpointTrack | None:
        """The lowest-step accepted, published checkpoint, or None."""
        accepted = [t for t in self.tracks.values() if t.accepted and t.publication is not None]
        return min(accepted, key=lambda t: t.step) if accepted else None

    def publish_failures(self) -> list[CheckpointTrack]:
        return [t for t in self.tracks.values() if t.publish_error is not None]

    def count(self, what: str) -> int:
        tracks = self.tracks.values()
        if what == "published":
            return sum(1 for t in tracks if t.publication is not None)
        if what == "evaluated":
            return sum(1 for t in tracks if t.evaluation is not None)
        if what == "accepted":
            return sum(1 for t in tracks if t.accepted)
        if what == "ready":
            return len(self.tracks)
        raise ValueError(what)

