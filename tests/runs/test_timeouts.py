"""Task timeouts derived from the goal (issue 16 item 4); the end-to-end hang is in test_lifecycle.py."""

from __future__ import annotations

import pytest

from gradlab.contracts import Experiments
from gradlab.contracts.run_spec import RunSpec
from gradlab.errors import ConfigError
from gradlab.runs import timeouts
from gradlab.runs.timeouts import episode_step_cap, task_timeouts


def _spec(ref: str) -> RunSpec:
    return RunSpec.from_resolved(Experiments().resolve(ref), seed=0)


def test_evaluation_timeout_follows_episodes_times_the_step_cap() -> None:
    spec = _spec("CartPole-v1/ppo")  # 100 episodes over 20 lanes, gymnasium's 500-step limit
    assert episode_step_cap(spec.goal) == 500
    expected = timeouts.STARTUP_S + 100 * 500 / (20 * timeouts.LANE_STEPS_PER_S)
    assert task_timeouts(spec).evaluate_s == pytest.approx(expected)
    breakout = _spec("Breakout-Atari2600-v0/ppo")  # ALE: 108,000 frames at frame skip 4
    assert episode_step_cap(breakout.goal) == 27_000


def test_publication_timeout_grows_with_the_checkpoint_size_and_the_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = task_timeouts(_spec("CartPole-v1/ppo"))
    assert limits.publish_s(0) == timeouts.BASE_S
    assert limits.publish_s(10 * 1024 * 1024) == pytest.approx(timeouts.BASE_S + 20.0)  # written and re-read
    monkeypatch.setenv("GRADLAB_TASK_TIMEOUT_SCALE", "3")
    scaled = task_timeouts(_spec("CartPole-v1/ppo"))
    assert scaled.evaluate_s == pytest.approx(3 * limits.evaluate_s) and scaled.publish_s(0) == 3 * timeouts.BASE_S


@pytest.mark.parametrize("value", ["0", "-1", "fast", "nan", "inf"])
def test_a_bad_scale_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("GRADLAB_TASK_TIMEOUT_SCALE", value)
    with pytest.raises(ConfigError, match=f"GRADLAB_TASK_TIMEOUT_SCALE='{value}': expected a positive number"):
        task_timeouts(_spec("CartPole-v1/ppo"))
