"""The ``retro`` provider: stable-retro games, headless, one emulator per worker process.

Env ids are stable-retro game names (``Airstriker-Genesis-v0``, bundled with its ROM; any other
game needs ``gradlab rom import PATH``, see :mod:`gradlab.envs.roms`; a missing ROM is a
``ConfigError`` saying how to import it). Rendering is never opened on a display: the observation
is the emulator's screen and ``render()`` returns the last raw screen.

One policy step repeats the action for ``preprocessing.frame_skip`` emulator frames (summing the
native reward, stopping early when the episode ends); the last frame is converted
(``grayscale``: BT.601 luma), resized and stacked channel-first (:class:`gradlab.envs.frames.FrameStack`).
``preprocessing.state`` picks the default start state, ``use_restricted_actions`` the action space
(``discrete``: Discrete over the game's valid button combos); an ``action_profile`` builds the lanes
with every console button (MultiBinary, :func:`console_buttons`) for the profile wrapper
(:mod:`gradlab.envs.action_profile`). ``info`` holds the integration's
variables (``lives``, ``score``...); RAM signals read ``get_ram()``.

Named starts (``eval.starts``, ``VectorEnv.set_next_start``) are the game's save states
(``stable_retro.data.list_states``, e.g. ``Level1``): a reset with ``options={"start": name}``
loads that state with ``RetroEnv.load_state`` first; the next reset without a name returns to the
default state (``preprocessing.state`` or the game's own default).

Vectorization: stable-retro allows one emulator per process. ``auto`` (and ``native``) steps a
single lane in this process (``sync``: no pipe round trip per step) when this process holds no
emulator yet, and otherwise puts one lane per worker process (``async``). ``sync`` with more than
one lane, or while this process already holds an emulator (a gradlab lane or the caller's own
``stable_retro.make``), is a :class:`EmulatorInUse` error that says what to change, never a crash.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np

from gradlab.contracts.environment import EnvironmentSpec, RetroPreprocessing
from gradlab.envs.backend import EnvInfo, LaneBackend, Provider
from gradlab.envs.frames import FrameStack
from gradlab.envs.lanes import AsyncLanes, SyncLanes
from gradlab.envs.roms import RomMissing, missing_rom_error, register_rom_dir, rom_cache_dir, verify_imported
from gradlab.envs.snapshot import Snapshot, pack, unpack
from gradlab.errors import ConfigError, ConfigProblem, IntegrityError, NotFound

logger = logging.getLogger(__name__)

#: In-process emulators held by open :class:`RetroLane` objects of this process (0 or 1).
_open_lanes = 0


class EmulatorInUse(ConfigError):
    """This process already holds a stable-retro emulator, and stable-retro allows one per process."""


def emulator_in_process() -> bool:
    """Whether a :class:`RetroLane` of this process holds the process's one emulator right now."""
    return _open_lanes > 0


