"""A baseline agent's dataset records how it acts, whatever the goal's evaluation asks of a trained policy."""

from __future__ import annotations

import pytest

from gradlab.datasets.plan import plan_recording
from gradlab.errors import ConfigError


def test_random_is_stochastic_and_noop_deterministic_and_a_contrary_mode_is_refused() -> None:
    assert plan_recording("r", goal_id="gradlab__bandit", policy="random", episodes=2).agent.policy_mode == "stochastic"
    assert plan_recording("n", goal_id="gradlab__bandit", policy="noop", episodes=2).agent.policy_mode == "deterministic"
    with pytest.raises(ConfigError, match="the random agent is stochastic"):
        plan_recording("r", goal_id="gradlab__bandit", policy="random", episodes=2, policy_mode="deterministic")
