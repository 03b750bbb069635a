"""The ``gymnasium`` provider: any registered gymnasium id (classic control, toy text, Box2D...).

Each lane is ``gymnasium.make(env_id, **provider_args)`` with the environment checker off and no
reward wrappers; the env's own ``TimeLimit`` stays, so CartPole-v1's 500-step limit arrives as a
truncation (reason ``native_time_limit``). ``preprocessing.frame_stack`` > 1 stacks observations
with ``gymnasium.wrappers.FrameStackObservation``. Lanes run in-process by default
(``vectorization: auto`` = sync): a CartPole step costs ~5 µs, and process-based vectorisation
of such a step is 6–8× slower.

Provider state (docs/ARCHITECTURE.md section 12a): environments whose unwrapped env keeps its
state in a ``state`` attribute (classic control: CartPole, MountainCar, Acrobot, Pendulum) capture
it with the env's RNG state, CartPole's ``steps_beyond_terminated`` and the ``TimeLimit``'s elapsed
steps (:func:`capture_gym_state`); other ids, and any frame stack, are unsupported.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from gradlab.contracts.environment import EnvironmentSpec, GymnasiumPreprocessing
from gradlab.envs.backend import EnvInfo, LaneBackend, Provider
from gradlab.envs.lanes import build_lanes
from gradlab.envs.snapshot import (
    Snapshot,
    StateUnsupported,
    generator_state,
    pack,
    set_generator_state,
    unpack,
)
from gradlab.errors import ConfigError, IntegrityError, NotFound

#: Action labels for discrete classic-control envs (gymnasium's docs pages of each env).
ACTION_MEANINGS: dict[str, list[str]] = {
    "CartPole": ["PUSH_LEFT", "PUSH_RIGHT"],
    "MountainCar": ["ACCELERATE_LEFT", "NONE", "ACCELERATE_RIGHT"],
    "Acrobot": ["TORQUE_-1", "TORQUE_0", "TORQUE_+1"],
    "LunarLander": ["NOOP", "FIRE_LEFT_ENGINE", "FIRE_MAIN_ENGINE", "FIRE_RIGHT_ENGINE"],
    "FrozenLake": ["LEFT", "DOWN", "RIGHT", "UP"],
    "CliffWalking": ["UP", "RIGHT", "DOWN", "LEFT"],
    "Taxi": ["SOUTH", "NORTH", "EAST", "WEST", "PICKUP", "DROPOFF"],
    "Blackjack": ["STICK", "HIT"],
}


#: Keyword arguments ``gymnasium.make`` takes itself (the rest go to the env's constructor).
_MAKE_KWARGS = ("max_episode_steps",)


def _headless_sdl() -> None:
    """Point SDL (pygame) at its dummy video and audio drivers unless the user chose others.

    gymnasium's classic-control and Box2D envs draw ``rgb_array`` frames on an off-screen
    ``pygame.Surface`` but call ``pygame.init()``, which opens SDL's default video driver; without a
    display session that prints ``error: XDG_RUNTIME_DIR is invalid or not set in the environment.``
    on stderr (SDL itself, not Python logging). The dummy drivers need no display and give the same
    pixels: the frame is read back from the surface, never from a window. SDL reads these variables
    when pygame initialises, so this must run before the env's first ``render()``; gradlab never
    renders to a window (``render_mode="human"``), whose lanes are left alone.

    Source: SDL2 ``SDL_VIDEODRIVER``/``SDL_AUDIODRIVER`` hints (wiki.libsdl.org/SDL2/FAQUsingSDL).
    """
    import os

    for name in ("SDL_VIDEODRIVER", "SDL_AUDIODRIVER"):
        if not os.environ.get(name):  # unset or empty (SDL fails on an empty driver name)
            os.environ[name] = "dummy"


def _make_lane(env_id: str, kwargs: dict[str, Any], frame_stack: int, *, lane: int, render_mode: str | None) -> Any:
    import gymnasium as gym

    if render_mode == "rgb_array":
        _headless_sdl()
    env = gym.make(env_id, render_mode=render_mode, disable_env_checker=True, **kwargs)
    if frame_stack > 1:
        from gymnasium.wrappers import FrameStackObservation

        env = FrameStackObservation(env, frame_stack)
    return env


def _gym_state_problem(env: Any) -> str | None:
    from gymnasium.wrappers import FrameStackObservation

    name = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
    layer = env
    while hasattr(layer, "env"):
        if isinstance(layer, FrameStackObservation):
            return f"gymnasium:{name}: provider state capture does not support preprocessing.frame_stack"
        layer = layer.env
    if getattr(env.unwrapped, "state", None) is None and not hasattr(env.unwrapped, "state"):
        return (f"gymnasium:{name}: provider state capture needs an env that keeps its state in a `state` "
                "attribute (classic control); this one does not")
    return None


def _time_limit(env: Any) -> Any:
    from gymnasium.wrappers import TimeLimit

    layer = env
    while hasattr(layer, "env"):
        if isinstance(layer, TimeLimit):
            return layer
        layer = layer.env
    return None


def capture_gym_state(env: Any) -> bytes:
    """One classic-control lane's state as a snapshot: the ``state`` vector, the env's RNG state,
    CartPole's ``steps_beyond_terminated`` and the ``TimeLimit``'s elapsed steps.

    Raises:
        StateUnsupported: the env keeps no ``state`` attribute, or frames are stacked.
    """
    if (problem := _gym_state_problem(env)) is not None:
        raise StateUnsupported(problem)
    core = env.unwrapped
    limit = _time_limit(env)
    state = core.state
    meta = {"steps_beyond_terminated": getattr(core, "steps_beyond_terminated", None),
            "elapsed_steps": None if limit is None else limit._elapsed_steps,
            "rng": generator_state(core.np_random), "state_is_none": state is None}
    arrays = {} if state is None else {"state": np.asarray(state)}
    return pack(Snapshot(f"gymnasium:{env.spec.id if env.spec else type(core).__name__}", meta=meta, arrays=arrays))


def restore_gym_state(env: Any, data: bytes) -> np.ndarray:
    """Assign a :func:`capture_gym_state` snapshot; returns the observation in that state.

    Raises:
        StateUnsupported: as for :func:`capture_gym_state`. IntegrityError: a snapshot of another env.
    """
    if (problem := _gym_state_problem(env)) is not None:
        raise StateUnsupported(problem)
    core = env.unwrapped
    snap = unpack(data, kind=f"gymnasium:{env.spec.id if env.spec else type(core).__name__}")
    old = core.state
    if snap.meta["state_is_none"]:
        core.state = None
    else:
        state = snap.arrays["state"]
        if old is not None and np.shape(old) != state.shape:
            raise IntegrityError(f"provider state: state vector of shape {state.shape}, the env's is {np.shape(old)}")
        core.state = tuple(state.tolist()) if isinstance(old, tuple) else state.copy()
    if hasattr(core, "steps_beyond_terminated"):
        core.steps_beyond_terminated = snap.meta["steps_beyond_terminated"]
    limit = _time_limit(env)
    if limit is not None and snap.meta["elapsed_steps"] is not None:
        limit._elapsed_steps = snap.meta["elapsed_steps"]
    set_generator_state(core.np_random, snap.meta["rng"])
    for getter in ("_get_ob", "_get_obs"):
        if callable(getattr(core, getter, None)):
            return np.asarray(core.__getattribute__(getter)(), dtype=env.observation_space.dtype)
    return np.asarray(core.state, dtype=env.observation_space.dtype)


class GymnasiumProvider(Provider):
    name = "gymnasium"
    package = "gymnasium"
    default_vectorization = "sync"

    def env_ids(self) -> list[str]:
        import gymnasium as gym

        return sorted(k for k, s in gym.registry.items()
                      if isinstance(s.entry_point, str) and s.entry_point.startswith("gymnasium."))

    def _check(self, spec: EnvironmentSpec) -> GymnasiumPreprocessing:
        import gymnasium as gym

        if spec.env_id not in gym.registry:
            import difflib

            hint = difflib.get_close_matches(spec.env_id, list(gym.registry), n=1)
            raise NotFound(f"gymnasium has no environment '{spec.env_id}'" + (f" (did you mean {hint[0]}?)" if hint else ""))
        pre = GymnasiumPreprocessing.model_validate(spec.preprocessing)
        if pre.normalize_observation:
            raise ConfigError(f"{spec.provider}:{spec.env_id}: preprocessing.normalize_observation: expected false "
                              "(running statistics are learner state: use the backend's observation normalisation)")
        return pre

    def check(self, spec: EnvironmentSpec) -> list[tuple[str, str]]:
        """The id is registered, its dependencies import, and ``provider_args`` are parameters of
        its constructor (or of ``gymnasium.make``). No environment is instantiated."""
        import inspect

        import gymnasium as gym

        try:
            self._check(spec)
        except NotFound as e:
            return [("env_id", str(e))]
        except ConfigError as e:
            return [("preprocessing", str(e))]
        env_spec = gym.registry[spec.env_id]
        try:
            creator = (gym.envs.registration.load_env_creator(env_spec.entry_point)
                       if isinstance(env_spec.entry_point, str) else env_spec.entry_point)
        except Exception as e:  # noqa: BLE001 - DependencyNotInstalled (Box2D, MuJoCo...) or a broken entry point
            return [("env_id", f"gymnasium:{spec.env_id}: {e}")]
        try:
            params = inspect.signature(creator).parameters
        except (TypeError, ValueError):  # a builtin without a signature: nothing to check against
            return []
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return []
        valid = sorted({*(n for n in params if n != "self"), *_MAKE_KWARGS} - {"render_mode"})
        problems = []
        for key in sorted(set(spec.provider_args) - set(valid)):
            import difflib

            hint = difflib.get_close_matches(key, valid, n=1)
            problems.append((f"provider_args.{key}", f"gymnasium:{spec.env_id}: unknown key" + (
                f" (did you mean {hint[0]}?)" if hint else f" (expected one of: {', '.join(valid) or 'none'})")))
        return problems

    def _factory(self, spec: EnvironmentSpec) -> Any:
        pre = self._check(spec)
        return functools.partial(_make_lane, spec.env_id, dict(spec.provider_args), pre.frame_stack)

    def _probe(self, factory: Any, env_id: str) -> Any:
        try:
            return factory(lane=0, render_mode=None)
        except ConfigError:
            raise
        except TypeError as e:  # an unknown keyword in provider_args
            raise ConfigError(f"gymnasium:{env_id}: provider_args: {e}") from None
        except Exception as e:
            if type(e).__name__ == "DependencyNotInstalled":
                raise ConfigError(f"gymnasium:{env_id}: {e}") from None
            raise

    def make_backend(self, spec: EnvironmentSpec, *, render_mode: str | None) -> LaneBackend:
        factory = self._factory(spec)
        self._probe(factory, spec.env_id).close()
        return build_lanes(factory, spec, default="sync", render_mode=render_mode, name=spec.env_id,
                           state_codec=(capture_gym_state, restore_gym_state, _gym_state_problem))

    def describe(self, spec: EnvironmentSpec) -> EnvInfo:
        from gymnasium.spaces import Discrete

        factory = self._factory(spec)
        env = self._probe(factory, spec.env_id)
        try:
            obs_space, act_space = env.observation_space, env.action_space
            native_max = env.spec.max_episode_steps if env.spec is not None else None
        finally:
            env.close()
        n_actions = int(act_space.n) if isinstance(act_space, Discrete) else None
        family = spec.env_id.split("-")[0].split("/")[-1]
        meanings = ACTION_MEANINGS.get(family, [str(i) for i in range(n_actions)] if n_actions else [])
        render_shape = None
        try:
            renv = factory(lane=0, render_mode="rgb_array")
            renv.reset(seed=0)
            frame = renv.render()
            renv.close()
            if frame is not None:
                render_shape = tuple(int(x) for x in frame.shape)
        except Exception:  # noqa: BLE001 - rendering is optional (pygame may be missing)
            render_shape = None
        return EnvInfo(provider=self.name, env_id=spec.env_id, observation_space=str(obs_space),
                       action_space=str(act_space), obs_shape=tuple(obs_space.shape or ()),
                       obs_dtype=str(obs_space.dtype), n_actions=n_actions, action_meanings=meanings,
                       render_shape=render_shape, native_max_steps=native_max, version=self.version())


provider = GymnasiumProvider()
