"""A backend's typed config, checked where the recipe alone can tell before any compute is spent.

Every backend calls :func:`validate_backend_config` first in its ``setup``: the recipe contract
(:class:`gradlab.contracts.recipe.Backend`) has checked each key and type; these are the checks
that need the env's lane count too, which SB3 would only make once training had started.
"""

from __future__ import annotations

from gradlab.contracts.recipe import A2CConfig, PPOConfig, RecipeTrain
from gradlab.errors import ConfigError


def validate_backend_config(train: RecipeTrain, n_envs: int) -> PPOConfig | A2CConfig:
    """The backend's typed config, with the checks SB3 would only make after compute starts.

    Args:
        train: the recipe's ``train`` section (``backend.id`` and ``backend.config``).
        n_envs: lanes of the env the backend trains on.

    Returns:
        The config as its backend's model (:class:`PPOConfig`, its subclass
        :class:`~gradlab.contracts.recipe.GradlabPPOConfig`, or :class:`A2CConfig`).

    Raises:
        ConfigError: naming ``train.backend.config.<key>``, what was expected and what was found.
    """
    cfg = train.backend.typed_config()
    problems = []
    rollout = cfg.n_steps * n_envs
    if rollout < 2:
        problems.append(f"train.backend.config.n_steps: n_steps * n_envs must be > 1, found {cfg.n_steps} * {n_envs}")
    if isinstance(cfg, PPOConfig):
        if cfg.batch_size > rollout:
            problems.append(f"train.backend.config.batch_size: expected at most n_steps * n_envs = {rollout}, "
                            f"found {cfg.batch_size}")
        if cfg.normalize_advantage and cfg.batch_size < 2:
            problems.append("train.backend.config.batch_size: expected > 1 with normalize_advantage, found 1")
    if problems:
        raise ConfigError("\n".join(problems))
    return cfg

