"""What the search backends (``gradlab.jerk``, ``gradlab.go_explore``) share: the Backend
protocol's plumbing that has nothing to do with the search itself (docs/ARCHITECTURE.md section
12a). Each search keeps its own state; this class keeps the step count, the episode and rollout
statistics, the vector env and its lifetime, and reads a search checkpoint's resume state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gradlab.contracts.run_spec import InitFrom, RunSpec
from gradlab.errors import ConfigError, ContractViolation
from gradlab.learn.stats import EpisodeStats, RolloutStats

#: The search state file inside a checkpoint's resume folder.
STATE_FILE = "search.json"
#: Provider state blobs (sha256-named) inside a checkpoint's resume folder.
STATES_DIR = "states"


class SearchBackend:
    """Base of the search backends; subclasses set ``backend_id`` and ``algorithm``."""

    backend_id: str = ""
    algorithm: str = ""

    def __init__(self, backend_id: str):
        if backend_id != self.backend_id:
            raise ConfigError(f"train.backend.id: {type(self).__name__} implements {self.backend_id}, "
                              f"found {backend_id!r}")
        self.id = backend_id
        self.spec: RunSpec | None = None
        self.episodes = EpisodeStats()
        self.rollout = RolloutStats()
        self.venv: Any = None
        self._steps = 0

    @property
    def num_timesteps(self) -> int:
        return self._steps

    @staticmethod
    def make_env(spec: RunSpec) -> Any:
        from gradlab.envs.vector import make_vector_env

        return make_vector_env(spec.environment, seed=spec.seed)

    def discrete_actions(self, spec: RunSpec, venv: Any) -> int:
        """The number of actions of a discrete action space.

        Raises:
            ConfigError: the env's action space is not discrete (a search enumerates actions).
        """
        from gymnasium.spaces import Discrete

        if not isinstance(venv.single_action_space, Discrete):
            raise ConfigError(f"train.backend.id: {self.backend_id} needs a discrete action space, "
                              f"{spec.environment.provider}:{spec.environment.env_id} has {venv.single_action_space}")
        return int(venv.single_action_space.n)

    def read_state(self, resume: Path, state_format: str) -> dict[str, Any]:
        """The search state saved in a checkpoint's resume folder.

        Raises:
            ContractViolation: the file is missing or of another format.
        """
        path = resume / STATE_FILE
        if not path.is_file():
            raise ContractViolation(f"{path}: missing (not a {self.backend_id} checkpoint)")
        state = json.loads(path.read_text())
        if state.get("format") != state_format:
            raise ContractViolation(f"{path}: expected format {state_format}, found {state.get('format')!r}")
        return state

    def rollout_metrics(self) -> dict[str, float]:
        return {**self.rollout.metrics(), **self.episodes.metrics()}

    def warm_start(self, init: InitFrom) -> None:
        raise ConfigError(f"init_from: {self.backend_id} searches with its own state, not from a parent's weights")

    def close(self) -> None:
        if self.venv is not None:
            self.venv.close()
            self.venv = None
