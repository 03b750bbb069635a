"""The ``gradlab`` provider: Bandit-v0 and tiny deterministic test environments, no dependencies.

Environments (``provider_args`` in brackets):

* ``Bandit-v0`` [n_arms=4]: a contextual bandit, vectorised in numpy. Observation: one-hot
  float32 (n_arms,) naming the rewarding arm; Discrete(n_arms); every episode is one step:
  native reward 1.0 when the action equals the observed arm else 0.0, ``terminated=True``,
  ``info["correct"]``.
* ``Corridor-v0`` [length=5 (an int, or a list indexed by lane modulo its length), end="truncate",
  reward=1.0, starts={}]: observation float32 (1,) = steps taken this episode; reward ``reward``
  per step; ``info["position"]``. At ``length`` steps it truncates (``end: truncate``, a native
  time limit), terminates (``terminate``), reports both flags (``both``) or goes on (``none``).
  ``starts`` names start states, each with its own length (``{"short": 2, "long": 7}``): an
  episode reset with ``options={"start": name}`` (``VectorEnv.set_next_start``) has that length,
  other episodes ``length``; the reset info of a named start holds ``"start"``.
* ``Lives-v0`` [lives=3, lose_every=4]: a scripted life counter. Observation float32 (2,) =
  (lives, steps); one life is lost every ``lose_every`` steps; terminates at 0 lives; reward 1.0
  per step; ``info["lives"]``; RAM (16 bytes): byte 0 = lives, byte 1 = steps mod 256.
* ``FailOn-v0`` [length=5, fail_episodes=[], fail_seeds=[]]: every episode terminates after
  ``length`` steps (int or per-lane list); the final step's ``info["success"]`` is False when the
  lane's episode index (0-based, counted per lane) is in ``fail_episodes`` or the episode's reset
  seed is in ``fail_seeds``, else True (None on earlier steps). Native reward 1.0 on a successful
  final step, else 0.0. For fail-fast evaluation tests.
* ``KeyDoor-v0`` [layout]: the hard-exploration key-door maze, :mod:`gradlab.envs.providers.maze`.

Every environment here captures and restores its lanes' state (``LaneBackend.capture_state``,
docs/ARCHITECTURE.md section 12a): the counters of the test envs, Bandit-v0's arm and lane RNG,
the maze's position and key.

All render (H, W, 3) uint8 frames. Actions are Discrete(2) for the test environments and do not
change their dynamics.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.envs.backend import EnvInfo, LaneBackend, Provider, args_problems
from gradlab.envs.lanes import build_lanes, parse_provider_args
from gradlab.envs.providers.maze import ACTION_MEANINGS as MAZE_ACTIONS
from gradlab.envs.providers.maze import KeyDoorArgs, KeyDoorEnv
from gradlab.envs.snapshot import Snapshot, generator_state, pack, set_generator_state, unpack
from gradlab.errors import NotFound

_RENDER_H, _RENDER_W = 16, 64


class _Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BanditArgs(_Args):
    n_arms: int = Field(default=4, ge=2, le=1024)


class CorridorArgs(_Args):
    length: int | list[int] = 5
    end: Literal["truncate", "terminate", "both", "none"] = "truncate"
    reward: float = 1.0
    starts: dict[str, int] = Field(default_factory=dict, description="Start state name -> episode length.")


class LivesArgs(_Args):
    lives: int = Field(default=3, ge=1, le=255)
    lose_every: int = Field(default=4, ge=1)


class FailOnArgs(_Args):
    length: int | list[int] = 5
    fail_episodes: list[int] = Field(default_factory=list)
    fail_seeds: list[int] = Field(default_factory=list)


def _lane_value(value: int | list[int], lane: int) -> int:
    return int(value[lane % len(value)]) if isinstance(value, list) else int(value)


def _bar_frame(frac: float) -> np.ndarray:
    frame = np.zeros((_RENDER_H, _RENDER_W, 3), dtype=np.uint8)
    frame[:, : max(1, int(round(min(max(frac, 0.0), 1.0) * _RENDER_W)))] = (40, 160, 255)
    return frame


class _TinyEnv:
    """Base of the single-lane test envs (gymnasium-style API, no gymnasium.Env overhead)."""

    def __init__(self, lane: int, render_mode: str | None):
        from gymnasium.spaces import Discrete

        self.lane = lane
        self.render_mode = render_mode
        self.action_space = Discrete(2)
        self.t = 0

    def render(self) -> np.ndarray:
        return _bar_frame(self.t / 32.0)

    def close(self) -> None:
        return None

    #: Attributes that make up a lane's state (ints, or None for FailOn-v0's seed).
    _state_attrs: tuple[str, ...] = ("t",)

    def capture_state(self) -> bytes:
        """The lane's counters as a snapshot (:mod:`gradlab.envs.snapshot`)."""
        return pack(Snapshot(f"gradlab:{type(self).__name__}",
                             meta={a: getattr(self, a) for a in self._state_attrs}))

    def restore_state(self, state: bytes) -> np.ndarray:
        """Assign a :meth:`capture_state` snapshot; returns the observation there."""
        meta = unpack(state, kind=f"gradlab:{type(self).__name__}").meta
        for a in self._state_attrs:
            setattr(self, a, meta[a])
        return self._obs()

    def state_problem(self) -> str | None:
        return None


