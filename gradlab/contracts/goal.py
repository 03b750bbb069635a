"""The goal contract: environment, task program, evaluation protocol and acceptance rule.

Also the comparison its operators name (:func:`compare`), which acceptance and early stop share.
"""

from __future__ import annotations

import operator as _op
from typing import Literal

from pydantic import Field, model_validator

from gradlab.contracts.base import Contract
from gradlab.contracts.environment import EnvironmentSpec
from gradlab.errors import ContractViolation

Operator = Literal[">=", ">", "<=", "<", "=="]
#: What each :data:`Operator` computes (acceptance rules and threshold early-stop conditions).
OPERATORS = {">=": _op.ge, ">": _op.gt, "<=": _op.le, "<": _op.lt, "==": _op.eq}


def compare(value: float, operator: str, threshold: float) -> bool:
    """``value <operator> threshold`` for ``>=, >, <=, <, ==``.

    Raises:
        ContractViolation: an unknown operator.
    """
    try:
        return bool(OPERATORS[operator](value, threshold))
    except KeyError:
        raise ContractViolation(f"unknown operator {operator!r}; expected one of {sorted(OPERATORS)}") from None


class Objective(Contract):
    rank: str = Field(
        default="eval/episode/return/mean", description="Registered metric that ranks runs of this goal."
    )
    direction: Literal["maximize", "minimize"] = "maximize"


class AcceptanceRule(Contract):
    metric: str = Field(description="Registered evaluation aggregate, e.g. eval/episode/return/mean.")
    operator: Operator
    threshold: float


class EarlyStopCondition(Contract):
    name: str = Field(pattern=r"^[a-z0-9_]+$", description="Used in metric names train/early_stop/{name}/...")
    metric: str = Field(description="Registered training metric.")
    kind: Literal["threshold", "plateau"]
    operator: Operator | None = Field(default=None, description="threshold: comparison with threshold.")
    threshold: float | None = None
    direction: Literal["maximize", "minimize"] | None = Field(default=None, description="plateau: improving way.")
    min_delta: float = Field(default=0.0, ge=0.0, description="plateau: smallest change that counts.")
    warmup_steps: int = Field(default=0, ge=0, description="Env steps before the condition is checked.")
    patience_steps: int = Field(default=0, ge=0, description="Env steps the condition must hold (or stall).")
    action: Literal["observe", "stop"] = "stop"

    @model_validator(mode="after")
    def _check_kind(self) -> EarlyStopCondition:
        if self.kind == "threshold" and (self.operator is None or self.threshold is None):
            raise ValueError("a threshold condition needs 'operator' and 'threshold'")
        if self.kind == "plateau" and self.direction is None:
            raise ValueError("a plateau condition needs 'direction'")
        return self


class EarlyStop(Contract):
    on_acceptance: bool | None = Field(
        default=None, description="Stop at the first accepted checkpoint (default: true for evaluated goals)."
    )
    conditions: list[EarlyStopCondition] = Field(default_factory=list)


class GoalTrain(Contract):
    checkpoint_freq: int = Field(ge=1, description="Env steps between periodic checkpoints.")
    environment: EnvironmentSpec
    early_stop: EarlyStop = Field(default_factory=EarlyStop)


class GoalEval(Contract):
    episodes: int = Field(default=100, ge=1, description="N episodes in the fixed manifest.")
    n_envs: int = Field(default=4, ge=1, le=256, description="Evaluation lanes; quotas split N across them.")
    seed: int = Field(default=0, ge=0, lt=2**30, description="Base seed (offset by EVAL_SEED_OFFSET).")
    policy: Literal["stochastic", "deterministic"] = "deterministic"
    starts: list[str] = Field(default_factory=list, description="Start states, for providers with several.")
    acceptance: list[AcceptanceRule] = Field(default_factory=list)


class Goal(Contract):
    goal_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+\-]*(/[A-Za-z0-9][A-Za-z0-9_.+\-]*){0,3}$",
                         description="The goal's folder path under experiments/goals (Family/Sub).")
    title: str = ""
    description: str = ""
    tags: list[str] = Field(default_factory=list)
    evaluation_mode: Literal["evaluated", "training_only"] = "evaluated"
    objective: Objective = Field(default_factory=Objective)
    train: GoalTrain
    eval: GoalEval = Field(default_factory=GoalEval)
    reference_scores: dict[str, float] = Field(
        default_factory=dict,
        description="Published reference returns on this goal, e.g. {human: 30.5}; with the measured random "
                    "baseline they give normalised scores (score - random) / (human - random). Cite the source "
                    "in the description.")

    @model_validator(mode="after")
    def _check_mode(self) -> Goal:
        if self.evaluation_mode == "evaluated" and not self.eval.acceptance:
            raise ValueError("an evaluated goal needs at least one eval.acceptance rule")
        return self

    @property
    def stops_on_acceptance(self) -> bool:
        flag = self.train.early_stop.on_acceptance
        return (self.evaluation_mode == "evaluated") if flag is None else flag

    def eval_environment(self, train_env: EnvironmentSpec | None = None) -> EnvironmentSpec:
        """The evaluation environment: the training environment with the evaluation lane count."""
        env = train_env or self.train.environment
        return env.model_copy(update={"n_envs": self.eval.n_envs})


COSMETIC_GOAL_FIELDS = {"title", "description", "tags", "reference_scores"}
"""Fields outside ``goal_contract_sha256``: they describe the goal, they do not define its protocol."""
