"""``gradlab.ppo``'s lane state and normalisation: what a checkpoint needs beyond weights and optimizer.

Two pieces, both saved in the same files, the same formats and with the same verification as
``sb3.ppo``'s (docs/ARCHITECTURE.md section 6), so a resumed run continues the same episodes and
evaluation, the player and export read either backend's checkpoint the same way:

* **Lanes** (:func:`save_lanes`, :func:`restore_lanes`): the vector env's state as plain data
  (``lanes.json`` + ``lanes.npz``, :mod:`gradlab.learn.lane_state`: every lane's gymnasium env
  and wrappers with their RNG streams, the task program's per-lane step counts and episode
  returns) and the observations the next rollout starts from (``last_obs.npy``, as the network
  sees them, i.e. normalised when observations are). Nothing is unpickled: the JSON and arrays
  are assigned into a freshly built env of the same spec.
* **Normalisation** (:class:`Normaliser`): stable-baselines3's ``VecNormalize`` semantics over
  gradlab's vector env, its statistics in ``resume/vecnormalize.json`` (the JSON ``sb3.ppo``
  writes) and the observation statistics in the weights-only policy (``gradlab.obs_rms.*``
  tensors + ``obs_normalization`` in ``policy_spec.json``), which evaluation and the player
  apply frozen.

Every file is listed with its sha256 in the checkpoint manifest like the rest of ``resume/``
(the learner verifies the whole folder before :meth:`PPOBackend.restore` reads it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.errors import ContractViolation
from gradlab.learn.resume_state import load_vecnormalize_state, vecnormalize_state

__all__ = ["LAST_OBS_FILE", "VECNORMALIZE_FILE", "Normaliser", "read_last_obs", "restore_lanes", "save_lanes"]

LAST_OBS_FILE = "last_obs.npy"
VECNORMALIZE_FILE = "vecnormalize.json"
CLIP_REWARD = 10.0
"""Bound of a normalised reward: ``VecNormalize``'s default ``clip_reward``, which ``sb3.ppo`` uses too."""
EPSILON = 1e-8
"""``VecNormalize``'s default ``epsilon`` in ``x / sqrt(var + epsilon)``."""


