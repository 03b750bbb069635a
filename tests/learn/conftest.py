"""Run specs for learner tests, built from contracts (no YAML needed for the tiny test envs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.contracts.experiments import environment_sha256, goal_contract_sha256, recipe_sha256
from gradlab.contracts.goal import Goal
from gradlab.contracts.recipe import Recipe
from gradlab.contracts.run_spec import RunSpec


def make_spec(environment: dict[str, Any], backend: dict[str, Any], *, timesteps: int, checkpoint_freq: int,
              seed: int = 0, policy_model: dict[str, Any] | None = None, normalize: dict[str, Any] | None = None,
              early_stop: dict[str, Any] | None = None, run_id: str = "gradlab-20250101T000000-0123abcd") -> RunSpec:
    env = EnvironmentSpec.model_validate(environment)
    goal = Goal.model_validate({
        "goal_id": "test", "evaluation_mode": "training_only",
        "train": {"checkpoint_freq": checkpoint_freq, "environment": env.model_dump(mode="json"),
                  **({"early_stop": early_stop} if early_stop else {})},
    })
    train: dict[str, Any] = {"timesteps": timesteps, "backend": backend}
    if policy_model:
        train["policy_model"] = policy_model
    if normalize:
        train["normalize"] = normalize
    recipe = Recipe.model_validate({"recipe_id": "test", "train": train})
    return RunSpec(
        run_id=run_id, goal_id="test", recipe_id="test", seed=seed, goal=goal, recipe=recipe, environment=env,
        eval_environment=goal.eval_environment(env), checkpoint_freq=checkpoint_freq,
        goal_contract_sha256=goal_contract_sha256(goal), recipe_sha256=recipe_sha256(recipe),
        environment_sha256=environment_sha256(env), created_at="2025-01-01T00:00:00+00:00",
    )


def write_spec(spec: RunSpec, path: Path) -> Path:
    path.write_text(json.dumps(spec.to_json()))
    return path


BANDIT = {"provider": "gradlab", "env_id": "Bandit-v0", "n_envs": 8, "provider_args": {"n_arms": 4},
          "task": {"signals": {"correct": {"source": "info", "key": "correct"}},
                   "events": {"hit": {"signal": "correct", "op": "equals", "value": True},
                              "miss": {"signal": "correct", "op": "equals", "value": False}},
                   "termination": {"success": ["hit"], "failure": ["miss"]}}}

CARTPOLE = {"provider": "gymnasium", "env_id": "CartPole-v1", "n_envs": 8, "vectorization": "sync",
            "task": {"termination": {"native_terminated": "failure"}}}
