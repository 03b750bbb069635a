"""Value targets on truncation vs termination, through SB3's own collect_rollouts path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradlab.learn.sb3 import SB3Backend, make_training_env
from tests.learn.conftest import make_spec


def _value_targets(end: str) -> np.ndarray:
    env = {"provider": "gradlab", "env_id": "Corridor-v0", "n_envs": 2, "provider_args": {"length": 5, "end": end}}
    spec = make_spec(env, {"id": "sb3.ppo", "config": {"n_steps": 5, "batch_size": 10, "gamma": 0.9, "gae_lambda": 0.95}},
                     timesteps=10, checkpoint_freq=10)
    backend = SB3Backend("sb3.ppo")
    backend.setup(spec, make_training_env(spec))
    policy = backend.model.policy
    with torch.no_grad():  # freeze the value head to V(s) = 10 everywhere
        policy.value_net.weight.zero_()
        policy.value_net.bias.fill_(10.0)
    policy.value_net.requires_grad_(False)
    backend.begin(resumed=False)
    backend.collect()
    buf = backend.model.rollout_buffer
    backend.close()
    return buf.returns.copy()  # (n_steps, n_envs): the value targets


def test_truncated_step_bootstraps_from_the_final_observation() -> None:
    returns = _value_targets("truncate")
    # Step 5 truncates: target = r + gamma * V(final obs) = 1 + 0.9 * 10 = 10; earlier steps also
    # 1 + 0.9 * 10 = 10 (every delta is 0 with V = 10).
    assert returns[4] == pytest.approx([10.0, 10.0], abs=1e-5)
    assert returns == pytest.approx(np.full((5, 2), 10.0), abs=1e-5)


def test_terminated_step_is_never_bootstrapped() -> None:
    returns = _value_targets("terminate")
    assert returns[4] == pytest.approx([1.0, 1.0], abs=1e-6)
    # One step before the end: delta = 1 + 0.9 * 10 - 10 = 0, plus gamma * lambda * (1 - 10) from the last step.
    assert returns[3] == pytest.approx([10.0 + 0.9 * 0.95 * (1.0 - 10.0)] * 2, abs=1e-5)