class RetroLane:
    """One stable-retro emulator with frame skip and image preprocessing (see the module docstring)."""

    def __init__(self, game: str, pre: RetroPreprocessing, roms_dir: str, *, lane: int = 0,
                 render_mode: str | None = None, all_buttons: bool = False):
        import stable_retro as retro
        from gymnasium.spaces import Box

        # all_buttons (an action profile): MultiBinary over every console button.
        acts = retro.Actions.ALL if all_buttons else {
            "discrete": retro.Actions.DISCRETE, "multi_discrete": retro.Actions.MULTI_DISCRETE,
            "filtered": retro.Actions.FILTERED}[pre.use_restricted_actions]
        global _open_lanes
        inttype = register_rom_dir(roms_dir)
        if _open_lanes:
            raise _in_use(game, "a gradlab retro lane of this process is still open")
        try:
            self.env = retro.make(game, state=pre.state or retro.State.DEFAULT, use_restricted_actions=acts,
                                  inttype=inttype, render_mode=None)
        except RuntimeError as e:
            if "multiple emulator" not in str(e):
                raise
            raise _in_use(game, f"stable-retro said: {e}") from None
        _open_lanes += 1
        self._open = True
        try:
            self._inttype = inttype
            core = self.env.unwrapped
            # The default start, restored after an episode that began from a named state.
            self._default_state = (core.initial_state, core.statename)
            self._state_name: str | None = None
            #: The game's save states a reset can start from (None when it has none).
            self.starts = tuple(retro.data.list_states(game, inttype)) or None
            self.render_mode = render_mode
            self.frame_skip = pre.frame_skip
            raw_shape = tuple(self.env.observation_space.shape)
            self.frames = FrameStack(grayscale=pre.grayscale, resize=pre.resize, stack=pre.frame_stack,
                                     in_shape=raw_shape)
            self.observation_space = Box(0, 255, shape=self.frames.shape, dtype=np.uint8)
            self.action_space = self.env.action_space
            self._raw: np.ndarray | None = None
        except BaseException:
            self.close()
            raise

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        start = (options or {}).get("start")
        if start != self._state_name:
            core = self.env.unwrapped
            if start is None:
                core.initial_state, core.statename = self._default_state
            else:
                if start not in (self.starts or ()):
                    raise ValueError(f"{core.gamename}: start: expected one of {list(self.starts or ())}, "
                                     f"found {start!r}")
                core.load_state(start, self._inttype)
            self._state_name = start
        obs, info = self.env.reset(seed=seed)
        self._raw = obs
        return self.frames.reset(obs), dict(info)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        # RetroEnv.step returns a new info dict and Python bools each frame: no copies needed here.
        step = self.env.step
        total = 0.0
        for _ in range(self.frame_skip):
            obs, reward, terminated, truncated, info = step(action)
            total += reward
            if terminated or truncated:
                break
        self._raw = obs
        return self.frames.push(obs), float(total), terminated, truncated, info

    def get_ram(self) -> np.ndarray:
        return np.asarray(self.env.unwrapped.get_ram(), dtype=np.uint8)

    def state_problem(self) -> str | None:
        return None

    def capture_state(self) -> bytes:
        """The emulator's own serialised state (``em.get_state``), the frame stack and the last
        raw screen, as a snapshot (:mod:`gradlab.envs.snapshot`)."""
        core = self.env.unwrapped
        frames = self.frames.frames()
        arrays = {f"frame{i:03d}": f for i, f in enumerate(frames)}
        if self._raw is not None:
            arrays["raw"] = np.asarray(self._raw)
        return pack(Snapshot(f"retro:{core.gamename}", meta={"state_name": self._state_name, "frames": len(frames)},
                             arrays=arrays, blobs={"emulator": bytes(core.em.get_state())}))

    def restore_state(self, state: bytes) -> np.ndarray:
        """Load a :meth:`capture_state` snapshot into the emulator; returns the observation there.

        The game data's variables are re-read from the restored RAM (``data.reset`` then
        ``update_ram``, as ``RetroEnv.reset`` does), so the next step's reward is the change from
        the restored state.
        """
        core = self.env.unwrapped
        snap = unpack(state, kind=f"retro:{core.gamename}")
        core.em.set_state(snap.blobs["emulator"])
        core.data.reset()
        core.data.update_ram()
        self._state_name = snap.meta["state_name"]
        self._raw = snap.arrays.get("raw")
        self.frames.set_frames([snap.arrays[f"frame{i:03d}"] for i in range(int(snap.meta["frames"]))])
        return self.frames.repeat_last()

    def action_meanings(self) -> list[str]:
        from gymnasium.spaces import Discrete

        if not isinstance(self.action_space, Discrete):
            return list(self.env.unwrapped.buttons)
        out = []
        for i in range(int(self.action_space.n)):
            buttons = [b for b in self.env.unwrapped.get_action_meaning(i) if b]
            out.append("+".join(buttons) or "NOOP")
        return out

    def render(self) -> np.ndarray:
        if self._raw is None:
            raise RuntimeError("render() before reset()")
        return np.asarray(self._raw)

    def close(self) -> None:
        global _open_lanes
        self.env.close()
        if self._open:
            self._open = False
            _open_lanes -= 1

    def __del__(self) -> None:  # pragma: no cover - best effort for a lane dropped without close()
        if getattr(self, "_open", False):
            try:
                self.close()
            except Exception:  # noqa: BLE001
                pass


