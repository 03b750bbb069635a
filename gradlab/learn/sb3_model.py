"""The stable-baselines3 constructor arguments of a recipe, shared by both PPO backends.

``sb3.ppo`` / ``sb3.a2c`` train the SB3 model built from these arguments; ``gradlab.ppo`` builds
the same model over its spaces only to write ``policy.zip``. One source means the zips of the same
recipe record the same hyperparameters and schedules (docs/ARCHITECTURE.md section 6), so plain
SB3 that loads either and calls ``.learn()`` continues with the recipe's schedules.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gradlab.errors import ConfigError
from gradlab.learn.schedules import schedule_fn


def normalized_image_space(space: Any, clip: float) -> Any:
    """The space of ``space``'s frames after observation normalisation: float32, bounded by
    [-clip, clip], same shape. SB3's ``VecNormalize`` replaces an image space by this one (its
    GH #1214), so the network takes the normalised frames as they are (``normalize_images=False``:
    no 1/255, no transpose)."""
    from gymnasium import spaces

    return spaces.Box(low=-clip, high=clip, shape=tuple(space.shape), dtype=np.float32)


def normalizes_images(space: Any, normalize: Any) -> bool:
    """Whether the recipe's ``train.normalize`` normalises image frames (``space`` as the vector env
    gives them): per-pixel running mean and variance, as SB3's ``VecNormalize`` does.

    Raises:
        ConfigError: channel-last frames, (H, W, C): normalised frames are not transposed (they are
            no longer an image space), so the network would take their height for channels.
    """
    from stable_baselines3.common.preprocessing import is_image_space

    if not (normalize.observation and is_image_space(space, check_channels=False)):
        return False
    if int(np.argmin(space.shape)) != 0:  # SB3's VecTransposeImage rule: channels are the smallest dimension
        raise ConfigError(f"train.normalize.observation: normalised frames must be channel-first (C, H, W), found "
                          f"{tuple(space.shape)}: they are not transposed after normalisation (SB3's VecNormalize "
                          "rule), so the Nature CNN would read their height as channels")
    return True


def sb3_policy_kwargs(policy_model: Any, *, nature_cnn: bool, normalize_images: bool = True) -> dict[str, Any]:
    """SB3's ``policy_kwargs`` of a recipe's :class:`~gradlab.contracts.recipe.PolicyModel`.

    Returns:
        ``net_arch``, ``activation_fn`` (``torch.nn.Tanh`` / ``ReLU``), ``ortho_init``,
        ``share_features_extractor``, ``features_extractor_class`` (``NatureCNN`` with its
        ``features_dim`` when ``nature_cnn``, else ``FlattenExtractor``), and
        ``normalize_images=False`` when the frames are normalised already (``train.normalize.observation``
        of images: SB3 then neither scales them by 1/255 nor transposes them).
    """
    import torch
    from stable_baselines3.common.torch_layers import FlattenExtractor, NatureCNN

    kwargs: dict[str, Any] = dict(
        net_arch=policy_model.net_arch, activation_fn={"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[policy_model.activation],
        ortho_init=policy_model.ortho_init, share_features_extractor=policy_model.share_features_extractor,
    )
    if nature_cnn:
        kwargs.update(features_extractor_class=NatureCNN, features_extractor_kwargs={"features_dim": policy_model.features_dim})
    else:
        kwargs.update(features_extractor_class=FlattenExtractor)
    if not normalize_images:
        kwargs["normalize_images"] = False
    return kwargs


def sb3_algorithm_kwargs(cfg: Any) -> dict[str, Any]:
    """SB3's ``PPO`` / ``A2C`` keyword arguments of a backend config (``learning_rate`` and
    ``clip_range`` as schedules, ``ent_coef`` its value at progress 1.0).

    Args:
        cfg: a :class:`~gradlab.contracts.recipe.PPOConfig` (or its gradlab.ppo subclass) or
            :class:`~gradlab.contracts.recipe.A2CConfig`.
    """
    from gradlab.contracts.recipe import PPOConfig

    common: dict[str, Any] = dict(learning_rate=schedule_fn(cfg.learning_rate), n_steps=cfg.n_steps, gamma=cfg.gamma,
                                  gae_lambda=cfg.gae_lambda, ent_coef=schedule_fn(cfg.ent_coef)(1.0), vf_coef=cfg.vf_coef,
                                  max_grad_norm=cfg.max_grad_norm, normalize_advantage=cfg.normalize_advantage)
    if isinstance(cfg, PPOConfig):
        return dict(common, batch_size=cfg.batch_size, n_epochs=cfg.n_epochs, clip_range=schedule_fn(cfg.clip_range),
                    clip_range_vf=cfg.clip_range_vf, target_kl=cfg.target_kl)
    return dict(common, rms_prop_eps=cfg.rms_prop_eps, use_rms_prop=cfg.use_rms_prop)
