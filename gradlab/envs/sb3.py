"""A stable-baselines3 ``VecEnv`` over a gradlab :class:`~gradlab.envs.vector.VectorEnv`.

SB3's conventions, mapped exactly:

* ``dones = terminated | truncated``; SB3's own autoreset convention (``obs`` already the next
  episode's first observation) is what gradlab's vector env does anyway.
* ``infos[i]["terminal_observation"]``: the true final observation of the episode that ended.
* ``infos[i]["TimeLimit.truncated"] = truncated and not terminated``: SB3 bootstraps from the
  terminal observation only then (``OnPolicyAlgorithm.collect_rollouts``).
* ``infos[i]["episode"] = {"r": shaped return, "l": length}`` (what SB3's ``Monitor`` writes, so
  ``ep_info_buffer`` works) and ``infos[i]["gradlab_episode"]`` = ``EpisodeRecord.as_json()``.
* Rewards are the task program's shaped rewards, float32.

This module imports stable_baselines3 at import time: import it only where SB3 is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

from gradlab.envs.vector import VectorEnv


class SB3VecEnv(VecEnv):
    """Adapter: ``SB3VecEnv(make_vector_env(spec, seed=...))``.

    Args:
        venv: the gradlab vector env (owned: ``close()`` closes it).
    """

    def __init__(self, venv: VectorEnv):
        self.venv = venv
        self.render_mode = None
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
        self._actions: np.ndarray | None = None
        #: Every EpisodeRecord finished since the last :meth:`pop_episodes`.
        self.episodes: list[Any] = []

    def reset(self) -> VecEnvObs:
        for lane, seed in enumerate(self._seeds):
            if seed is not None:
                self.venv.set_next_seed(lane, int(seed))
        self._reset_seeds()
        self._reset_options()
        return self.venv.reset()

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions)

    def step_wait(self) -> VecEnvStepReturn:
        if self._actions is None:
            raise RuntimeError("step_wait() called before step_async()")
        res = self.venv.step(self._actions)
        self._actions = None
        dones = res.terminated | res.truncated
        infos = res.infos
        for ep in res.episodes:
            lane = ep.lane
            info = infos[lane]
            info["terminal_observation"] = res.final_obs[lane]
            info["TimeLimit.truncated"] = bool(res.truncated[lane] and not res.terminated[lane])
            info["episode"] = {"r": ep.return_, "l": ep.length}
            self.episodes.append(ep)
        return res.obs, res.reward, dones, infos

    def pop_episodes(self) -> list[Any]:
        """The EpisodeRecords finished since the last call (and forget them)."""
        out, self.episodes = self.episodes, []
        return out

    def close(self) -> None:
        self.venv.close()

    def get_images(self) -> Sequence[np.ndarray | None]:
        return self.venv.render()

    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        if seed is None:
            return [None] * self.num_envs
        self._seeds = [seed + i for i in range(self.num_envs)]
        return self._seeds

    # -- attribute plumbing: lanes are not gymnasium envs SB3 can reach into ----------------------
    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        n = len(self._get_indices(indices))
        if attr_name == "render_mode":
            return [None] * n
        raise AttributeError(f"gradlab lanes do not expose attribute '{attr_name}' to SB3")

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        raise AttributeError(f"gradlab lanes do not accept attribute '{attr_name}' from SB3")

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        raise AttributeError(f"gradlab lanes do not expose method '{method_name}' to SB3")

    def env_is_wrapped(self, wrapper_class: type, indices: VecEnvIndices = None) -> list[bool]:
        return [False] * len(self._get_indices(indices))
