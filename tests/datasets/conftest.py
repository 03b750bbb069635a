"""Shared recordings: a CartPole checkpoint of a tiny SB3 PPO policy (written by the learner's own
checkpoint writer) and one dataset of it, recorded once per module into a file dataset store."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

RUN_ID = "gradlab-20260101T000000-0000cafe"


def write_cartpole_run(root: Path, *, learn_steps: int = 128) -> Path:
    """``root/<run_id>/spec.json`` and one checkpoint of a PPO policy trained ``learn_steps`` on CartPole-v1."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO

    from gradlab.checkpoints import write_checkpoint
    from gradlab.checkpoints.bundle import versions
    from gradlab.checkpoints.policy import export_policy, save_policy_files
    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec

    spec = RunSpec.from_resolved(Experiments().resolve("CartPole-v1/ppo-sb3"), seed=0, run_id=RUN_ID)
    run_dir = root / RUN_ID
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(spec.to_json()))
    torch.set_num_threads(1)
    model = PPO("MlpPolicy", gym.make("CartPole-v1"), seed=0, device="cpu", n_steps=128, batch_size=64,
                n_epochs=2)
    model.learn(learn_steps)

    def write(folder: Path) -> None:
        model.save(folder / "policy.zip")
        tensors, pspec = export_policy(model, backend_id="sb3.ppo", algorithm="ppo",
                                       policy_model=spec.recipe.train.policy_model,
                                       env_observation_space=model.observation_space, transpose_image=False)
        save_policy_files(folder, tensors, pspec)

    path, _ = write_checkpoint(run_dir / "checkpoints", step=learn_steps, write_files=write, manifest_fields={
        "run_id": RUN_ID, "purpose": "final", "goal_contract_sha256": spec.goal_contract_sha256,
        "recipe_sha256": spec.recipe_sha256, "environment_sha256": spec.environment_sha256,
        "backend_id": "sb3.ppo", "backend_config_sha256": "0" * 64, "versions": versions("gymnasium"),
    })
    return path


@dataclass
class Recorded:
    checkpoint: Path
    store: Any
    cache: Path
    manifest: Any
    home: Path


@pytest.fixture(scope="module")
def cartpole_dataset(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """10 CartPole episodes of the tiny policy, chunks of 4, recorded in this process (no frames)."""
    from gradlab.datasets.plan import plan_recording
    from gradlab.datasets.record import record_chunk
    from gradlab.datasets.store import publish_dataset
    from gradlab.settings import load_settings
    from gradlab.stores import open_store

    home = tmp_path_factory.mktemp("dataset_home")
    checkpoint = write_cartpole_run(home / "runs")
    store = open_store((home / "dataset-store").as_uri())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADLAB_HOME", str(home))
        mp.setenv("GRADLAB_CONFIG", str(home / "config.toml"))
        plan = plan_recording("cartpole-tiny", goal_id="CartPole-v1", policy=str(checkpoint), episodes=10,
                              chunk_episodes=4, frames=False, settings=load_settings())
    results = [record_chunk(plan, i) for i in range(len(plan.chunks))]
    manifest = publish_dataset(store, plan, results, created_at="2026-01-01T00:00:00+00:00")
    return Recorded(checkpoint=checkpoint, store=store, cache=home / "cache", manifest=manifest, home=home)
