"""The ``ale`` provider: Atari 2600 games through ale-py's native C++ ``AtariVectorEnv``.

Conventions: env ids are plain game names (``Breakout``, ``MsPacman``; ``ms_pacman``,
``ALE/MsPacman-v5`` are accepted too). gradlab follows the **ALE v5** convention (Machado et al.
2018): frame skip 4 and sticky actions with probability 0.25, a 108,000-frame (27,000-step)
native time limit, no fire-on-reset, no life-loss termination and no reward clipping inside the
emulator. Every one of these is a field of ``preprocessing`` (``AtariPreprocessing``) or
``provider_args.use_fire_reset``, so it is part of ``environment_sha256``; a NoFrameskip-style
setup is ``frame_skip: 1, repeat_action_probability: 0``. Reward clipping and life loss are the
task program's job (``reward_clip``; a ``lives`` info signal with a ``decrease`` event).

``preprocessing`` → ``AtariVectorEnv``: frame_skip → frameskip, max_pool → maxpool, grayscale,
resize (H, W) → img_height/img_width (null = the native 210×160), frame_stack → stack_num,
repeat_action_probability, noop_max, full_action_space (always on under an ``action_profile``, whose
actions are indices of the full set). Lanes run on ale-py's thread pool
(``num_threads``; 0 = ale-py's choice).

Observations are channel-first uint8: (frame_stack, H, W) for grayscale, (frame_stack × 3, H, W)
for RGB. ``render()`` returns the newest frame of each lane's stack as (H, W, 3) RGB.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from gradlab.contracts.actions import ALE_BUTTONS, ale_action
from gradlab.contracts.environment import AtariPreprocessing, EnvironmentSpec
from gradlab.envs.backend import EnvInfo, LaneBackend, Provider, args_problems, seed32
from gradlab.envs.lanes import parse_provider_args
from gradlab.errors import NotFound

#: ALE v5 native episode limit in emulator frames (Machado et al. 2018, section 5).
MAX_FRAMES_PER_EPISODE = 108_000


class AleArgs(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    use_fire_reset: bool = False
    single_lanes: bool = Field(default=False, description=(
        "One ALEInterface per lane, stepped in-process, instead of the native vector env: slower, but "
        "lanes capture and restore their state (gradlab.envs.providers.ale_lane)."))


def rom_name(env_id: str) -> str:
    """``Breakout`` → ``breakout``, ``MsPacman`` / ``ALE/MsPacman-v5`` → ``ms_pacman``."""
    name = env_id.split("/")[-1]
    name = re.sub(r"-v\d+$", "", name)
    name = re.sub(r"NoFrameskip$", "", name)
    if "_" in name or name.islower():
        return name.lower()
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _camel(rom: str) -> str:
    return "".join(part.capitalize() for part in rom.split("_"))


class AleLanes(LaneBackend):
    """N Atari lanes in one ``AtariVectorEnv`` (NextStep autoreset, always reset explicitly)."""

    def __init__(self, rom: str, n: int, pre: AtariPreprocessing, args: AleArgs, num_threads: int | None):
        from ale_py.vector_env import AtariVectorEnv
        from gymnasium.spaces import Box, Discrete

        h, w = pre.resize if pre.resize is not None else (210, 160)
        self._make = lambda height, width, grayscale, stack: AtariVectorEnv(
            rom, n, num_threads=num_threads or 0, max_num_frames_per_episode=MAX_FRAMES_PER_EPISODE,
            repeat_action_probability=pre.repeat_action_probability, full_action_space=pre.full_action_space,
            autoreset_mode="NextStep", img_height=height, img_width=width, grayscale=grayscale,
            stack_num=stack, frameskip=pre.frame_skip, maxpool=pre.max_pool, noop_max=pre.noop_max,
            episodic_life=False, life_loss_info=False, reward_clipping=False, use_fire_reset=args.use_fire_reset,
        )
        self.env = self._make(h, w, pre.grayscale, pre.frame_stack)
        self._screen_env: Any = None
        self._screen: np.ndarray | None = None
        self.num_envs = n
        self._rgb = not pre.grayscale
        self._stack = pre.frame_stack
        self._hw = (h, w)
        channels = pre.frame_stack * (3 if self._rgb else 1)
        self.single_observation_space = Box(0, 255, shape=(channels, h, w), dtype=np.uint8)
        self.action_set = list(self.env.ale.get_action_set())
        self.single_action_space = Discrete(len(self.action_set))
        self._last_obs: np.ndarray | None = None
        self._all = np.ones(n, dtype=bool)

    def enable_screen(self) -> None:
        """Also keep the colour screen (210x160 RGB) of every lane, for :meth:`screen` (the player).

        A second ``AtariVectorEnv`` of the same game and settings, in colour at the emulator's size,
        is reset with the same seeds and sent the same actions: sticky actions and no-op starts draw
        from the seeded emulator, which colour and size do not touch, so it plays the same game.
        Call before the first reset.
        """
        if self._screen_env is None:
            self._screen_env = self._make(210, 160, False, 1)

    def screen(self) -> list[np.ndarray] | None:
        """(210, 160, 3) uint8 colour frame per lane after the last step or reset; None unless
        :meth:`enable_screen` was called."""
        if self._screen is None:
            return None
        return [np.ascontiguousarray(frame[-1]) for frame in self._screen]

    def _layout(self, obs: np.ndarray) -> np.ndarray:
        if not self._rgb:
            return obs
        n = obs.shape[0]
        return np.ascontiguousarray(obs.transpose(0, 1, 4, 2, 3)).reshape(n, self._stack * 3, *self._hw)

    @staticmethod
    def _infos(info: dict[str, Any], n: int) -> list[dict]:
        keys = [k for k in info if k != "env_id"]
        cols = [info[k].tolist() for k in keys]
        return [dict(zip(keys, row, strict=True)) for row in zip(*cols, strict=True)] if keys else [{} for _ in range(n)]

    def reset_lanes(self, lanes: Sequence[int], seeds: Sequence[int | None]) -> tuple[list[np.ndarray], list[dict]]:
        mask = np.zeros(self.num_envs, dtype=bool)
        mask[list(lanes)] = True
        # ale-py seeds with int32; -1 = continue the lane's own RNG.
        seed_arr = np.array([-1 if s is None else seed32(s) for s in seeds], dtype=np.int64)
        options = None if mask.all() else {"reset_mask": mask}
        obs, info = self.env.reset(seed=seed_arr, options=options)
        if self._screen_env is not None:
            screen, _ = self._screen_env.reset(seed=seed_arr, options=options)
            if self._screen is None or mask.all():
                self._screen = screen.copy()
            else:
                self._screen[mask] = screen[mask]
        obs = self._layout(obs)
        infos = self._infos(info, self.num_envs)
        if self._last_obs is None or mask.all():
            self._last_obs = obs.copy()
        else:
            self._last_obs[mask] = obs[mask]
        return [obs[lane] for lane in lanes], [infos[lane] for lane in lanes]

    steps_in_background = True  # AtariVectorEnv.send returns at once; its C++ threads step the lanes

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: np.ndarray) -> None:
        self.env.send(np.asarray(actions, dtype=np.int64))
        if self._screen_env is not None:
            self._screen_env.send(np.asarray(actions, dtype=np.int64))

    def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        obs, reward, term, trunc, info = self.env.recv()
        if self._screen_env is not None:
            self._screen = self._screen_env.recv()[0]
        obs = self._layout(obs)
        self._last_obs = obs
        return obs, reward.astype(np.float64), term, trunc, self._infos(info, self.num_envs)

    def state_problem(self) -> str | None:
        return ("ale: ale-py's native vector env cannot capture a lane's state; set provider_args.single_lanes: "
                "true for lanes that can")

    def render(self) -> list[np.ndarray]:
        if self._last_obs is None:
            raise RuntimeError("render() before reset()")
        frames = []
        for lane_obs in self._last_obs:
            if self._rgb:
                frames.append(np.ascontiguousarray(lane_obs[-3:].transpose(1, 2, 0)))
            else:
                frames.append(np.repeat(lane_obs[-1][:, :, None], 3, axis=2))
        return frames

    def close(self) -> None:
        for env in (self.env, self._screen_env):
            try:
                if env is not None:
                    env.close()
            except Exception:  # noqa: BLE001
                pass


class AleProvider(Provider):
    name = "ale"
    package = "ale-py"
    default_vectorization = "native"
    lanes_step_in_background = True

    def env_ids(self) -> list[str]:
        from ale_py import roms

        return sorted(_camel(r) for r in roms.get_all_rom_ids())

    def _rom(self, env_id: str) -> str:
        from ale_py import roms

        rom = rom_name(env_id)
        if rom not in roms.get_all_rom_ids():
            import difflib

            hint = difflib.get_close_matches(_camel(rom), self.env_ids(), n=1)
            raise NotFound(f"ale-py has no game '{env_id}' (ROM '{rom}')" + (f"; did you mean {hint[0]}?" if hint else ""))
        return rom

    def check(self, spec: EnvironmentSpec) -> list[tuple[str, str]]:
        """The game exists in ale-py (its ROMs ship with it) and ``provider_args`` are valid."""
        problems = args_problems(AleArgs, spec)
        try:
            self._rom(spec.env_id)
        except NotFound as e:
            problems.insert(0, ("env_id", str(e)))
        return problems

    def action_buttons(self, spec: EnvironmentSpec) -> tuple[str, ...] | None:
        """A joystick and its fire button (:data:`gradlab.contracts.actions.ALE_BUTTONS`)."""
        return ALE_BUTTONS

    def native_action(self, spec: EnvironmentSpec, buttons: list[str]) -> int:
        """The index in ALE's full action set (:func:`gradlab.contracts.actions.ale_action`)."""
        return ale_action(buttons)

    def make_backend(self, spec: EnvironmentSpec, *, render_mode: str | None) -> LaneBackend:
        rom = self._rom(spec.env_id)
        args = parse_provider_args(AleArgs, spec)
        pre = _native_preprocessing(spec)
        if args.single_lanes:
            import functools

            from gradlab.envs.lanes import SyncLanes
            from gradlab.envs.providers.ale_lane import make_ale_lane

            factory = functools.partial(make_ale_lane, rom, pre, args.use_fire_reset, MAX_FRAMES_PER_EPISODE)
            return SyncLanes(factory, spec.n_envs, render_mode=render_mode)
        return AleLanes(rom, spec.n_envs, pre, args, spec.num_threads)

    def describe(self, spec: EnvironmentSpec) -> EnvInfo:
        rom = self._rom(spec.env_id)
        pre = _native_preprocessing(spec)
        lanes = AleLanes(rom, 1, pre, parse_provider_args(AleArgs, spec), 1)
        try:
            meanings = [a.name for a in lanes.action_set]
            obs_space, act_space = lanes.single_observation_space, lanes.single_action_space
        finally:
            lanes.close()
        h, w = obs_space.shape[1:]
        max_steps = max_agent_steps(pre.frame_skip)
        return EnvInfo(provider=self.name, env_id=spec.env_id, observation_space=str(obs_space),
                       action_space=str(act_space), obs_shape=tuple(obs_space.shape), obs_dtype="uint8",
                       n_actions=int(act_space.n), action_meanings=meanings, render_shape=(h, w, 3),
                       native_max_steps=max_steps, version=self.version(),
                       extra={"rom": rom, "convention": "ALE v5 (Machado et al. 2018)", **ale_settings(pre)})


