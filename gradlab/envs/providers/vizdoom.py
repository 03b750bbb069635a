"""The ``vizdoom`` provider: ViZDoom's bundled scenarios, headless.

Env ids are scenario names (``basic``, ``defend_the_center``, ``health_gathering``...: every
``<name>.cfg`` with a ``<name>.wad`` in ViZDoom's ``scenarios`` folder). Each lane is one
``DoomGame`` with the window hidden, sound off, ``preprocessing.resolution`` and
``screen_format``; one policy step is ``make_action(action, tics=frame_skip)``. Observations are
the screen buffer, optionally resized, stacked channel-first (:class:`gradlab.envs.frames.FrameStack`).

Actions: Discrete(1 + buttons): 0 = no button, i = press button i-1 alone. Under an
``action_profile`` a lane takes ViZDoom's own button vector (MultiBinary over the scenario's
available buttons) and the profile wrapper (:mod:`gradlab.envs.action_profile`) maps onto it.

Timeouts: the scenario's ``episode_timeout`` is switched off inside ViZDoom and enforced here
after each step (episode time since the start tic >= timeout), so a timeout is a *truncation* whose
final observation is the real frame at that moment (ViZDoom has no state once an episode has
finished). Any other end of the episode (the monster killed, the player dead) is a termination;
its final observation repeats the last frame seen (it is never bootstrapped from).
``info`` holds the scenario's game variables (lower-case names), ``killcount`` (monsters killed
this episode, ``GameVariable.KILLCOUNT``, whether or not the scenario lists it) and ``dead``, on
every step: on the step that ends the episode they are read from the game directly
(``get_game_variable`` still answers once ``get_state`` has nothing), so a task program sees the
kill or the health that ended it.

``vectorization: auto`` steps a single lane in this process (``sync``: a worker process would only
add a pipe round trip per step) and several lanes in worker processes (``async``: the engines then
run in parallel). Each ``DoomGame`` runs its engine in a process of its own either way.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import numpy as np

from gradlab.contracts.environment import EnvironmentSpec, VizdoomPreprocessing
from gradlab.envs.backend import EnvInfo, LaneBackend, Provider, seed32
from gradlab.envs.frames import FrameStack
from gradlab.envs.lanes import build_lanes
from gradlab.errors import ConfigError, NotFound


def scenarios_dir() -> str:
    import vizdoom

    return str(vizdoom.scenarios_path)


def scenario_names() -> list[str]:
    folder = scenarios_dir()
    names = []
    for f in sorted(os.listdir(folder)):
        stem, ext = os.path.splitext(f)
        if ext == ".cfg" and os.path.exists(os.path.join(folder, stem + ".wad")) and not stem.startswith("multi"):
            names.append(stem)
    return names


class DoomLane:
    """One headless ViZDoom game with a gymnasium-style API (see the module docstring)."""

    def __init__(self, scenario: str, pre: VizdoomPreprocessing, *, lane: int = 0, render_mode: str | None = None,
                 button_vectors: bool = False):
        import vizdoom as vzd
        from gymnasium.spaces import Box, Discrete, MultiBinary

        self.render_mode = render_mode
        game = vzd.DoomGame()
        game.load_config(os.path.join(scenarios_dir(), scenario + ".cfg"))
        game.set_window_visible(False)
        game.set_sound_enabled(False)
        game.set_mode(vzd.Mode.PLAYER)
        game.set_screen_resolution(getattr(vzd.ScreenResolution, "RES_" + pre.resolution.upper()))
        game.set_screen_format(getattr(vzd.ScreenFormat, pre.screen_format))
        self.timeout = int(game.get_episode_timeout())  # tics; 0 = none
        game.set_episode_timeout(0)
        game.init()
        self.game = game
        self.frame_skip = pre.frame_skip
        self.buttons = [b.name for b in game.get_available_buttons()]
        self._variables = list(game.get_available_game_variables())
        self.variables = [v.name.lower() for v in self._variables]
        self._killcount = vzd.GameVariable.KILLCOUNT
        n = len(self.buttons)
        self._actions = [[0] * n] + [[1 if j == i else 0 for j in range(n)] for i in range(n)]
        self._vectors = button_vectors
        self.action_space = MultiBinary(n) if button_vectors else Discrete(len(self._actions))
        w, h = (int(x) for x in pre.resolution.split("x"))
        in_shape = (h, w) if pre.screen_format == "GRAY8" else (h, w, 3)
        self.frames = FrameStack(grayscale=pre.screen_format == "GRAY8", resize=pre.resize,
                                 stack=pre.frame_stack, in_shape=in_shape)
        self.observation_space = Box(0, 255, shape=self.frames.shape, dtype=np.uint8)
        self._raw: np.ndarray | None = None
        self._start = 0

    def _observe(self, reset: bool) -> tuple[np.ndarray, dict[str, Any]]:
        """Read the state once: (observation, info)."""
        game = self.game
        state = game.get_state()
        values = state.game_variables
        info: dict[str, Any] = dict(zip(self.variables, values.tolist(), strict=False)) if values is not None else {}
        info["killcount"] = game.get_game_variable(self._killcount)
        info["dead"] = game.is_player_dead()
        self._raw = raw = state.screen_buffer
        return (self.frames.reset(raw) if reset else self.frames.push(raw)), info

    def _final_info(self) -> dict[str, Any]:
        """The info of the step that ended the episode: the same keys, read from the game."""
        game = self.game
        info: dict[str, Any] = {name: game.get_game_variable(v) for name, v in zip(self.variables, self._variables,
                                                                                  strict=True)}
        info["killcount"] = game.get_game_variable(self._killcount)
        info["dead"] = game.is_player_dead()
        return info

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        if seed is not None:
            self.game.set_seed(seed32(seed))
        self.game.new_episode()
        self._start = self.game.get_episode_time()
        return self._observe(reset=True)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        game = self.game
        buttons = [int(b) for b in action] if self._vectors else self._actions[action]
        reward = game.make_action(buttons, self.frame_skip)
        if game.is_episode_finished():
            return self.frames.repeat_last(), reward, True, False, self._final_info()
        obs, info = self._observe(reset=False)
        return obs, reward, False, self.timeout > 0 and game.get_episode_time() - self._start >= self.timeout, info

    def state_problem(self) -> str | None:
        """ViZDoom lanes do not capture their state: ``DoomGame.save``/``load`` go through savegame
        files on disk and restore no step-exact RNG, so restore + same actions is not guaranteed to
        repeat the same transitions (docs/ARCHITECTURE.md section 12a)."""
        return ("vizdoom: provider state capture is not supported (DoomGame.save/load are savegame files "
                "without a step-exact replay guarantee)")

    def render(self) -> np.ndarray:
        if self._raw is None:
            raise RuntimeError("render() before reset()")
        raw = self._raw
        return np.repeat(raw[:, :, None], 3, axis=2) if raw.ndim == 2 else np.asarray(raw)

    def close(self) -> None:
        self.game.close()


def _make_lane(scenario: str, pre: VizdoomPreprocessing, *, lane: int, render_mode: str | None,
               button_vectors: bool = False) -> DoomLane:
    return DoomLane(scenario, pre, lane=lane, render_mode=render_mode, button_vectors=button_vectors)


def scenario_buttons(scenario: str) -> tuple[str, ...]:
    """The scenario's available buttons, in its config's order (``load_config`` only; no engine)."""
    import vizdoom as vzd

    game = vzd.DoomGame()
    game.load_config(os.path.join(scenarios_dir(), scenario + ".cfg"))
    return tuple(b.name for b in game.get_available_buttons())


class VizdoomProvider(Provider):
    name = "vizdoom"
    package = "vizdoom"
    default_vectorization = "async"  # for several lanes; a single lane runs in-process (make_backend)

    def env_ids(self) -> list[str]:
        return scenario_names()

    def _check(self, spec: EnvironmentSpec) -> VizdoomPreprocessing:
        names = scenario_names()
        if spec.env_id not in names:
            import difflib

            hint = difflib.get_close_matches(spec.env_id, names, n=1)
            raise NotFound(f"ViZDoom has no bundled scenario '{spec.env_id}'"
                           + (f" (did you mean {hint[0]}?)" if hint else f"; scenarios: {', '.join(names)}"))
        if spec.provider_args:
            raise ConfigError(f"vizdoom:{spec.env_id}: provider_args: expected none, found {sorted(spec.provider_args)}")
        return VizdoomPreprocessing.model_validate(spec.preprocessing)

    def check(self, spec: EnvironmentSpec) -> list[tuple[str, str]]:
        """The scenario is bundled with ViZDoom; no ``provider_args``."""
        from gradlab.envs.backend import no_args_problems

        problems = no_args_problems(spec)
        names = scenario_names()
        if spec.env_id not in names:
            try:
                self._check(spec)
            except NotFound as e:
                problems.insert(0, ("env_id", str(e)))
        return problems

    def make_backend(self, spec: EnvironmentSpec, *, render_mode: str | None) -> LaneBackend:
        pre = self._check(spec)
        factory = functools.partial(_make_lane, spec.env_id, pre, button_vectors=spec.action_profile is not None)
        default = "sync" if spec.n_envs == 1 else "async"
        return build_lanes(factory, spec, default=default, render_mode=render_mode, name=f"vizdoom-{spec.env_id}")

    def action_buttons(self, spec: EnvironmentSpec) -> tuple[str, ...] | None:
        """The scenario's available buttons (:func:`scenario_buttons`); an unknown scenario has none."""
        return scenario_buttons(spec.env_id) if spec.env_id in scenario_names() else ()

    def native_action(self, spec: EnvironmentSpec, buttons: list[str]) -> np.ndarray:
        """(n_buttons,) int8 button vector, 1 where the action presses the button."""
        return np.array([b in buttons for b in scenario_buttons(spec.env_id)], dtype=np.int8)

    def describe(self, spec: EnvironmentSpec) -> EnvInfo:
        pre = self._check(spec)
        lane = DoomLane(spec.env_id, pre, button_vectors=spec.action_profile is not None)
        try:
            w, h = (int(x) for x in pre.resolution.split("x"))
            native = math.ceil(lane.timeout / pre.frame_skip) if lane.timeout else None
            return EnvInfo(provider=self.name, env_id=spec.env_id, observation_space=str(lane.observation_space),
                           action_space=str(lane.action_space), obs_shape=tuple(lane.observation_space.shape),
                           obs_dtype="uint8", n_actions=int(lane.action_space.n),
                           action_meanings=["NOOP", *lane.buttons], render_shape=(h, w, 3), native_max_steps=native,
                           version=self.version(),
                           extra={"episode_timeout_tics": lane.timeout, "game_variables": lane.variables})
        finally:
            lane.close()


provider = VizdoomProvider()