def _in_use(game: str, why: str) -> EmulatorInUse:
    return EmulatorInUse(
        f"retro:{game}: stable-retro allows one emulator per process and this process already holds one ({why}); "
        "expected vectorization auto or async (a worker process per lane), or close the other environment "
        "first, found an in-process (sync) lane")


def _make_lane(game: str, pre: RetroPreprocessing, roms_dir: str, *, lane: int, render_mode: str | None,
               all_buttons: bool = False) -> RetroLane:
    return RetroLane(game, pre, roms_dir, lane=lane, render_mode=render_mode, all_buttons=all_buttons)


def button_slots(game: str) -> tuple[str | None, ...]:
    """The console's button slots in stable-retro's MultiBinary order, ``None`` where a slot has no
    button (NES: ``B None SELECT START UP DOWN LEFT RIGHT A``; Genesis: ``B A MODE START UP DOWN LEFT
    RIGHT C Y X Z``), read from stable-retro's core table (``EMU_INFO``); no emulator. The action
    vector stable-retro takes has one entry per slot, empty ones included.

    Raises:
        NotFound: the game's system (``Name-System[-vN]``) is not one stable-retro emulates.
    """
    import re

    from stable_retro.data import EMU_INFO

    system = re.sub(r"-v\d+$", "", game).rsplit("-", 1)[-1]
    info = EMU_INFO.get(system)
    if not info:
        raise NotFound(f"retro:{game}: no stable-retro system '{system}'")
    return tuple(info["buttons"])


def console_buttons(game: str) -> tuple[str, ...]:
    """The console's button names in stable-retro's order, empty slots left out (:func:`button_slots`).

    Raises:
        NotFound: the game's system is not one stable-retro emulates.
    """
    return tuple(b for b in button_slots(game) if b)