class Normaliser:
    """Running observation and reward normalisation with ``VecNormalize``'s rules, for a gradlab vector env.

    stable-baselines3 2.x ``VecNormalize`` (``common/vec_env/vec_normalize.py``), step by step:

    * observations: the running mean/var (SB3's own ``RunningMeanStd``: Chan et al.'s parallel
      variance update over the N lanes of one step, float64, initial count 1e-4) is updated with the step's observations (after the
      same-step autoreset, so a lane that ended contributes its next episode's first observation),
      then ``clip((obs - mean) / sqrt(var + 1e-8), -clip_obs, clip_obs)`` as float32; a reset
      updates them with the first observations;
    * rewards: the discounted return ``R = gamma * R + r`` per lane updates a scalar running
      variance, the reward is ``clip(r / sqrt(var + 1e-8), -10, 10)`` as float32, and ``R`` is
      set to 0 in every lane whose episode ended (terminated or truncated);
    * a truncated lane's true final observation is normalised with the statistics after the
      step's update (:meth:`normalize_obs`), as ``VecNormalize`` normalises
      ``infos[i]["terminal_observation"]``.

    The attributes have ``VecNormalize``'s names, so one JSON writer and reader
    (``vecnormalize_state``, ``load_vecnormalize_state`` in :mod:`gradlab.learn.resume_state`)
    serve both backends; unlike ``VecNormalize``, ``obs_rms`` exists even when only rewards are
    normalised (it then stays at its initial values, is not applied, and is written as null like
    ``sb3.ppo``'s).

    Attributes:
        obs_rms: ``RunningMeanStd`` of shape obs_shape. ret_rms: ``RunningMeanStd`` of shape ().
        returns: (N,) float64, each lane's discounted return so far.
        norm_obs, norm_reward: what is normalised. clip_obs, clip_reward, gamma, epsilon: constants.
    """

    def __init__(self, n_envs: int, obs_shape: tuple[int, ...], *, norm_obs: bool, norm_reward: bool,
                 clip_obs: float, gamma: float, clip_reward: float = CLIP_REWARD, epsilon: float = EPSILON):
        from stable_baselines3.common.running_mean_std import RunningMeanStd

        self.obs_rms = RunningMeanStd(shape=tuple(obs_shape))
        self.ret_rms = RunningMeanStd(shape=())
        self.returns = np.zeros(n_envs)
        self.norm_obs, self.norm_reward = bool(norm_obs), bool(norm_reward)
        self.clip_obs, self.clip_reward = float(clip_obs), float(clip_reward)
        self.gamma, self.epsilon = float(gamma), float(epsilon)

    def normalize_obs(self, obs: np.ndarray) -> np.ndarray:
        """(B, *obs_shape) → float32 normalised with the current statistics (not updated); as is without ``norm_obs``."""
        if not self.norm_obs:
            return obs
        mean, var = self.obs_rms.mean, self.obs_rms.var
        return np.clip((obs - mean) / np.sqrt(var + self.epsilon), -self.clip_obs, self.clip_obs).astype(np.float32)

    def reset(self, obs: np.ndarray) -> np.ndarray:
        """After every lane was reset: zero the returns, update with ``obs`` (N, *obs_shape); the normalised obs."""
        self.returns = np.zeros(self.returns.shape[0])
        if self.norm_obs:
            self.obs_rms.update(obs)
        return self.normalize_obs(obs)

    def step(self, obs: np.ndarray, reward: np.ndarray, done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One env step: update the statistics and normalise.

        Args:
            obs: (N, *obs_shape), after the same-step autoreset.
            reward: (N,) the step's (shaped) reward.
            done: (N,) bool, terminated or truncated.

        Returns:
            (normalised obs (N, *obs_shape) float32 (as is without ``norm_obs``), reward (N,) float32).
        """
        if self.norm_obs:
            self.obs_rms.update(obs)
        out = self.normalize_obs(obs)
        self.returns = self.returns * self.gamma + reward
        self.ret_rms.update(self.returns)
        r = np.asarray(reward, dtype=np.float64)
        if self.norm_reward:
            r = np.clip(r / np.sqrt(self.ret_rms.var + self.epsilon), -self.clip_reward, self.clip_reward)
        self.returns[done] = 0
        return out, r.astype(np.float32)

    def state(self) -> dict[str, Any]:
        """``vecnormalize.json``'s body (``sb3.ppo``'s format)."""
        return vecnormalize_state(self)

    def load(self, data: dict[str, Any], where: Path) -> None:
        """Set the statistics and returns from ``vecnormalize.json``'s body.

        Raises:
            ContractViolation: naming ``where``: a key is missing, an array has another shape, or
                the file was written with other settings (norm_obs, norm_reward, clip, gamma, epsilon).
        """
        if not isinstance(data, dict):
            raise ContractViolation(f"{where}: expected a JSON object, found {type(data).__name__}")
        for key, own in (("norm_obs", self.norm_obs), ("norm_reward", self.norm_reward), ("clip_obs", self.clip_obs),
                         ("clip_reward", self.clip_reward), ("gamma", self.gamma), ("epsilon", self.epsilon)):
            if key not in data or data[key] != own:
                raise ContractViolation(f"{where}: {key} expected {own} (this recipe), found {data.get(key, 'none')}")
        shapes = {"obs_rms": self.obs_rms.mean.shape, "ret_rms": ()} if self.norm_obs else {"ret_rms": ()}
        try:
            for name, shape in shapes.items():
                for part in ("mean", "var"):
                    found = np.shape(data[name][part])
                    if found != shape:
                        raise ContractViolation(f"{where}: {name}.{part}: shape expected {shape}, found {found}")
            if np.shape(data["returns"]) != self.returns.shape:
                raise ContractViolation(f"{where}: returns: shape expected {self.returns.shape}, "
                                        f"found {np.shape(data['returns'])}")
            load_vecnormalize_state(self, data)
        except (KeyError, TypeError, ValueError) as e:
            raise ContractViolation(f"{where}: malformed normalisation statistics ({type(e).__name__}: {e})") from None

    def load_observation_statistics(self, data: dict[str, Any], where: Path) -> None:
        """Take the observation statistics of another run's ``vecnormalize.json`` (a warm start's parent).

        A parent that did not normalise observations leaves them as they are.

        Raises:
            ContractViolation: naming ``where``: the statistics have another shape or are malformed.
        """
        if not isinstance(data, dict) or not data.get("norm_obs"):
            return
        try:
            mean = np.asarray(data["obs_rms"]["mean"], dtype=np.float64)
            var = np.asarray(data["obs_rms"]["var"], dtype=np.float64)
            count = float(data["obs_rms"]["count"])
        except (KeyError, TypeError, ValueError) as e:
            raise ContractViolation(f"{where}: malformed observation statistics ({type(e).__name__}: {e})") from None
        if mean.shape != self.obs_rms.mean.shape or var.shape != mean.shape:
            raise ContractViolation(f"{where}: obs_rms: shape expected {self.obs_rms.mean.shape}, found {mean.shape}")
        self.obs_rms.mean, self.obs_rms.var, self.obs_rms.count = mean, var, count


def save_lanes(resume: Path, venv: Any, obs: np.ndarray) -> str | None:
    """Write ``lanes.json``, ``lanes.npz`` and ``last_obs.npy`` into ``resume``.

    Args:
        venv: the gradlab ``VectorEnv`` the run steps.
        obs: (N, *obs_shape), the observations the next rollout starts from, as the network sees them.

    Returns:
        None when saved, else why the env's state is not plain data (nothing written; a resumed
        run then resets its lanes).
    """
    from gradlab.learn import lane_state

    if not lane_state.save(resume, venv):
        return lane_state.unsupported_reason(venv) or "not plain data"
    np.save(Path(resume) / LAST_OBS_FILE, np.ascontiguousarray(obs), allow_pickle=False)
    return None


def read_last_obs(resume: Path, *, n_envs: int, obs_shape: tuple[int, ...]) -> np.ndarray:
    """``last_obs.npy`` of a checkpoint, checked against the run's lanes (read with ``allow_pickle=False``).

    Returns:
        (n_envs, *obs_shape), numeric, in the dtype it was saved in (the env's, or float32 when normalised).

    Raises:
        ContractViolation: naming the file: missing, unreadable, not numeric, or of another shape.
    """
    path = Path(resume) / LAST_OBS_FILE
    try:
        obs = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ContractViolation(f"{path}: not readable lane observations: {e}") from None
    expected = (n_envs, *obs_shape)
    if not isinstance(obs, np.ndarray) or obs.shape != expected or obs.dtype.kind not in "biuf":
        found = f"{obs.shape} {obs.dtype}" if isinstance(obs, np.ndarray) else type(obs).__name__
        raise ContractViolation(f"{path}: expected numeric observations of shape {expected}, found {found}")
    return obs


def restore_lanes(resume: Path, venv: Any, *, obs_shape: tuple[int, ...]) -> np.ndarray:
    """Assign the saved lane state into a freshly built ``venv``; returns the saved observations.

    ``last_obs.npy`` is checked before anything is assigned, and :func:`gradlab.learn.lane_state.restore`
    assigns nothing unless every saved path fits.

    Raises:
        ContractViolation: naming the file (``lanes.json``, ``lanes.npz`` or ``last_obs.npy``) that is
            malformed or does not fit this run's env.
    """
    from gradlab.learn import lane_state

    obs = read_last_obs(resume, n_envs=venv.num_envs, obs_shape=obs_shape)
    lane_state.restore(resume, venv)
    return obs


def read_required_json(path: Path, why: str) -> Any:
    """The JSON of a resume file the recipe needs (``why``: what in the recipe needs it).

    Raises:
        ContractViolation: naming ``path``: missing, or not JSON.
    """
    if not path.is_file():
        raise ContractViolation(f"{path}: missing, but {why}")
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ContractViolation(f"{path}: not JSON ({e})") from None
