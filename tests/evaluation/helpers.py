"""Shared builders for evaluation tests."""

from __future__ import annotations

from typing import Any

from gradlab.contracts.goal import Goal


def make_goal(
    *,
    episodes: int = 10,
    n_envs: int = 2,
    seed: int = 0,
    starts: list[str] | None = None,
    acceptance: list[dict[str, Any]] | None = None,
    env: dict[str, Any] | None = None,
    policy: str = "deterministic",
    goal_id: str = "test-goal",
) -> Goal:
    return Goal.model_validate({
        "goal_id": goal_id,
        "train": {
            "checkpoint_freq": 1000,
            "environment": env or {"provider": "gymnasium", "env_id": "CartPole-v1", "n_envs": 2,
                                   "task": {"termination": {"native_terminated": "failure"}}},
        },
        "eval": {
            "episodes": episodes, "n_envs": n_envs, "seed": seed, "policy": policy,
            "starts": starts or [],
            "acceptance": acceptance if acceptance is not None else [
                {"metric": "eval/episode/return/mean", "operator": ">=", "threshold": 475}
            ],
        },
    })


def goal_hashes(goal: Goal) -> dict[str, str]:
    from gradlab.contracts.experiments import environment_sha256, goal_contract_sha256

    return {
        "goal_contract_sha256": goal_contract_sha256(goal),
        "recipe_sha256": "0" * 64,
        "environment_sha256": environment_sha256(goal.train.environment),
    }


def corridor_env(lengths: list[int]) -> dict[str, Any]:
    return {"provider": "gradlab", "env_id": "Corridor-v0", "n_envs": 1,
            "provider_args": {"length": lengths, "end": "truncate"}}


def fail_on_env(*, length: int = 5, fail_seeds: list[int] | None = None) -> dict[str, Any]:
    return {
        "provider": "gradlab", "env_id": "FailOn-v0", "n_envs": 1,
        "provider_args": {"length": length, "fail_seeds": fail_seeds or []},
        "task": {
            "signals": {"ok": {"source": "info", "key": "success"}},
            "events": {"hit": {"signal": "ok", "op": "equals", "value": True},
                       "miss": {"signal": "ok", "op": "equals", "value": False}},
            "termination": {"success": ["hit"], "failure": ["miss"]},
        },
    }


class ConstantPolicy:
    """Always the same discrete action."""

    def __init__(self, action: int):
        self.action = action

    def act(self, obs, *, deterministic, rng):
        import numpy as np

        return np.full(len(obs), self.action, dtype=np.int64)


class RandomPolicy:
    """Uniform over two actions, drawn from the evaluation's generator."""

    def act(self, obs, *, deterministic, rng):
        return rng.integers(0, 2, size=len(obs))
