"""A baseline agent's dataset records how it acts, whatever the goal's evaluation asks of a trained policy."""

from __future__ import annotations

from gradlab.datasets.plan import plan_recording


def test_random_is_stochastic_and_noop_deterministic_whatever_the_protocols_mode() -> None:
    assert plan_recording("r", goal_id="gradlab__bandit", policy="random", episodes=2).agent.policy_mode == "stochastic"
    assert plan_recording("n", goal_id="gradlab__bandit", policy="noop", episodes=2).agent.policy_mode == "deterministic"
    # `eval --baseline random --record-dataset` passes the protocol's mode, as its result records it.
    assert plan_recording("r", goal_id="gradlab__bandit", policy="random", episodes=2,
                          policy_mode="deterministic").agent.policy_mode == "stochastic"
