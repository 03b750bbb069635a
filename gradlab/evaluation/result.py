"""Evaluation request and result models, aggregates, verdict, and the result validator.

The result's JSON shape (docs/ARCHITECTURE.md section 8, ``gradlab eval --json``)::

    {"checkpoint_sha256", "checkpoint_step", "run_id", "goal_id", "policy",
     "hashes": {"checkpoint_sha256", "goal_contract_sha256", "recipe_sha256", "environment_sha256",
                "episode_manifest_sha256", "episodes_sha256", "protocol_version"},
     "episodes": [{"index", "lane", "seed", "start", "return", "raw_return", "length", "outcome",
                   "reason", "progress"}],
     "aggregates": {<registry metric name>: value}, "verdict": "accepted|rejected",
     "planned", "completed", "fail_fast", "wall_s"}

Everything but ``wall_s`` is a function of the checkpoint, the run spec and the manifest, so the
same checkpoint evaluated twice gives byte-identical rows and aggregates.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError

from gradlab.contracts.base import Contract
from gradlab.contracts.goal import AcceptanceRule, Goal
from gradlab.contracts.hashing import sha256_json
from gradlab.contracts.task import Outcome
from gradlab.errors import ContractViolation
from gradlab.evaluation import names
from gradlab.evaluation.acceptance import requires_perfect_success, rules_pass
from gradlab.evaluation.manifest import PROTOCOL_VERSION, build_manifest
from gradlab.evaluation.stats import summarize, wilson_interval

PolicyMode = Literal["stochastic", "deterministic"]
HASH_KEYS = (
    "checkpoint_sha256", "goal_contract_sha256", "recipe_sha256", "environment_sha256",
    "episode_manifest_sha256", "episodes_sha256", "protocol_version",
)


class EpisodeRow(Contract):
    """One evaluated episode: its manifest identity and what happened."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    index: int = Field(ge=0)
    lane: int = Field(ge=0)
    seed: int
    start: str | None = None
    return_: float = Field(alias="return", description="Shaped return (task program reward), summed.")
    raw_return: float = Field(description="Native provider return, summed.")
    length: int = Field(ge=0, description="Policy steps in the episode.")
    outcome: Outcome
    reason: str
    progress: dict[str, float] = Field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


class EvalRequest(Contract):
    """What to evaluate: a checkpoint and the run spec it was trained under (same JSON for every backend)."""

    checkpoint_dir: str = Field(description="Checkpoint directory (local to the evaluating machine).")
    checkpoint_sha256: str = Field(description="Expected sha256 of the checkpoint's policy file.")
    checkpoint_step: int = Field(ge=0)
    spec: dict[str, Any] = Field(description="gradlab.contracts.run_spec.RunSpec as JSON.")
    episodes: int | None = Field(default=None, ge=1, description="Override N (not a protocol result).")
    policy: PolicyMode | None = Field(default=None, description="Override the goal's action mode.")
    verify: Literal["full", "weights_only"] = Field(
        default="full", description="full: every manifest file; weights_only: the files evaluation loads."
    )

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class EvalResult(Contract):
    checkpoint_sha256: str
    checkpoint_step: int
    run_id: str | None = None
    goal_id: str
    policy: PolicyMode
    hashes: dict[str, str]
    episodes: list[EpisodeRow]
    aggregates: dict[str, float]
    verdict: Literal["accepted", "rejected"]
    planned: int = Field(ge=1)
    completed: int = Field(ge=0)
    fail_fast: bool = Field(description="True when every rule demands 100% success (stop at first failure).")
    wall_s: float = Field(default=0.0, ge=0.0, description="Wall time of the evaluation (not validated).")

    @property
    def accepted(self) -> bool:
        return self.verdict == "accepted"

    def as_json(self) -> dict[str, Any]:
        out = self.model_dump(mode="json", by_alias=True)
        return out

    @classmethod
    def from_json(cls, data: Any, *, source: str = "evaluation result") -> EvalResult:
        """Parse a JSON result.

        Raises:
            ContractViolation: ``data`` is not a result object, naming the first bad key paths.
        """
        if not isinstance(data, Mapping):
            raise ContractViolation(f"{source}: expected a JSON object, found {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in e.errors()[:5]
            )
            raise ContractViolation(f"{source}: malformed result: {problems}") from None


def episodes_sha256(rows: Sequence[EpisodeRow]) -> str:
    """sha256 of the canonical JSON of the rows (sorted by index)."""
    return sha256_json([r.as_json() for r in sorted(rows, key=lambda r: r.index)])