def _native_preprocessing(spec: EnvironmentSpec) -> AtariPreprocessing:
    """The spec's preprocessing; with an action profile, over ALE's full action set (its indices)."""
    pre = AtariPreprocessing.model_validate(spec.preprocessing)
    return pre.model_copy(update={"full_action_space": True}) if spec.action_profile is not None else pre


def max_agent_steps(frame_skip: int) -> int:
    """Agent steps until ALE's episode cap of :data:`MAX_FRAMES_PER_EPISODE` emulator frames.

    Each agent step emulates ``frame_skip`` frames and the cap is checked after a step, so the
    episode is truncated at step ``ceil(108000 / frame_skip)`` (27,000 at frame skip 4; measured
    with ale-py's ``AtariVectorEnv``: a 100-frame cap truncates at step 25 with skip 4, 15 with
    skip 7). Reset no-ops (``noop_max``) use frames of the same budget, so an episode may end a few
    steps earlier.
    """
    return -(-MAX_FRAMES_PER_EPISODE // frame_skip)


def ale_settings(pre: AtariPreprocessing) -> dict[str, Any]:
    """The emulator settings ``gradlab env inspect`` prints for an ``ale`` environment.

    Keys: ``frame_skip`` (emulator frames per agent step), ``repeat_action_probability`` (sticky
    actions), ``action_set`` (``minimal``: the game's own actions, or ``full``: all 18),
    ``noop_max`` (up to this many random no-ops at reset), ``max_pool`` (max over the last two
    frames of a skip), ``max_frames_per_episode`` (ALE's cap, emulator frames) and
    ``max_steps_per_episode`` (the same cap in agent steps, :func:`max_agent_steps`).
    """
    return {
        "frame_skip": pre.frame_skip,
        "repeat_action_probability": pre.repeat_action_probability,
        "action_set": "full" if pre.full_action_space else "minimal",
        "noop_max": pre.noop_max,
        "max_pool": pre.max_pool,
        "max_frames_per_episode": MAX_FRAMES_PER_EPISODE,
        "max_steps_per_episode": max_agent_steps(pre.frame_skip),
    }


provider = AleProvider()
