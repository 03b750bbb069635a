"""The stable-baselines3 constructor arguments of a recipe, shared by both PPO backends.

``sb3.ppo`` / ``sb3.a2c`` train the SB3 model built from these arguments; ``gradlab.ppo`` builds
the same model over its spaces only to write ``policy.zip``. One source means the zips of the same
recipe record the same hyperparameters and schedules (docs/ARCHITECTURE.md section 6), so plain
SB3 that loads either and calls ``.learn()`` continues with the recipe's schedules.
"""

from __future__ import annotations

from typing import Any

from gradlab.learn.schedules import schedule_fn


def sb3_policy_kwargs(policy_model: Any, *, nature_cnn: bool) -> dict[str, Any]:
    """SB3's ``policy_kwargs`` of a recipe's :class:`~gradlab.contracts.recipe.PolicyModel`.

    Returns:
        ``net_arch``, ``activation_fn`` (``torch.nn.Tanh`` / ``ReLU``), ``ortho_init``,
        ``share_features_extractor``, ``features_extractor_class`` (``NatureCNN`` with its
        ``features_dim`` when ``nature_cnn``, else ``FlattenExtractor``).
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
