"""A real run directory (``spec.json`` + checkpoints) for the built-in bandit goal.

Checkpoints are written by the learner's own writer from real SB3 PPO models: one untrained, one
trained for 1024 steps on a gymnasium copy of Bandit-v0 (same spaces and reward).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

RUN_ID = "gradlab-20260101T000000-0000abcd"


class _GymBandit:
    """Bandit-v0 as a gymnasium env (obs one-hot of the rewarding arm; reward 1 when chosen)."""

    def __new__(cls, n_arms: int = 4):
        import gymnasium as gym

        class GymBandit(gym.Env):
            def __init__(self):
                self.observation_space = gym.spaces.Box(0.0, 1.0, (n_arms,), np.float32)
                self.action_space = gym.spaces.Discrete(n_arms)
                self.arm = 0

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                self.arm = int(self.np_random.integers(n_arms))
                return np.eye(n_arms, dtype=np.float32)[self.arm], {}

            def step(self, action):
                return np.eye(n_arms, dtype=np.float32)[self.arm], float(action == self.arm), True, False, {}

        return GymBandit()


def write_bandit_run(root: Path, *, run_id: str = RUN_ID, train_steps: tuple[int, ...] = (0, 1024)) -> tuple[Path, list[Path]]:
    """``root/<run_id>/spec.json`` and one checkpoint per entry of ``train_steps`` (PPO steps learned)."""
    import torch
    from stable_baselines3 import PPO

    from gradlab.checkpoints import write_checkpoint
    from gradlab.checkpoints.bundle import versions
    from gradlab.checkpoints.policy import export_policy, save_policy_files
    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec

    spec = RunSpec.from_resolved(Experiments().resolve("gradlab__bandit/ppo"), seed=0, run_id=run_id)
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(spec.to_json()))
    dirs = []
    torch.set_num_threads(1)
    for steps in train_steps:
        model = PPO("MlpPolicy", _GymBandit(), seed=0, device="cpu", n_steps=64, batch_size=64, gamma=0.0,
                    learning_rate=3e-3, n_epochs=4, policy_kwargs={"net_arch": [32]})
        if steps:
            model.learn(steps)

        def write(folder: Path, model=model) -> None:
            model.save(folder / "policy.zip")
            tensors, pspec = export_policy(model, backend_id="sb3.ppo", algorithm="ppo",
                                           policy_model=spec.recipe.train.policy_model,
                                           env_observation_space=model.observation_space, transpose_image=False)
            save_policy_files(folder, tensors, pspec)

        path, _ = write_checkpoint(run_dir / "checkpoints", step=max(steps, 64), write_files=write, manifest_fields={
            "run_id": run_id, "purpose": "periodic", "goal_contract_sha256": spec.goal_contract_sha256,
            "recipe_sha256": spec.recipe_sha256, "environment_sha256": spec.environment_sha256,
            "backend_id": "sb3.ppo", "backend_config_sha256": "0" * 64, "versions": versions("gradlab"),
        })
        dirs.append(path)
    return run_dir, dirs


@pytest.fixture(scope="session")
def bandit_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    return write_bandit_run(tmp_path_factory.mktemp("runs"))
