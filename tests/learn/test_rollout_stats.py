"""Per-rollout reward statistics (``train/reward/shaped/*``), computed once per rollout."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradlab.learn.stats import RolloutStats


def test_reward_statistics_over_a_rollout() -> None:
    stats = RolloutStats()
    assert stats.metrics() == {}
    rewards = np.array([1.0, 0.0], dtype=np.float32)
    stats.add_rewards(rewards)
    rewards[:] = 99.0  # the caller's array may be reused: the stats keep their own copy
    stats.add_rewards(np.array([2.0, -1.0], dtype=np.float32))
    # 4 rewards 1, 0, 2, -1: mean 0.5; E[r^2] = 6/4 = 1.5; var = 1.5 - 0.25 = 1.25 (population).
    assert stats.steps == 4
    m = stats.metrics()
    assert m["train/reward/shaped/mean"] == pytest.approx(0.5, abs=1e-12)
    assert m["train/reward/shaped/std"] == pytest.approx(math.sqrt(1.25), abs=1e-12)
    assert m["train/reward/shaped/min"] == -1.0
    assert m["train/reward/shaped/max"] == 2.0
