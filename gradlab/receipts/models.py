"""Receipt models: frozen pydantic records of facts, written once (or by compare-and-swap) to a store.

Every model refuses unknown keys. Times are timezone-aware UTC datetimes, serialized as ISO 8601.
The terminal receipt's JSON shape is docs/ARCHITECTURE.md section 8.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import AwareDatetime, Field, model_validator

from gradlab.contracts.base import Contract
from gradlab.contracts.hashing import sha256_json

Outcome = Literal["succeeded", "failed", "cancelled", "stopped", "superseded"]
EvaluationStatus = Literal["accepted", "rejected", "failed", "deferred"]
AttemptMode = Literal["fresh", "resume", "drain"]


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


class CheckpointRef(Contract):
    """Where a published checkpoint lives."""

    step: int = Field(ge=0, description="Env steps of the checkpoint.")
    sha256: str = Field(description="sha256 of the checkpoint's policy file.")
    uri: str = Field(description="Model-store URL of the checkpoint folder (ends with '/').")


class RunRecord(Contract):
    """``runs/<run_id>/run.json``: the run's identity, written once when the run is opened."""

    run_id: str
    goal_id: str
    recipe_id: str
    seed: int = Field(ge=0)
    display_name: str
    overrides: list[str] = Field(default_factory=list)
    goal_contract_sha256: str
    recipe_sha256: str
    environment_sha256: str
    spec_sha256: str = Field(description="sha256 of the canonical JSON of the resolved run spec.")
    created_at: AwareDatetime

    @classmethod
    def from_spec(cls, spec: Any, *, now: datetime | None = None) -> RunRecord:
        """The record of a :class:`gradlab.contracts.run_spec.RunSpec`."""
        return cls(
            run_id=spec.run_id,
            goal_id=spec.goal_id,
            recipe_id=spec.recipe_id,
            seed=spec.seed,
            display_name=spec.display_name,
            overrides=list(spec.overrides),
            goal_contract_sha256=spec.goal_contract_sha256,
            recipe_sha256=spec.recipe_sha256,
            environment_sha256=spec.environment_sha256,
            spec_sha256=sha256_json(spec.model_dump(mode="json")),
            created_at=now or utcnow(),
        )


class Attempt(Contract):
    """``runs/<run_id>/attempts/<attempt_id>/attempt.json``: one execution of a run."""

    run_id: str
    attempt_id: str = Field(description="``attempt-<number:03d>``.")
    number: int = Field(ge=1)
    mode: AttemptMode = Field(description="fresh start, resume from a checkpoint, or drain only.")
    resume_from: CheckpointRef | None = None
    skipped_checkpoints: list[str] = Field(
        default_factory=list,
        description="Newer published checkpoints passed over because they failed verification against their "
                    "publication receipt, one line each naming the file (the resume fell back to ``resume_from``).")
    outbox: str | None = Field(default=None, description="Identity nonce of the run directory's outbox.sqlite this "
                               "attempt opened (its learner's events are numbered within it).")
    outbox_replaced: str | None = Field(
        default=None, description="Set when the outbox is not the one the previous attempt recorded (lost, truncated "
                                  "or replaced): names the file and both identities; that outbox's undelivered events "
                                  "are lost and no receipt counts them.")
    previous_attempt_id: str | None = None
    epoch: int | None = Field(default=None, ge=1, description="The lease epoch this attempt opened under "
                              "(every write on its behalf carries it; docs/ARCHITECTURE.md section 9).")
    flow_run_id: str | None = Field(default=None, description="The Prefect flow run executing this attempt: its "
                                    "state hooks close only this attempt, at this epoch.")
    host: str
    pid: int
    started_at: AwareDatetime


class Lease(Contract):
    """``runs/<run_id>/lease.json``: the run's writer lease (one live holder at a time; CAS-updated).

    ``generation`` increases by one at every acquisition by a new holder: a fencing token.
    """

    run_id: str
    holder: str = Field(description="The attempt id holding the lease.")
    owner: str = Field(description="``<host>:<pid>`` of the holding process.")
    owner_boot_id: str | None = Field(default=None, description="The owner's host boot id (Linux).")
    owner_pid_namespace: str | None = Field(default=None, description="The owner's PID namespace, "
                                            "``pid:[<inode>]``: its pid means something only there.")
    owner_pid: int | None = Field(default=None, description="The owner's pid.")
    owner_start: int | None = Field(default=None, description="The owner's start time, clock ticks since boot; with "
                                    "the boot id and pid it names one process (a recycled pid is not the owner).")
    generation: int = Field(ge=1)
    ttl_s: float = Field(gt=0, description="Seconds a heartbeat keeps the lease live.")
    acquired_at: AwareDatetime
    heartbeat_at: AwareDatetime
    expires_at: AwareDatetime
    released: bool = False

    def is_live(self, now: datetime | None = None) -> bool:
        """Not released and not yet expired at ``now``."""
        return not self.released and (now or utcnow()) < self.expires_at

    def owner_state(self) -> str:
        """``alive``, ``dead`` or ``unknown``, judged from this host (:func:`gradlab.receipts.owner.owner_state`)."""
        from gradlab.receipts.owner import owner_state

        return owner_state(self.owner_boot_id, self.owner_pid, self.owner_start, self.owner_pid_namespace)

    def in_force(self, now: datetime | None = None) -> bool:
        """Live, and its owner not known to be dead: a lease whose owner died in this host's PID
        namespace is not waited out; one held from another host or namespace is (docs/ARCHITECTURE.md
        section 9)."""
        return self.is_live(now) and self.owner_state() != "dead"


