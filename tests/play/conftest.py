"""Fixtures of the web player's tests: real checkpoints written by the learner's own writer.

``cartpole_checkpoint``: a run directory (``spec.json`` + one checkpoint) of CartPole-v1/ppo from an
untrained SB3 PPO model with the recipe's network, so its episodes are short (tens of steps) and
every test sees several episode ends. The bandit run comes from ``tests/evaluation/conftest.py``.
Trained runs in real stores (file and S3) come from ``tests/play/trained.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.evaluation.conftest import write_bandit_run

CARTPOLE_RUN_ID = "gradlab-20260101T000000-0000cafe"


def write_cartpole_run(root: Path, *, run_id: str = CARTPOLE_RUN_ID) -> tuple[Path, Path]:
    """``root/<run_id>/spec.json`` and one checkpoint (step 64) of an untrained CartPole PPO policy."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO

    from gradlab.checkpoints import write_checkpoint
    from gradlab.checkpoints.bundle import versions
    from gradlab.checkpoints.policy import export_policy, save_policy_files
    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec

    spec = RunSpec.from_resolved(Experiments().resolve("CartPole-v1/ppo"), seed=0, run_id=run_id)
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(spec.to_json()))
    torch.set_num_threads(1)
    model = PPO("MlpPolicy", gym.make("CartPole-v1"), seed=0, device="cpu", n_steps=64, batch_size=64,
                policy_kwargs={"net_arch": [64, 64]})

    def write(folder: Path) -> None:
        model.save(folder / "policy.zip")
        tensors, pspec = export_policy(model, backend_id="sb3.ppo", algorithm="ppo",
                                       policy_model=spec.recipe.train.policy_model,
                                       env_observation_space=model.observation_space, transpose_image=False)
        save_policy_files(folder, tensors, pspec)

    path, _ = write_checkpoint(run_dir / "checkpoints", step=64, write_files=write, manifest_fields={
        "run_id": run_id, "purpose": "periodic", "goal_contract_sha256": spec.goal_contract_sha256,
        "recipe_sha256": spec.recipe_sha256, "environment_sha256": spec.environment_sha256,
        "backend_id": "sb3.ppo", "backend_config_sha256": "0" * 64, "versions": versions("gradlab"),
    })
    return run_dir, path


@pytest.fixture(scope="session")
def cartpole_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(run directory, checkpoint folder) of an untrained CartPole-v1/ppo policy."""
    return write_cartpole_run(tmp_path_factory.mktemp("play_runs"))


@pytest.fixture(scope="session")
def bandit_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    return write_bandit_run(tmp_path_factory.mktemp("play_bandit"))