class CorridorEnv(_TinyEnv):
    def __init__(self, args: CorridorArgs, lane: int = 0, render_mode: str | None = None):
        from gymnasium.spaces import Box

        super().__init__(lane, render_mode)
        self.default_length = _lane_value(args.length, lane)
        self.length = self.default_length
        self.end = args.end
        self.reward = float(args.reward)
        self.start_lengths = dict(args.starts)
        #: Named start states (None: the corridor has one start).
        self.starts = tuple(args.starts) or None
        self.observation_space = Box(0.0, np.inf, shape=(1,), dtype=np.float32)

    _state_attrs = ("t", "length")

    def _obs(self) -> np.ndarray:
        return np.array([self.t], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        self.t = 0
        start = (options or {}).get("start")
        if start is None:
            self.length = self.default_length
            return self._obs(), {"position": 0}
        if start not in self.start_lengths:
            raise ValueError(f"Corridor-v0: start: expected one of {sorted(self.start_lengths)}, found {start!r}")
        self.length = self.start_lengths[start]
        return self._obs(), {"position": 0, "start": start}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        at_end = self.t >= self.length
        terminated = at_end and self.end in ("terminate", "both")
        truncated = at_end and self.end in ("truncate", "both")
        return self._obs(), self.reward, terminated, truncated, {"position": self.t}

    def render(self) -> np.ndarray:
        return _bar_frame(self.t / max(self.length, 1))


class LivesEnv(_TinyEnv):
    def __init__(self, args: LivesArgs, lane: int = 0, render_mode: str | None = None):
        from gymnasium.spaces import Box

        super().__init__(lane, render_mode)
        self.start_lives = args.lives
        self.lose_every = args.lose_every
        self.lives = args.lives
        self.observation_space = Box(0.0, np.inf, shape=(2,), dtype=np.float32)

    _state_attrs = ("t", "lives")

    def _obs(self) -> np.ndarray:
        return np.array([self.lives, self.t], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        self.t = 0
        self.lives = self.start_lives
        return self._obs(), {"lives": self.lives}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        if self.t % self.lose_every == 0:
            self.lives -= 1
        return self._obs(), 1.0, self.lives <= 0, False, {"lives": self.lives}

    def get_ram(self) -> np.ndarray:
        ram = np.zeros(16, dtype=np.uint8)
        ram[0] = self.lives
        ram[1] = self.t % 256
        return ram

    def render(self) -> np.ndarray:
        return _bar_frame(self.lives / self.start_lives)


class FailOnEnv(_TinyEnv):
    def __init__(self, args: FailOnArgs, lane: int = 0, render_mode: str | None = None):
        from gymnasium.spaces import Box

        super().__init__(lane, render_mode)
        self.length = _lane_value(args.length, lane)
        self.fail_episodes = set(args.fail_episodes)
        self.fail_seeds = set(args.fail_seeds)
        self.episode = -1
        self.seed: int | None = None
        self.observation_space = Box(0.0, np.inf, shape=(1,), dtype=np.float32)

    _state_attrs = ("t", "episode", "seed")

    def _obs(self) -> np.ndarray:
        return np.array([self.t], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        self.t = 0
        self.episode += 1
        self.seed = seed
        return np.array([0.0], dtype=np.float32), {"success": None, "episode": self.episode}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        obs = np.array([self.t], dtype=np.float32)
        if self.t < self.length:
            return obs, 0.0, False, False, {"success": None, "episode": self.episode}
        fail = self.episode in self.fail_episodes or (self.seed is not None and self.seed in self.fail_seeds)
        return obs, 0.0 if fail else 1.0, True, False, {"success": not fail, "episode": self.episode}


def _make_lane(env_id: str, args: Any, *, lane: int, render_mode: str | None) -> Any:
    cls = {"Corridor-v0": CorridorEnv, "Lives-v0": LivesEnv, "FailOn-v0": FailOnEnv, "KeyDoor-v0": KeyDoorEnv}[env_id]
    return cls(args, lane=lane, render_mode=render_mode)


class BanditLanes(LaneBackend):
    """Bandit-v0 for N lanes in numpy, one ``numpy.random.Generator`` per lane."""

    def __init__(self, n: int, n_arms: int):
        from gymnasium.spaces import Box, Discrete

        self.num_envs = n
        self.n_arms = n_arms
        self.single_observation_space = Box(0.0, 1.0, shape=(n_arms,), dtype=np.float32)
        self.single_action_space = Discrete(n_arms)
        self._rngs = [np.random.default_rng() for _ in range(n)]
        self._arms = np.zeros(n, dtype=np.int64)
        self._eye = np.eye(n_arms, dtype=np.float32)

    def reset_lanes(self, lanes: Sequence[int], seeds: Sequence[int | None]) -> tuple[list[np.ndarray], list[dict]]:
        obs, infos = [], []
        for lane, seed in zip(lanes, seeds, strict=True):
            if seed is not None:
                self._rngs[lane] = np.random.default_rng(seed)
            self._arms[lane] = self._rngs[lane].integers(self.n_arms)
            obs.append(self._eye[self._arms[lane]].copy())
            infos.append({})
        return obs, infos

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        correct = np.asarray(actions).reshape(self.num_envs) == self._arms
        obs = self._eye[self._arms]
        reward = correct.astype(np.float64)
        done = np.ones(self.num_envs, dtype=bool)
        return obs, reward, done, ~done, [{"correct": bool(c)} for c in correct.tolist()]

    def state_problem(self) -> str | None:
        return None

    def capture_state(self, lane: int) -> bytes:
        """The lane's rewarding arm and RNG as a snapshot."""
        return pack(Snapshot("gradlab:Bandit-v0", meta={"arm": int(self._arms[lane]), "n_arms": self.n_arms,
                                                        "rng": generator_state(self._rngs[lane])}))

    def restore_state(self, lane: int, state: bytes) -> np.ndarray:
        from gradlab.errors import IntegrityError

        meta = unpack(state, kind="gradlab:Bandit-v0").meta
        if meta["n_arms"] != self.n_arms:
            raise IntegrityError(f"provider state: a Bandit-v0 snapshot of {meta['n_arms']} arms, this env has {self.n_arms}")
        self._arms[lane] = meta["arm"]
        self._rngs[lane] = np.random.default_rng()
        set_generator_state(self._rngs[lane], meta["rng"])
        return self._eye[self._arms[lane]].copy()

    def render(self) -> list[np.ndarray]:
        frames = []
        for arm in self._arms.tolist():
            frame = np.zeros((_RENDER_H, _RENDER_H * self.n_arms, 3), dtype=np.uint8)
            frame[:, arm * _RENDER_H:(arm + 1) * _RENDER_H] = (255, 200, 40)
            frames.append(frame)
        return frames


_ENVS: dict[str, type[BaseModel]] = {
    "Bandit-v0": BanditArgs, "Corridor-v0": CorridorArgs, "Lives-v0": LivesArgs, "FailOn-v0": FailOnArgs,
    "KeyDoor-v0": KeyDoorArgs,
}


def _extra(env_id: str, args: _Args) -> dict[str, Any]:
    if env_id == "Lives-v0":
        return {"ram_bytes": 16}
    if env_id in ("Corridor-v0", "KeyDoor-v0") and args.starts:  # type: ignore[attr-defined]
        return {"starts": {k: list(v) if isinstance(v, tuple) else v
                           for k, v in args.starts.items()}}  # type: ignore[attr-defined]
    return {}


class BuiltinProvider(Provider):
    name = "gradlab"
    package = None
    default_vectorization = "sync"

    def availability(self) -> tuple[bool, str]:
        return True, ""

    def env_ids(self) -> list[str]:
        return list(_ENVS)

    def _args(self, spec: EnvironmentSpec) -> Any:
        model = _ENVS.get(spec.env_id)
        if model is None:
            raise NotFound(f"provider 'gradlab' has no environment '{spec.env_id}'; it has {', '.join(_ENVS)}")
        return parse_provider_args(model, spec)

    def check(self, spec: EnvironmentSpec) -> list[tuple[str, str]]:
        model = _ENVS.get(spec.env_id)
        if model is None:
            import difflib

            hint = difflib.get_close_matches(spec.env_id, list(_ENVS), n=1)
            return [("env_id", f"provider 'gradlab' has no environment '{spec.env_id}'"
                     + (f" (did you mean {hint[0]}?)" if hint else f"; it has {', '.join(_ENVS)}"))]
        return args_problems(model, spec)

    def make_backend(self, spec: EnvironmentSpec, *, render_mode: str | None) -> LaneBackend:
        args = self._args(spec)
        if spec.env_id == "Bandit-v0":
            return BanditLanes(spec.n_envs, args.n_arms)  # type: ignore[attr-defined]
        factory = functools.partial(_make_lane, spec.env_id, args)
        return build_lanes(factory, spec, default="sync", render_mode=render_mode, name=spec.env_id)

    def describe(self, spec: EnvironmentSpec) -> EnvInfo:
        args = self._args(spec)
        if spec.env_id == "Bandit-v0":
            lanes: Any = BanditLanes(1, args.n_arms)  # type: ignore[attr-defined]
            obs_space, act_space = lanes.single_observation_space, lanes.single_action_space
            meanings = [f"ARM_{i}" for i in range(args.n_arms)]  # type: ignore[attr-defined]
            render_shape = (_RENDER_H, _RENDER_H * args.n_arms, 3)  # type: ignore[attr-defined]
            native_max = 1
        else:
            env = _make_lane(spec.env_id, args, lane=0, render_mode=None)
            obs_space, act_space = env.observation_space, env.action_space
            meanings = MAZE_ACTIONS if spec.env_id == "KeyDoor-v0" else ["NOOP", "NOOP_2"]
            render_shape = tuple(env.render().shape) if spec.env_id == "KeyDoor-v0" else (_RENDER_H, _RENDER_W, 3)
            native_max = env.length if isinstance(env, CorridorEnv) and args.end == "truncate" else None  # type: ignore[attr-defined]
        return EnvInfo(provider=self.name, env_id=spec.env_id, observation_space=str(obs_space),
                       action_space=str(act_space), obs_shape=tuple(obs_space.shape),
                       obs_dtype=str(obs_space.dtype), n_actions=int(act_space.n), action_meanings=meanings,
                       render_shape=render_shape, native_max_steps=native_max, version=self.version(),
                       extra=_extra(spec.env_id, args))


provider = BuiltinProvider()