class FileEntry(Contract):
    sha256: str
    size_bytes: int = Field(ge=0)


class CheckpointPublication(Contract):
    """``runs/<run_id>/publications/<step>-<sha16>.json``: a checkpoint is in the model store, verified."""

    run_id: str
    attempt_id: str
    step: int = Field(ge=0)
    sha256: str = Field(description="sha256 of the policy file.")
    purpose: Literal["periodic", "final"]
    uri: str = Field(description="Model-store URL of the checkpoint folder (ends with '/').")
    files: dict[str, FileEntry] = Field(description="Every uploaded file (relative path) → sha256, size.")
    epoch: int | None = Field(default=None, description="The publishing attempt's lease epoch (fencing).")
    published_at: AwareDatetime

    @property
    def ref(self) -> CheckpointRef:
        return CheckpointRef(step=self.step, sha256=self.sha256, uri=self.uri)


class IndexEntry(Contract):
    step: int = Field(ge=0)
    sha256: str
    uri: str
    purpose: Literal["periodic", "final"]


class PromotionRef(Contract):
    checkpoint_step: int = Field(ge=0)
    sha256: str
    uri: str


class RunIndex(Contract):
    """``runs/<run_id>/index.json`` in the model store: checkpoints by step and the promotion.

    The only mutable object of a run's model store; updated by compare-and-swap (``version`` + 1 per
    update).
    """

    run_id: str
    version: int = Field(default=0, ge=0)
    checkpoints: list[IndexEntry] = Field(default_factory=list)
    promotion: PromotionRef | None = None


def evaluation_intent_key(
    run_id: str, checkpoint_sha256: str, goal_contract_sha256: str, episode_manifest_sha256: str
) -> str:
    """The content key of an evaluation: sha256 of the canonical JSON of its four identities.

    ``sha256_json({"checkpoint_sha256": ..., "episode_manifest_sha256": ..., "goal_contract_sha256":
    ..., "run_id": ...})`` (canonical JSON: sorted keys, compact separators, UTF-8), so the same
    checkpoint evaluated under the same goal and manifest always has the same key, and a retry finds
    the earlier intent and result instead of evaluating twice.
    """
    return sha256_json(
        {
            "run_id": run_id,
            "checkpoint_sha256": checkpoint_sha256,
            "goal_contract_sha256": goal_contract_sha256,
            "episode_manifest_sha256": episode_manifest_sha256,
        }
    )


class EvaluationIntent(Contract):
    """``runs/<run_id>/evaluations/<key>/intent.json`` in the eval store: an evaluation was asked for."""

    key: str = Field(description="evaluation_intent_key(run_id, checkpoint_sha256, goal hash, manifest hash).")
    run_id: str
    checkpoint_step: int = Field(ge=0)
    checkpoint_sha256: str
    checkpoint_uri: str
    goal_contract_sha256: str
    episode_manifest_sha256: str
    backend: str = Field(description="Evaluation backend id (local | modal).")
    attempt_id: str | None = Field(default=None, description="The attempt that asked first (fencing).")
    epoch: int | None = Field(default=None, description="That attempt's lease epoch (fencing).")
    created_at: AwareDatetime

    @model_validator(mode="after")
    def _key_matches(self) -> EvaluationIntent:
        expected = evaluation_intent_key(
            self.run_id, self.checkpoint_sha256, self.goal_contract_sha256, self.episode_manifest_sha256
        )
        if self.key != expected:
            raise ValueError(f"key: expected {expected} (content key), found {self.key}")
        return self

    @classmethod
    def create(
        cls,
        *,
        run_id: str,
        checkpoint: CheckpointRef,
        goal_contract_sha256: str,
        episode_manifest_sha256: str,
        backend: str,
        now: datetime | None = None,
        attempt_id: str | None = None,
        epoch: int | None = None,
    ) -> EvaluationIntent:
        """An intent with its content key filled in."""
        return cls(
            key=evaluation_intent_key(run_id, checkpoint.sha256, goal_contract_sha256, episode_manifest_sha256),
            run_id=run_id,
            checkpoint_step=checkpoint.step,
            checkpoint_sha256=checkpoint.sha256,
            checkpoint_uri=checkpoint.uri,
            goal_contract_sha256=goal_contract_sha256,
            episode_manifest_sha256=episode_manifest_sha256,
            backend=backend,
            attempt_id=attempt_id,
            epoch=epoch,
            created_at=now or utcnow(),
        )