def compute_aggregates(
    rows: Sequence[EpisodeRow], *, planned: int, checkpoint_step: int, rules: Sequence[AcceptanceRule]
) -> tuple[dict[str, float], Literal["accepted", "rejected"]]:
    """Aggregates under registered names, and the verdict.

    Args:
        rows: completed episodes (at least one).
        planned: N in the manifest. A result with fewer completed rows than planned is rejected.
        checkpoint_step: env steps of the evaluated checkpoint (``eval/checkpoint_step``).
        rules: the goal's acceptance rules.

    Returns:
        ``(aggregates, verdict)``: return mean/std (population)/median/min/max, raw-return mean,
        length mean, outcome rates, success rate with its Wilson 95% interval (overall and per
        start), failure-reason rates (fraction of completed episodes), planned/completed counts,
        ``eval/acceptance/pass`` (1.0 or 0.0) and ``eval/checkpoint_step``.

    Raises:
        ContractViolation: no rows, or a rule names an unknown aggregate.
    """
    if not rows:
        raise ContractViolation("evaluation result: no completed episodes to aggregate")
    n = len(rows)
    agg: dict[str, float] = {}
    for stat, value in summarize([r.return_ for r in rows]).items():
        agg[names.EVAL_RETURN[stat]] = value
    agg[names.EVAL_RAW_RETURN_MEAN] = summarize([r.raw_return for r in rows])["mean"]
    agg[names.EVAL_LENGTH_MEAN] = summarize([r.length for r in rows])["mean"]
    outcomes = Counter(r.outcome for r in rows)
    for outcome in names.OUTCOMES:
        agg[names.EVAL_OUTCOME_RATE.format(outcome=outcome)] = outcomes[outcome] / n
    low, high = wilson_interval(outcomes["success"], n)
    agg[names.EVAL_SUCCESS_LOW], agg[names.EVAL_SUCCESS_HIGH] = low, high
    reasons = Counter(names.segment(r.reason) for r in rows if r.outcome == "failure")
    for reason, count in sorted(reasons.items()):
        agg[names.EVAL_FAILURE_REASON_RATE.format(reason=reason)] = count / n
    by_start: dict[str, list[EpisodeRow]] = defaultdict(list)
    for r in rows:
        if r.start is not None:
            by_start[names.segment(r.start)].append(r)
    for start, start_rows in sorted(by_start.items()):
        k = sum(r.outcome == "success" for r in start_rows)
        lo, hi = wilson_interval(k, len(start_rows))
        agg[names.EVAL_START_SUCCESS_RATE.format(start=start)] = k / len(start_rows)
        agg[names.EVAL_START_SUCCESS_LOW.format(start=start)] = lo
        agg[names.EVAL_START_SUCCESS_HIGH.format(start=start)] = hi
        agg[names.EVAL_START_EPISODES.format(start=start)] = float(len(start_rows))
    agg[names.EVAL_PLANNED] = float(planned)
    agg[names.EVAL_COMPLETED] = float(n)
    agg[names.EVAL_CHECKPOINT_STEP] = float(checkpoint_step)
    accepted = n == planned and rules_pass(rules, agg)
    agg[names.EVAL_PASS] = 1.0 if accepted else 0.0
    return agg, ("accepted" if accepted else "rejected")


def build_result(
    rows: Sequence[EpisodeRow],
    *,
    goal: Goal,
    planned: int,
    policy: PolicyMode,
    checkpoint_sha256: str,
    checkpoint_step: int,
    hashes: Mapping[str, str],
    run_id: str | None = None,
    wall_s: float = 0.0,
) -> EvalResult:
    """Assemble a result from rows: sorts rows by index, computes aggregates, verdict and ``episodes_sha256``.

    ``hashes`` supplies goal/recipe/environment/manifest hashes; the checkpoint hash, rows hash and
    protocol version are filled in here.
    """
    ordered = sorted(rows, key=lambda r: r.index)
    aggregates, verdict = compute_aggregates(
        ordered, planned=planned, checkpoint_step=checkpoint_step, rules=goal.eval.acceptance
    )
    all_hashes = dict(hashes)
    all_hashes.update(
        checkpoint_sha256=checkpoint_sha256,
        episodes_sha256=episodes_sha256(ordered),
        protocol_version=PROTOCOL_VERSION,
    )
    return EvalResult(
        checkpoint_sha256=checkpoint_sha256,
        checkpoint_step=checkpoint_step,
        run_id=run_id,
        goal_id=goal.goal_id,
        policy=policy,
        hashes=all_hashes,
        episodes=ordered,
        aggregates=aggregates,
        verdict=verdict,
        planned=planned,
        completed=len(ordered),
        fail_fast=requires_perfect_success(goal.eval.acceptance),
        wall_s=wall_s,
    )


