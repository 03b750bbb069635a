"""One Atari lane on its own ``ALEInterface``: the ``ale`` provider's lanes that capture their state.

ale-py's native ``AtariVectorEnv`` (the ``ale`` provider's default) exposes no per-lane
``cloneState``, so an environment whose lanes must capture and restore their state
(docs/ARCHITECTURE.md section 12a: Go-Explore, the archive curriculum) sets
``provider_args.single_lanes: true`` and gets these lanes instead, stepped in-process by
:class:`gradlab.envs.lanes.SyncLanes`. The ALE v5 conventions are the same (sticky actions inside
the emulator, the 108,000-frame cap, ``noop_max`` random no-ops at reset from the lane's RNG,
optional fire on reset); the image pipeline is gradlab's :class:`gradlab.envs.frames.FrameStack`
(PIL's BT.601 luma and bilinear resize) with a max over the last two frames of a skip, so
observations are close to, not bit-equal with, the native vector env's.

State: ``ALEInterface.cloneState(include_rng=True)`` serialised (the emulator and its sticky-action
RNG), the frame stack and the no-op RNG, one snapshot
(:mod:`gradlab.envs.snapshot`, kind ``ale:<rom>``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gradlab.envs.backend import seed32
from gradlab.envs.frames import FrameStack
from gradlab.envs.snapshot import Snapshot, generator_state, pack, set_generator_state, unpack


class AleLane:
    """One ALE emulator with frame skip, max-pool, grayscale/resize and frame stack."""

    def __init__(self, rom: str, pre: Any, *, use_fire_reset: bool, max_frames: int, lane: int = 0,
                 render_mode: str | None = None):
        from ale_py import ALEInterface, LoggerMode, roms
        from gymnasium.spaces import Box, Discrete

        ALEInterface.setLoggerMode(LoggerMode.Error)
        self.rom = rom
        self._rom_path = str(roms.get_rom_path(rom))
        self.ale = ALEInterface()
        self.ale.setFloat("repeat_action_probability", float(pre.repeat_action_probability))
        self.ale.setInt("max_num_frames_per_episode", int(max_frames))
        self.ale.setInt("random_seed", seed32(lane))
        self.ale.loadROM(self._rom_path)
        self.action_set = list(self.ale.getLegalActionSet() if pre.full_action_space else self.ale.getMinimalActionSet())
        self.frame_skip = int(pre.frame_skip)
        self.max_pool = bool(pre.max_pool)
        self.grayscale = bool(pre.grayscale)
        self.noop_max = int(pre.noop_max)
        self.use_fire_reset = use_fire_reset
        self.render_mode = render_mode
        raw_shape = (210, 160) if self.grayscale else (210, 160, 3)
        self.frames = FrameStack(grayscale=self.grayscale, resize=pre.resize, stack=pre.frame_stack, in_shape=raw_shape)
        self.observation_space = Box(0, 255, shape=self.frames.shape, dtype=np.uint8)
        self.action_space = Discrete(len(self.action_set))
        self._rng = np.random.default_rng(seed32(lane))

    def _screen(self) -> np.ndarray:
        return self.ale.getScreenGrayscale() if self.grayscale else self.ale.getScreenRGB()

    def _info(self) -> dict[str, Any]:
        return {"lives": int(self.ale.lives()), "episode_frame_number": int(self.ale.getEpisodeFrameNumber()),
                "frame_number": int(self.ale.getFrameNumber())}

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        from ale_py import Action

        if seed is not None:
            self.ale.setInt("random_seed", seed32(seed))
            self.ale.loadROM(self._rom_path)
            self._rng = np.random.default_rng(seed32(seed))
        self.ale.reset_game()
        for _ in range(int(self._rng.integers(0, self.noop_max + 1)) if self.noop_max else 0):
            self.ale.act(Action.NOOP)
            if self.ale.game_over():
                self.ale.reset_game()
        if self.use_fire_reset:
            self.ale.act(Action.FIRE)
        return self.frames.reset(self._screen()), self._info()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        act = self.action_set[int(action)]
        total = 0.0
        prev = None
        screen = None
        for i in range(self.frame_skip):
            total += self.ale.act(act)
            if i == self.frame_skip - 2 and self.max_pool:
                prev = self._screen()
            if self.ale.game_over():
                break
        screen = self._screen()
        if prev is not None:
            screen = np.maximum(prev, screen)
        terminated = bool(self.ale.game_over(with_truncation=False))
        truncated = bool(self.ale.game_truncated()) and not terminated
        return self.frames.push(screen), float(total), terminated, truncated, self._info()

    def get_ram(self) -> np.ndarray:
        return np.asarray(self.ale.getRAM(), dtype=np.uint8)

    def state_problem(self) -> str | None:
        return None

    def capture_state(self) -> bytes:
        """``cloneState(include_rng=True)`` serialised, the frame stack and the no-op RNG."""
        frames = self.frames.frames()
        arrays = {f"frame{i:03d}": f for i, f in enumerate(frames)}
        return pack(Snapshot(f"ale:{self.rom}", meta={"frames": len(frames), "rng": generator_state(self._rng)},
                             arrays=arrays, blobs={"emulator": self.ale.cloneState(include_rng=True).serialize()}))

    def restore_state(self, state: bytes) -> np.ndarray:
        """Load a :meth:`capture_state` snapshot; returns the observation there."""
        from ale_py import ALEState

        snap = unpack(state, kind=f"ale:{self.rom}")
        self.ale.restoreState(ALEState(snap.blobs["emulator"]))
        set_generator_state(self._rng, snap.meta["rng"])
        self.frames.set_frames([snap.arrays[f"frame{i:03d}"] for i in range(int(snap.meta["frames"]))])
        return self.frames.repeat_last()

    def render(self) -> np.ndarray:
        """The newest frame of the stack as (H, W, 3) RGB, as the native lanes render."""
        last = self.frames.frames()[-1]
        return np.repeat(last[0][:, :, None], 3, axis=2) if last.shape[0] == 1 else np.ascontiguousarray(
            last.transpose(1, 2, 0))

    def close(self) -> None:
        return None


def make_ale_lane(rom: str, pre: Any, use_fire_reset: bool, max_frames: int, *, lane: int,
                  render_mode: str | None) -> AleLane:
    """Lane factory for :func:`gradlab.envs.lanes.build_lanes` (picklable with ``functools.partial``)."""
    return AleLane(rom, pre, use_fire_reset=use_fire_reset, max_frames=max_frames, lane=lane, render_mode=render_mode)
