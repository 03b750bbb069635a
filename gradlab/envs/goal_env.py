"""A goal as a gymnasium environment: ``make_env(GOAL)`` and ``make_vector_env(GOAL, n)``.

Both wrap gradlab's own :class:`~gradlab.envs.vector.VectorEnv`, so an episode is exactly what
training and evaluation see: the goal's provider, preprocessing and task program (signals,
events, termination, shaped reward); success and failure terminate, timeouts truncate
(docs/ARCHITECTURE.md section 4).

* :class:`GoalEnv` is a ``gymnasium.Env`` over one lane. gradlab resets a lane in the step that
  ended its episode; the env returns that step's true final observation and keeps the next
  episode's first observation for the following ``reset()`` without a seed (a ``reset(seed=s)``
  resets anew with ``s``).
* :class:`GoalVectorEnv` is a ``gymnasium.vector.VectorEnv`` over N lanes with
  ``metadata["autoreset_mode"] = AutoresetMode.SAME_STEP``, gymnasium 1.x's contract for what
  gradlab does: a lane whose episode ended this step already holds the next episode's first
  observation; the true final observation and info are in ``infos["final_obs"]`` /
  ``infos["final_info"]`` (masks ``_final_obs`` / ``_final_info``). gradlab's episode record is in
  ``infos["final_info"]["gradlab_episode"]``.

Infos keep one type per key for the whole run, as gymnasium's batching needs (it types each key's
array by the first lane that reports it): the episode record is
:meth:`~gradlab.envs.records.EpisodeRecord.as_gym_info`, whose ``seed`` is the seed the episode's
reset used, or ``-1`` (``NO_SEED``) when the lane continued its own RNG stream (every episode
after a lane's first, unless ``reset(seed=...)`` named one), and whose ``start`` is ``""`` for the
default start.

Seeds: ``seed=s`` at construction (or the first ``reset(seed=s)``) gives lane ``i`` the seed
``s * 1024 + i`` as a gradlab training run with seed ``s`` does; ``reset(seed=[...])`` names each
lane's seed. Later episodes continue each lane's own RNG stream.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.contracts.goal import Goal
from gradlab.envs.vector import VectorEnv, training_lane_seeds
from gradlab.envs.vector import make_vector_env as _make_gradlab_vector_env
from gradlab.errors import ConfigError


def goal_environment(goal: str | Goal, *, split: str = "train", experiments_root: Path | None = None) -> EnvironmentSpec:
    """The environment contract of a goal (``split``: ``train`` or ``eval``, same env hash).

    Raises:
        NotFound: unknown goal. ConfigError: the goal's files are invalid or ``split`` is unknown.
    """
    if isinstance(goal, str):
        from gradlab.contracts.experiments import Experiments

        goal = Experiments(experiments_root).load_goal(goal)
    if split == "train":
        return goal.train.environment
    if split == "eval":
        return goal.eval_environment()
    raise ConfigError(f"split: expected 'train' or 'eval', found {split!r}")


def _lane_seeds(seed: int | list[int] | None, n: int) -> list[int] | None:
    if seed is None:
        return None
    if isinstance(seed, (list, tuple, np.ndarray)):
        if len(seed) != n:
            raise ConfigError(f"seed: expected {n} lane seeds, found {len(seed)}")
        seeds = [int(s) for s in seed]
        if any(s < 0 for s in seeds):
            raise ConfigError(f"seed: expected non-negative lane seeds, found {seeds}")
        return seeds
    return training_lane_seeds(int(seed), n)


class GoalVectorEnv(gym.vector.VectorEnv):
    """N lanes of a goal's environment as a gymnasium vector env (see the module docstring).

    Attributes:
        gradlab_env: the wrapped :class:`~gradlab.envs.vector.VectorEnv`.
        goal_env: the environment contract.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, spec: EnvironmentSpec, *, seed: int = 0, render_mode: str | None = None):
        self.goal_env = spec
        self.gradlab_env: VectorEnv = _make_gradlab_vector_env(spec, seed=seed, render_mode=render_mode)
        self.num_envs = self.gradlab_env.num_envs
        self.render_mode = render_mode
        self.single_observation_space = self.gradlab_env.single_observation_space
        self.single_action_space = self.gradlab_env.single_action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.metadata = dict(type(self).metadata)

    def reset(self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every lane. Returns ((N, *obs_shape) observations, vector infos)."""
        seeds = _lane_seeds(seed, self.num_envs)
        if seeds is not None:
            for lane, s in enumerate(seeds):
                self.gradlab_env.set_next_seed(lane, s)
        obs = self.gradlab_env.reset()
        return obs, {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every lane: (obs, reward (N,) float32, terminated (N,) bool, truncated (N,) bool, infos).

        ``obs`` is (N, *obs_shape); a lane that ended this step already holds its next episode's
        first observation. ``infos`` is gymnasium's batched dict: each native info key as an (N,)
        array with its ``_key`` mask; for ended lanes ``infos["final_obs"]`` (N,) object array and
        ``infos["final_info"]["gradlab_episode"]``, the record's fields each an (N,) array of one
        dtype for the whole run (``seed`` int64, -1 when none; see the module docstring).
        """
        res = self.gradlab_env.step(np.asarray(actions))
        infos: dict[str, Any] = {}
        ended = {ep.lane: ep for ep in res.episodes}
        for lane, info in enumerate(res.infos):
            info = dict(info or {})
            if lane in ended:
                info["gradlab_episode"] = ended[lane].as_gym_info()
                infos = self._add_info(infos, {"final_obs": res.final_obs[lane], "final_info": info}, lane)
            else:
                infos = self._add_info(infos, info, lane)
        return (res.obs, np.asarray(res.reward, dtype=np.float32), np.asarray(res.terminated, dtype=np.bool_),
                np.asarray(res.truncated, dtype=np.bool_), infos)

    def render(self) -> tuple[np.ndarray, ...] | None:
        """One (H, W, 3) uint8 frame per lane (``render_mode="rgb_array"``), else None."""
        if self.render_mode != "rgb_array":
            return None
        return tuple(self.gradlab_env.render())

    def close_extras(self, **kwargs: Any) -> None:
        self.gradlab_env.close()


class GoalEnv(gym.Env):
    """One lane of a goal's environment as a ``gymnasium.Env`` (see the module docstring)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, spec: EnvironmentSpec, *, seed: int = 0, render_mode: str | None = None):
        self.goal_env = spec.model_copy(update={"n_envs": 1})
        self.gradlab_env: VectorEnv = _make_gradlab_vector_env(self.goal_env, seed=seed, render_mode=render_mode)
        self.observation_space = self.gradlab_env.single_observation_space
        self.action_space = self.gradlab_env.single_action_space
        self.render_mode = render_mode
        self._next_obs: np.ndarray | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is None and self._next_obs is not None:
            obs, self._next_obs = self._next_obs, None
            return obs, {}
        if seed is not None:
            self.gradlab_env.set_next_seed(0, training_lane_seeds(int(seed), 1)[0])
        self._next_obs = None
        return self.gradlab_env.reset()[0], {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """One step: (obs, shaped reward, terminated, truncated, info).

        At an episode's end ``obs`` is the true final observation and
        ``info["gradlab_episode"]`` the record of :meth:`~gradlab.envs.records.EpisodeRecord.as_gym_info`
        (``seed`` -1 when none), so ``gymnasium.vector.SyncVectorEnv`` over these envs batches it.
        """
        if self.gradlab_env._discrete:
            batch = np.asarray([action], dtype=np.int64)
        else:
            batch = np.asarray(action)[None]
        res = self.gradlab_env.step(batch)
        info = dict(res.infos[0] or {})
        obs = res.obs[0]
        if res.episodes:
            info["gradlab_episode"] = res.episodes[0].as_gym_info()
            self._next_obs = obs.copy()
            obs = res.final_obs[0]
        return obs, float(res.reward[0]), bool(res.terminated[0]), bool(res.truncated[0]), info

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        return self.gradlab_env.render()[0]

    def close(self) -> None:
        self.gradlab_env.close()


def make_env(goal: str | Goal, *, seed: int = 0, render_mode: str | None = None, split: str = "train",
             experiments_root: Path | None = None) -> GoalEnv:
    """A goal's environment as a ``gymnasium.Env`` (one lane).

    Args:
        goal: a goal id under the experiments tree (``CartPole-v1``) or a :class:`Goal`.
        seed: first-reset seed base, as a gradlab run seed (lane seed ``seed * 1024``).
        render_mode: ``"rgb_array"`` or None.
        split: ``train`` (the training environment) or ``eval`` (the evaluation environment).

    Raises:
        NotFound: unknown goal or env id. ConfigError: invalid goal files or provider settings.
    """
    return GoalEnv(goal_environment(goal, split=split, experiments_root=experiments_root), seed=seed,
                   render_mode=render_mode)


def make_vector_env(goal: str | Goal, n: int | None = None, *, seed: int = 0, render_mode: str | None = None,
                    split: str = "train", experiments_root: Path | None = None) -> GoalVectorEnv:
    """A goal's environment as a ``gymnasium.vector.VectorEnv`` of ``n`` lanes (default: the goal's ``n_envs``).

    Lane ``i``'s first reset uses ``seed * 1024 + i`` (a gradlab run with seed ``seed``), so the
    episodes equal those of gradlab's own vector env built with the same seed.

    Raises:
        NotFound, ConfigError: as :func:`make_env`; ``n`` outside 1..1024.
    """
    spec = goal_environment(goal, split=split, experiments_root=experiments_root)
    if n is not None:
        if not 1 <= n <= 1024:
            raise ConfigError(f"n: expected 1..1024 lanes, found {n}")
        spec = spec.model_copy(update={"n_envs": int(n)})
    return GoalVectorEnv(spec, seed=seed, render_mode=render_mode)
