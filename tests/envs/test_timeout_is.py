"""``termination.timeout_is``: a survival goal's time limit is its success; truncation stays truncation."""

from __future__ import annotations

import numpy as np
import pytest

from gradlab.contracts import Experiments
from gradlab.contracts.task import TaskProgram, Termination
from gradlab.envs.task import TaskRunner

F = np.zeros(2, dtype=bool)


@pytest.mark.parametrize("fast", [False, True])
def test_reaching_the_time_limit_is_recorded_as_the_goals_outcome_and_stays_truncated(fast: bool) -> None:
    prog = TaskProgram.model_validate({"termination": {"max_episode_steps": 3, "native_terminated": "failure",
                                                       "timeout_is": "success"}})
    runner = TaskRunner(prog, 2)
    runner.reset_lanes([0, 1], [1, 2])

    def step(nterm, ntrunc):
        if fast:
            _, term, trunc, eps = runner.step_native(np.ones(2), nterm, ntrunc)
        else:
            r = runner.step(np.ones(2), nterm, ntrunc, {})
            term, trunc, eps = r.terminated, r.truncated, r.episodes
        return term.tolist(), trunc.tolist(), [(e.lane, e.outcome, e.reason) for e in eps]

    # Lane 1 falls (native termination: failure); lane 0 balances to the limit.
    assert step(F, F) == ([False, False], [False, False], [])
    assert step(np.array([False, True]), F) == ([False, True], [False, False], [(1, "failure", "native_terminated")])
    runner.reset_lanes([1], [None])
    # The limit: truncated (the learner bootstraps the value there), recorded as a success.
    assert step(F, np.array([False, True])) == (
        [False, False], [True, True], [(0, "success", "max_episode_steps"), (1, "success", "native_time_limit")])


def test_the_default_stays_timeout_and_keeps_the_contract_hash() -> None:
    assert Termination().timeout_is == "timeout"
    assert "timeout_is" not in Termination().model_dump(mode="json")  # goals that do not set it keep their hash
    assert Termination(timeout_is="success").model_dump(mode="json")["timeout_is"] == "success"


def test_cartpole_declares_its_time_limit_a_success() -> None:
    goal = Experiments().resolve("CartPole-v1/ppo").goal
    assert goal.train.environment.task.termination.timeout_is == "success"