class EvaluationRecord(Contract):
    """``runs/<run_id>/evaluations/<key>/result.json``: the outcome of one evaluation intent."""

    intent_key: str
    run_id: str
    checkpoint_step: int = Field(ge=0)
    checkpoint_sha256: str
    status: EvaluationStatus
    return_mean: float | None = None
    result: dict[str, Any] | None = Field(default=None, description="The evaluation result JSON (docs/ARCHITECTURE.md section 8).")
    result_sha256: str | None = Field(default=None, description="sha256_json(result).")
    error: str | None = Field(default=None, description="Why the evaluation failed or was deferred.")
    attempt_id: str | None = Field(default=None, description="The attempt that recorded the result (fencing).")
    epoch: int | None = Field(default=None, description="That attempt's lease epoch (fencing).")
    recorded_at: AwareDatetime

    @model_validator(mode="after")
    def _hash_matches(self) -> EvaluationRecord:
        if self.result is not None:
            expected = sha256_json(self.result)
            if self.result_sha256 != expected:
                raise ValueError(f"result_sha256: expected {expected}, found {self.result_sha256}")
        return self


class StopRequest(Contract):
    """``runs/<run_id>/stop.json``: the first request to stop the run's learner (first one wins)."""

    run_id: str
    attempt_id: str | None = None
    epoch: int | None = Field(default=None, description="The requesting attempt's lease epoch (fencing).")
    reason: str = Field(description="e.g. 'accepted:<checkpoint_step>', 'user', 'cancelled'.")
    checkpoint_step: int | None = None
    requested_at: AwareDatetime


class Promotion(Contract):
    """``runs/<run_id>/promotion.json``: the run's promoted checkpoint (exactly one per run)."""

    run_id: str
    attempt_id: str
    checkpoint_step: int = Field(ge=0)
    checkpoint_sha256: str
    uri: str = Field(description="Model-store URL of the promoted checkpoint folder.")
    evaluation_key: str
    result_uri: str
    return_mean: float | None = None
    epoch: int | None = Field(default=None, description="The promoting attempt's lease epoch (fencing).")
    promoted_at: AwareDatetime

    @property
    def ref(self) -> PromotionRef:
        return PromotionRef(checkpoint_step=self.checkpoint_step, sha256=self.checkpoint_sha256, uri=self.uri)


class TerminalCheckpoint(Contract):
    step: int = Field(ge=0)
    sha256: str
    uri: str


class TerminalEvaluation(Contract):
    checkpoint_step: int = Field(ge=0)
    status: EvaluationStatus
    result_uri: str | None
    return_mean: float | None


class TerminalPromotion(Contract):
    checkpoint_step: int = Field(ge=0)
    sha256: str
    uri: str


class TrainingObjective(Contract):
    """The goal's objective metric as training last reported it (a ``train/`` metric: the ranking of
    a training-only goal, docs/ARCHITECTURE.md section 12)."""

    metric: str = Field(description="The goal's objective.rank, a registered train/ metric.")
    value: float = Field(description="Its value in the attempt's last metrics event that carries it.")
    step: int = Field(ge=0, description="Env steps at that event.")


class TerminalMetrics(Contract):
    local_high_water: int = Field(ge=0, description="Last outbox event_seq delivered to the local journal.")
    sinks: dict[str, int | None] = Field(description="Per sink high-water event_seq; None: sink disabled.")
    pending: list[str] = Field(
        default_factory=list,
        description="Sinks behind local_high_water (e.g. W&B unreachable): complete locally, pending remotely.",
    )
    objective: TrainingObjective | None = Field(
        default=None, description="Set when the goal's objective is a training metric: its last value.")


class Supersession(Contract):
    """Why an attempt was sealed ``superseded``: the attempt that took the run's lease over."""

    attempt_id: str = Field(description="The new attempt.")
    epoch: int = Field(ge=1, description="The new attempt's lease epoch.")
    lease_expired_at: AwareDatetime | None = Field(description="When the superseded attempt's lease expired (None: "
                                                   "it was released, or its owner was known dead before).")


class LearnerExit(Contract):
    exit_code: int | None
    stop_reason: str | None


class TerminalReceipt(Contract):
    """``runs/<run_id>/attempts/<attempt_id>/terminal.json``: how an attempt ended (create-only).

    The run succeeded only if this receipt says ``outcome == "succeeded"``.
    """

    run_id: str
    attempt_id: str
    goal_id: str
    recipe_id: str
    seed: int = Field(ge=0)
    outcome: Outcome
    reason: str
    final_step: int | None = Field(ge=0)
    checkpoints: list[TerminalCheckpoint]
    evaluations: list[TerminalEvaluation]
    promotion: TerminalPromotion | None
    metrics: TerminalMetrics
    drained: bool
    learner: LearnerExit
    epoch: int | None = Field(default=None, description="The lease epoch of the attempt that sealed this receipt.")
    superseded_by: Supersession | None = Field(default=None, description="Set for outcome ``superseded``.")
    sealed_at: AwareDatetime
