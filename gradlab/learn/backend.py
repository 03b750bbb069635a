"""What a training backend is (:class:`Backend`) and which ones there are (the registry).

The learner (:mod:`gradlab.learn.learner`) drives any backend through the same phases,
setup → (restore | warm_start) → begin → (collect → update → save)* → close, and never looks
inside one. Backends register here by id as ``"module:Class"`` strings that :func:`make_backend`
imports on demand, so this module imports no backend (none imports it either) and choosing
``sb3.ppo`` never imports ``gradlab.ppo``'s code. What backends share lives beside them:
:mod:`gradlab.learn.backend_config` (the config checks), :mod:`gradlab.learn.stats` (training
statistics), :mod:`gradlab.learn.resume_state` (RNG streams, normalisation statistics, the
policy tensors of ``resume/``) and :mod:`gradlab.learn.warm_start`.

Shipped backends: ``sb3.ppo`` and ``sb3.a2c`` (:class:`gradlab.learn.sb3.SB3Backend`) and
``gradlab.ppo`` (:class:`gradlab.learn.ppo.PPOBackend`); docs/ARCHITECTURE.md section 5. The search
backends ``gradlab.go_explore`` (:class:`gradlab.learn.go_explore.GoExploreBackend`) and
``gradlab.jerk`` (:class:`gradlab.learn.jerk.JerkBackend`) follow the same phases; section 12a.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Protocol

from gradlab.contracts.run_spec import InitFrom, RunSpec
from gradlab.errors import ConfigError
from gradlab.learn.stats import EpisodeStats, RolloutStats

BACKENDS: dict[str, str] = {
    "sb3.ppo": "gradlab.learn.sb3:SB3Backend",
    "sb3.a2c": "gradlab.learn.sb3:SB3Backend",
    "gradlab.ppo": "gradlab.learn.ppo:PPOBackend",
    "gradlab.go_explore": "gradlab.learn.go_explore:GoExploreBackend",
    "gradlab.jerk": "gradlab.learn.jerk:JerkBackend",
}
"""Registered backend ids (``train.backend.id``) → the class that implements them, as ``"module:Class"``."""


class Backend(Protocol):
    """One training algorithm, driven phase by phase by the learner (the learner owns the loop).

    A backend MUST:

    * be built as ``Class(backend_id)`` (:func:`make_backend`) and raise :class:`ConfigError`
      naming ``train.backend.id`` for an id it does not implement; building one does no work;
    * check its config first in :meth:`setup`, with
      :func:`gradlab.learn.backend_config.validate_backend_config` and its own checks, raising
      :class:`ConfigError` naming ``train.backend.config.<key>`` (or the recipe key at fault)
      before any compute is spent;
    * seed Python's, NumPy's global and torch's RNGs from ``spec.seed`` in :meth:`setup` and never
      re-seed the env's lanes (the env seeds them), so the same seed gives the same run;
    * save in :meth:`save` everything :meth:`restore` needs so that N steps straight equal k steps,
      a checkpoint, and a resume (parameters, optimizer state, counters, schedules' progress, every
      RNG stream, the episode windows, normalisation statistics, the lane state where it is plain
      data), with the checkpoint bundle's file names (``policy.zip``, ``policy.safetensors``,
      ``policy_spec.json``, ``resume/``) and SB3's tensor names;
    * read no pickle in :meth:`restore` or :meth:`warm_start`: JSON, npz with
      ``allow_pickle=False``, safetensors, or torch's weights-only loader
      (docs/ARCHITECTURE.md section 6);
    * report metrics only under registered names (METRICS.md): :meth:`update` under
      ``train/algorithm/{algorithm}/...``, :meth:`rollout_metrics` under ``train/reward/...``,
      ``train/episode/...`` and ``train/outcome/...``;
    * leave stopping to the learner: a backend reads no stop flag and installs no signal handler;
    * be safe to :meth:`close` at any point, also when :meth:`setup` never ran or failed.

    Attributes:
        id: the registered backend id (``train.backend.id``).
        algorithm: the ``{algorithm}`` metric segment (``ppo``, ``a2c``).
        spec: the run spec, after :meth:`setup`.
        episodes: rolling training-episode statistics (saved and restored with resume state).
        rollout: the last rollout's accumulators (``steps``: env steps over all lanes,
            ``env_seconds``: wall time inside the env's step), replaced by every :meth:`collect`.
    """

    id: str
    algorithm: str
    spec: RunSpec | None
    episodes: EpisodeStats
    rollout: RolloutStats

    @property
    def num_timesteps(self) -> int:
        """Env steps trained so far, over all lanes (after :meth:`restore`: the checkpoint's)."""
        ...

    @staticmethod
    def make_env(spec: RunSpec) -> Any:
        """The vector env to train on for ``spec`` (its lanes seeded from ``spec.seed``), the kind
        :meth:`setup` takes."""
        ...

    def setup(self, spec: RunSpec, venv: Any, *, device: str = "auto") -> None:
        """Build the model, optimizer and rollout storage over ``venv`` and seed the RNGs.

        Args:
            spec: the resolved run spec.
            venv: the env :meth:`make_env` gives (or a test's or benchmark's of the same kind).
            device: ``auto`` (the recipe's ``train.device``, then the backend's choice), ``cpu``,
                ``cuda``.

        Raises:
            ConfigError: an invalid config, naming the key.
        """
        ...

    def restore(self, checkpoint: Path) -> bool:
        """Continue from a checkpoint folder already verified against its manifest.

        Called after :meth:`setup` with the same spec, before :meth:`begin`.

        Returns:
            True when the lanes continue mid-episode from the saved lane state, False when
            :meth:`begin` must reset them.

        Raises:
            ContractViolation: the checkpoint is of another backend, its tensors do not fit, or a
                resume file this recipe needs is missing or malformed (naming the file).
        """
        ...

    def warm_start(self, init: InitFrom) -> None:
        """Start from a parent checkpoint's weights (``spec.init_from``) instead of from scratch.

        Called after :meth:`setup`, instead of :meth:`restore`. Counters, schedules and RNG streams
        start fresh, as in a new run; the parent is verified with
        :func:`gradlab.learn.warm_start.read_warm_start_parent`.

        Raises:
            IntegrityError: the parent fails verification or is not the recorded sha256.
            ContractViolation: the first tensor that is missing, extra or of another shape.
        """
        ...

    def begin(self, *, resumed: bool) -> None:
        """Make ready for the first :meth:`collect`: reset the lanes unless :meth:`restore` put
        them back mid-episode (``resumed`` says :meth:`restore` ran)."""
        ...

    def collect(self) -> bool:
        """One rollout of ``n_steps`` per lane, with its advantages, advancing :attr:`num_timesteps`
        by ``n_steps * n_envs`` and replacing :attr:`rollout`.

        Returns:
            True; False only when the rollout was aborted (the learner then ends the loop).
        """
        ...

    def update(self) -> dict[str, float]:
        """One update on the collected rollout.

        Returns:
            The algorithm's metrics, under registered ``train/algorithm/{algorithm}/...`` names.
        """
        ...

    def rollout_metrics(self) -> dict[str, float]:
        """The last rollout's reward statistics and the episode windows' metrics (registered names)."""
        ...

    def save(self, folder: Path) -> None:
        """Write the checkpoint's files into ``folder`` (it exists; ``resume/`` does not yet).

        ``policy.zip``, ``policy.safetensors``, ``policy_spec.json`` and ``resume/`` with what
        :meth:`restore` reads; nothing outside ``folder`` (the checkpoint writer hashes the folder
        and publishes it atomically).
        """
        ...

    def close(self) -> None:
        """Close the env; safe to call when :meth:`setup` never ran or failed."""
        ...


def registered_backends() -> list[str]:
    """Backend ids, in registry order, for tests parametrized over every backend (``sb3.*`` and ``gradlab.ppo``)."""
    return list(BACKENDS)


def make_backend(backend_id: str) -> Backend:
    """The backend object for ``train.backend.id``, its module imported now.

    Raises:
        ConfigError: an unknown id, naming ``train.backend.id``.
    """
    try:
        target = BACKENDS[backend_id]
    except KeyError:
        raise ConfigError(f"train.backend.id: expected one of {', '.join(BACKENDS)}, found {backend_id!r}") from None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(backend_id)