class RetroProvider(Provider):
    name = "retro"
    package = "stable-retro"
    default_vectorization = "async"

    def env_ids(self) -> list[str]:
        from stable_retro.data import Integrations, list_games

        return sorted(list_games(Integrations.ALL))

    def _check(self, spec: EnvironmentSpec) -> tuple[RetroPreprocessing, str]:
        from stable_retro.data import get_file_path, get_romfile_path

        if spec.provider_args:
            raise ConfigError(f"retro:{spec.env_id}: provider_args: expected none, found {sorted(spec.provider_args)}")
        pre = RetroPreprocessing.model_validate(spec.preprocessing)
        roms_dir = str(rom_cache_dir())
        inttype = register_rom_dir(roms_dir)
        if not get_file_path(spec.env_id, "rom.sha", inttype):
            import difflib

            hint = difflib.get_close_matches(spec.env_id, self.env_ids(), n=1)
            raise NotFound(f"stable-retro has no game '{spec.env_id}'" + (f" (did you mean {hint[0]}?)" if hint else ""))
        states = self.static_starts(spec) or []
        if pre.state and pre.state not in states:
            raise ConfigError([ConfigProblem(file="", key_path="preprocessing.state", message=(
                f"retro:{spec.env_id}: expected one of the game's save states {states}, found {pre.state!r}"))])
        try:
            get_romfile_path(spec.env_id, inttype)
        except FileNotFoundError:
            raise missing_rom_error(spec.env_id) from None
        verify_imported(spec.env_id)
        return pre, roms_dir

    def check(self, spec: EnvironmentSpec) -> list[tuple[str, str]]:
        """The game is integrated in stable-retro, its ROM is present (bundled or imported with
        ``gradlab rom import``) and hashes as expected; no ``provider_args``. No emulator starts."""
        from gradlab.envs.backend import no_args_problems

        problems = no_args_problems(spec)
        try:
            self._check(spec.model_copy(update={"provider_args": {}}))
        except ConfigError as e:  # a missing ROM (env_id), an unknown save state (preprocessing.state)
            problems[:0] = [(p.key_path or "env_id", p.message) for p in e.problems]
        except (NotFound, IntegrityError) as e:  # unknown game, ROM with a bad hash
            problems.insert(0, ("env_id", str(e)))
        return problems

    def missing_files(self, spec: EnvironmentSpec) -> list[str]:
        """The game's ROM, when stable-retro integrates the game but no ROM is bundled or imported."""
        try:
            self._check(spec.model_copy(update={"provider_args": {}}))
        except RomMissing as e:
            return [str(e)]
        except (NotFound, ConfigError, IntegrityError):
            return []
        return []

    def static_starts(self, spec: EnvironmentSpec) -> list[str] | None:
        """The game's save states (``stable_retro.data.list_states``; no ROM needed)."""
        from stable_retro.data import list_states

        return sorted(list_states(spec.env_id, register_rom_dir(str(rom_cache_dir())))) or None

    def make_backend(self, spec: EnvironmentSpec, *, render_mode: str | None) -> LaneBackend:
        pre, roms_dir = self._check(spec)
        factory = functools.partial(_make_lane, spec.env_id, pre, roms_dir,
                                    all_buttons=spec.action_profile is not None)
        mode = spec.vectorization
        if mode == "sync":
            if spec.n_envs > 1:
                raise ConfigError(
                    f"retro:{spec.env_id}: vectorization: sync steps every lane in this process, but stable-retro "
                    f"allows one emulator per process; expected n_envs 1 or vectorization auto/async, found "
                    f"n_envs {spec.n_envs}")
            return SyncLanes(factory, 1, render_mode=render_mode)
        if mode != "async" and spec.n_envs == 1:  # auto, native: in-process when the emulator is free
            if not emulator_in_process():
                try:
                    return SyncLanes(factory, 1, render_mode=render_mode)
                except EmulatorInUse:  # the caller's own stable_retro env holds it
                    pass
            logger.info("retro:%s: this process already holds an emulator; the lane runs in a worker process",
                        spec.env_id)
        return AsyncLanes(factory, spec.n_envs, render_mode=render_mode, lanes_per_worker=1, name=f"retro-{spec.env_id}")

    def action_buttons(self, spec: EnvironmentSpec) -> tuple[str, ...] | None:
        """The console's buttons (:func:`console_buttons`): a profile action presses some of them."""
        return console_buttons(spec.env_id)

    def native_action(self, spec: EnvironmentSpec, buttons: list[str]) -> np.ndarray:
        """(n_slots,) int8 MultiBinary vector over :func:`button_slots` (empty slots included, as
        stable-retro's action space has them), 1 where the action presses the button."""
        return np.array([b is not None and b in buttons for b in button_slots(spec.env_id)], dtype=np.int8)

    def describe(self, spec: EnvironmentSpec) -> EnvInfo:
        pre, roms_dir = self._check(spec)
        # A throw-away single-lane worker: this process may already hold an emulator.
        lanes = AsyncLanes(functools.partial(_describe_lane, spec.env_id, pre, roms_dir,
                                             all_buttons=spec.action_profile is not None),
                           1, lanes_per_worker=1, name="retro-describe")
        try:
            obs_space, act_space = lanes.single_observation_space, lanes.single_action_space
            starts = list(lanes.starts or ())
            lanes._conns[0].send(("render", None))
            meanings, raw_shape = lanes._recv(0)[0]
        finally:
            lanes.close()
        return EnvInfo(provider=self.name, env_id=spec.env_id, observation_space=str(obs_space),
                       action_space=str(act_space), obs_shape=tuple(obs_space.shape), obs_dtype="uint8",
                       n_actions=int(getattr(act_space, "n", 0)) or None, action_meanings=meanings,
                       render_shape=tuple(raw_shape), native_max_steps=None, version=self.version(),
                       extra={"state": pre.state or "default", "ram_bytes": None, "starts": starts})


class _DescribeLane(RetroLane):
    """A lane whose ``render()`` answers (action meanings, raw screen shape) for :meth:`describe`."""

    def render(self) -> Any:
        return (self.action_meanings(), tuple(self.env.observation_space.shape))


def _describe_lane(game: str, pre: RetroPreprocessing, roms_dir: str, *, lane: int, render_mode: str | None,
                   all_buttons: bool = False) -> RetroLane:
    return _DescribeLane(game, pre, roms_dir, lane=lane, render_mode=render_mode, all_buttons=all_buttons)


provider = RetroProvider()