def validate_result(
    result: EvalResult | Mapping[str, Any],
    *,
    expected: Mapping[str, str],
    goal: Goal,
    allow_protocol_overrides: bool = False,
) -> EvalResult:
    """Check a result against what it claims and what the caller expects; recompute everything.

    Args:
        result: a result or its JSON.
        expected: hashes the caller knows (any of ``HASH_KEYS``; typically checkpoint, goal,
            recipe, environment and manifest); each must equal the result's.
        goal: the goal the result claims to evaluate; its manifest and rules are rebuilt here.
        allow_protocol_overrides: accept another N or action mode than the goal's (``gradlab
            eval --episodes/--stochastic``); never for acceptance decisions.

    Returns:
        The parsed result, unchanged.

    Raises:
        ContractViolation: malformed JSON; a hash differs from ``expected`` or from what the rows
            and the goal give; rows that are not manifest episodes (edited seed, lane, start,
            duplicates); completed < planned without fail-fast grounds; aggregates or verdict that
            the rows do not give.
    """
    res = result if isinstance(result, EvalResult) else EvalResult.from_json(result)
    where = f"evaluation result for checkpoint {res.checkpoint_sha256[:16]} (step {res.checkpoint_step})"

    def refuse(message: str) -> ContractViolation:
        return ContractViolation(f"{where}: {message}")

    missing = [k for k in HASH_KEYS if k not in res.hashes]
    if missing:
        raise refuse(f"hashes lack {', '.join(missing)}")
    if res.hashes["checkpoint_sha256"] != res.checkpoint_sha256:
        raise refuse("hashes.checkpoint_sha256 differs from checkpoint_sha256")
    for key, value in expected.items():
        if key not in HASH_KEYS:
            raise ContractViolation(f"validate_result: unknown expected hash {key!r}; known: {', '.join(HASH_KEYS)}")
        if res.hashes[key] != value:
            raise refuse(f"{key} is {res.hashes[key]}, expected {value}")
    if res.hashes["protocol_version"] != PROTOCOL_VERSION:
        raise refuse(f"protocol_version is {res.hashes['protocol_version']!r}, expected {PROTOCOL_VERSION!r}")
    if res.goal_id != goal.goal_id:
        raise refuse(f"goal_id is {res.goal_id!r}, expected {goal.goal_id!r}")
    if not allow_protocol_overrides:
        if res.planned != goal.eval.episodes:
            raise refuse(f"planned {res.planned} episodes, the goal's protocol is {goal.eval.episodes}")
        if res.policy != goal.eval.policy:
            raise refuse(f"policy {res.policy!r}, the goal's protocol is {goal.eval.policy!r}")

    manifest = build_manifest(goal, episodes=res.planned)
    if res.hashes["episode_manifest_sha256"] != manifest.sha256:
        raise refuse(
            f"episode_manifest_sha256 {res.hashes['episode_manifest_sha256']} is not the goal's manifest "
            f"{manifest.sha256} for {res.planned} episodes"
        )
    rows = list(res.episodes)
    if [r.index for r in rows] != sorted({r.index for r in rows}):
        raise refuse("episode rows are not sorted by index or repeat an index")
    for row in rows:
        if row.index >= manifest.planned:
            raise refuse(f"episode {row.index} is outside the manifest of {manifest.planned}")
        ident = manifest.episodes[row.index]
        if (row.lane, row.seed, row.start) != (ident.lane, ident.seed, ident.start):
            raise refuse(
                f"episode {row.index}: (lane, seed, start) = ({row.lane}, {row.seed}, {row.start}), manifest "
                f"says ({ident.lane}, {ident.seed}, {ident.start})"
            )
    if res.completed != len(rows):
        raise refuse(f"completed is {res.completed} but {len(rows)} episode rows are present")
    fail_fast = requires_perfect_success(goal.eval.acceptance)
    if res.fail_fast != fail_fast:
        raise refuse(f"fail_fast is {res.fail_fast}, the goal's rules give {fail_fast}")
    if res.completed < res.planned:
        if not fail_fast:
            raise refuse(f"only {res.completed} of {res.planned} episodes completed; all are required")
        if not rows or all(r.outcome == "success" for r in rows):
            raise refuse(f"stopped at {res.completed} of {res.planned} episodes without a failed episode")
    if res.hashes["episodes_sha256"] != episodes_sha256(rows):
        raise refuse("episodes_sha256 does not match the episode rows (rows edited after the fact?)")

    aggregates, verdict = compute_aggregates(
        rows, planned=res.planned, checkpoint_step=res.checkpoint_step, rules=goal.eval.acceptance
    )
    if set(aggregates) != set(res.aggregates):
        extra = sorted(set(res.aggregates) - set(aggregates))
        lacking = sorted(set(aggregates) - set(res.aggregates))
        raise refuse(f"aggregates differ from the rows' aggregates: extra {extra}, missing {lacking}")
    for name, value in aggregates.items():
        if not math.isclose(res.aggregates[name], value, rel_tol=1e-9, abs_tol=1e-12):
            raise refuse(f"aggregate {name} is {res.aggregates[name]!r}, the rows give {value!r}")
    if res.verdict != verdict:
        raise refuse(f"verdict is {res.verdict!r}, the rows and rules give {verdict!r}")
    return res
