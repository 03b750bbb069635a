"""The resolved run spec: everything a learner or evaluator needs, written once per run.

A run spec is the JSON file the supervisor hands to ``python -m gradlab.learn --spec``. It holds
the composed contracts themselves (not references to YAML files), so a run is reproducible even
after ``experiments/`` changes.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from pydantic import Field

from gradlab.contracts.base import Contract
from gradlab.contracts.environment import EnvironmentSpec
from gradlab.contracts.experiments import ResolvedRecipe
from gradlab.contracts.goal import Goal
from gradlab.contracts.recipe import Recipe
from gradlab.contracts.seeds import MAX_RUN_SEED


def new_run_id(now: datetime | None = None) -> str:
    """``gradlab-<utc yyyymmddThhmmss>-<8 hex>`` (docs/ARCHITECTURE.md section 1)."""
    now = now or datetime.now(UTC)
    return f"gradlab-{now.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"


class InitFrom(Contract):
    """A warm start's parent checkpoint (``gradlab train --init-from``): lineage and where to read it."""

    source: str = Field(description="What the user named: RUN[:STEP], a checkpoint folder or hf://OWNER/NAME.")
    checkpoint_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the parent's policy file.")
    checkpoint_step: int = Field(ge=0)
    run_id: str | None = Field(default=None, description="The parent checkpoint's run.")
    path: str = Field(description="The verified local folder of the parent checkpoint the learner reads.")
    optimizer: bool = Field(default=False, description="Also start from the parent's optimizer state.")


class RunSpec(Contract):
    run_id: str
    goal_id: str
    recipe_id: str
    seed: int = Field(ge=0, le=MAX_RUN_SEED)
    overrides: list[str] = Field(default_factory=list)
    goal: Goal
    recipe: Recipe
    environment: EnvironmentSpec = Field(description="Effective training environment.")
    eval_environment: EnvironmentSpec = Field(description="Effective evaluation environment.")
    checkpoint_freq: int = Field(ge=1, description="Env steps between periodic checkpoints.")
    evaluate: bool = Field(default=True, description="False: checkpoints are published but never evaluated "
                           "(``--no-eval``); kept by every attempt of the run.")
    goal_contract_sha256: str
    recipe_sha256: str
    environment_sha256: str
    created_at: str
    init_from: InitFrom | None = Field(default=None, description="Warm start: the parent checkpoint (lineage).")

    @property
    def display_name(self) -> str:
        """``<goal>__<recipe>__s<seed>__<8 hex>`` (docs/ARCHITECTURE.md section 1)."""
        return f"{self.goal_id}__{self.recipe_id}__s{self.seed}__{self.run_id[-8:]}"

    @property
    def hashes(self) -> dict[str, str]:
        return {
            "goal_contract_sha256": self.goal_contract_sha256,
            "recipe_sha256": self.recipe_sha256,
            "environment_sha256": self.environment_sha256,
        }

    @classmethod
    def from_resolved(cls, resolved: ResolvedRecipe, *, seed: int, run_id: str | None = None,
                      evaluate: bool = True, init_from: InitFrom | None = None) -> RunSpec:
        return cls(
            run_id=run_id or new_run_id(),
            goal_id=resolved.goal.goal_id,
            recipe_id=resolved.recipe.recipe_id,
            seed=seed,
            overrides=list(resolved.overrides),
            goal=resolved.goal,
            recipe=resolved.recipe,
            environment=resolved.environment,
            eval_environment=resolved.eval_environment,
            checkpoint_freq=resolved.checkpoint_freq,
            evaluate=evaluate,
            init_from=init_from,
            created_at=datetime.now(UTC).isoformat(),
            **resolved.hashes.as_dict(),
        )

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
