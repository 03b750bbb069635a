"""Weights-only rebuild of a Nature CNN policy on channel-last uint8 images (transpose + /255)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from gradlab.checkpoints.policy import Policy, PolicySpec, export_policy, save_policy_files
from gradlab.contracts.recipe import PolicyModel


class _Frames(gym.Env):
    observation_space = spaces.Box(0, 255, shape=(40, 40, 2), dtype=np.uint8)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.integers(0, 256, (40, 40, 2), dtype=np.uint8), {}

    def step(self, action):
        return self.np_random.integers(0, 256, (40, 40, 2), dtype=np.uint8), 0.0, False, False, {}


def test_nature_cnn_policy_matches_sb3_within_1e_6(tmp_path) -> None:
    from safetensors.torch import load_file
    from stable_baselines3 import PPO
    from stable_baselines3.common.torch_layers import NatureCNN
    from stable_baselines3.common.vec_env import DummyVecEnv, VecTransposeImage

    env = DummyVecEnv([_Frames])
    model = PPO("MlpPolicy", env, n_steps=8, batch_size=8, device="cpu", seed=1,
                policy_kwargs={"features_extractor_class": NatureCNN, "features_extractor_kwargs": {"features_dim": 64},
                               "net_arch": [], "activation_fn": torch.nn.ReLU})
    assert isinstance(model.env, VecTransposeImage)
    pm = PolicyModel(extractor="nature_cnn", net_arch=[], activation="relu", features_dim=64)
    tensors, spec = export_policy(model, backend_id="sb3.ppo", algorithm="ppo", policy_model=pm,
                                  env_observation_space=env.observation_space, transpose_image=True)
    save_policy_files(tmp_path, tensors, spec)
    policy = Policy(PolicySpec.model_validate_json((tmp_path / "policy_spec.json").read_bytes()),
                    load_file(str(tmp_path / "policy.safetensors")))
    assert policy.spec.extractor == "nature_cnn" and policy.spec.policy_observation_space.shape == [2, 40, 40]
    obs = np.random.default_rng(0).integers(0, 256, (5, 40, 40, 2), dtype=np.uint8)
    with torch.no_grad():
        chw = torch.as_tensor(obs.transpose(0, 3, 1, 2))
        expected = model.policy.get_distribution(chw).distribution.probs.numpy()
    got = policy.action_probs(obs)
    assert got.shape == (5, 3)
    assert np.abs(got - expected).max() <= 1e-6
