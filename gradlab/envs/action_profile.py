"""The action-profile wrapper: the policy's ``Discrete(k)`` actions mapped to provider-native ones.

An environment whose contract carries ``action_profile`` (:class:`gradlab.contracts.actions.ActionProfile`)
is built by its provider with the provider's full native action space (stable-retro's MultiBinary
buttons, ALE's full action set, ViZDoom's button vectors), and :func:`make_vector_env
<gradlab.envs.vector.make_vector_env>` wraps that lane backend in a :class:`ProfiledBackend`:
action ``i`` of every lane becomes row ``i`` of the provider's native action table
(:meth:`gradlab.envs.backend.Provider.profile_actions`). ``gradlab env inspect`` and the player name
the actions by the profile (:func:`profiled_info`). See docs/ARCHITECTURE.md section 4.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.envs.backend import EnvInfo, LaneBackend, Provider
from gradlab.errors import ConfigError

#: Providers shipped with action profiles (a third-party provider opts in through ``action_buttons``).
PROFILE_PROVIDERS = ("retro", "ale", "vizdoom")


def profile_problems(provider: Provider, spec: EnvironmentSpec) -> list[tuple[str, str]]:
    """What is wrong with ``spec.action_profile`` for ``provider``, found without an emulator.

    Returns:
        ``[(key, message)]`` with ``key`` under ``action_profile`` (``action_profile.actions.2.buttons``):
        the provider takes no profiles, or an action names a button the provider does not have
        (or a combination it cannot press); empty when fine or when there is no profile.
    """
    profile = spec.action_profile
    if profile is None:
        return []
    where = f"{spec.provider}:{spec.env_id}"
    buttons = provider.action_buttons(spec)
    if buttons is None:
        return [("action_profile", f"{where}: provider '{spec.provider}' has no action profiles (they map a small "
                                   f"discrete set onto native buttons; providers with them: {', '.join(PROFILE_PROVIDERS)})")]
    problems = []
    for i, action in enumerate(profile.actions):
        unknown = [b for b in action.buttons if b not in buttons]
        if unknown:
            problems.append((f"action_profile.actions.{i}.buttons",
                             f"{where}: action '{action.name}': unknown button(s) {unknown}; expected names from "
                             f"{list(buttons)}"))
            continue
        try:
            provider.native_action(spec, action.buttons)
        except ValueError as e:
            problems.append((f"action_profile.actions.{i}.buttons", f"{where}: action '{action.name}': {e}"))
    return problems


def native_table(provider: Provider, spec: EnvironmentSpec) -> np.ndarray:
    """(k, *native_action_shape) native actions, row ``i`` for profile action ``i``.

    Raises:
        ConfigError: the profile does not fit the provider (:func:`profile_problems`'s messages).
    """
    problems = profile_problems(provider, spec)
    if problems:
        raise ConfigError("; ".join(f"{key}: {msg}" for key, msg in problems))
    assert spec.action_profile is not None
    return np.stack([np.asarray(provider.native_action(spec, a.buttons)) for a in spec.action_profile.actions])


class ProfiledBackend(LaneBackend):
    """A lane backend whose action space is a profile's ``Discrete(k)`` over ``inner``'s native actions.

    ``step(actions)``: ``actions`` (N,) int64 in ``[0, k)``; ``inner`` receives ``table[actions]``,
    (N, *native_shape). Everything else (reset, starts, state capture, RAM, render, the player's
    colour screen) is ``inner``'s.

    Raises (from step):
        ContractViolation: an action outside ``[0, k)``.
    """

    def __init__(self, inner: LaneBackend, table: np.ndarray, meanings: list[str]):
        from gymnasium.spaces import Discrete

        self.inner = inner
        self.table = np.asarray(table)
        self.meanings = list(meanings)
        self.num_envs = inner.num_envs
        self.single_observation_space = inner.single_observation_space
        self.single_action_space = Discrete(len(self.table))
        self.flags = inner.flags
        self.has_ram = inner.has_ram
        self.starts = inner.starts
        self.steps_in_background = inner.steps_in_background

    def native(self, actions: np.ndarray) -> np.ndarray:
        """The native actions for policy ``actions`` (N,)."""
        idx = np.asarray(actions, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self.table)):
            from gradlab.errors import ContractViolation

            raise ContractViolation(f"action profile: expected actions in [0, {len(self.table)}), found {idx.tolist()}")
        return self.table[idx]

    def reset_lanes(self, lanes: Any, seeds: Any, *, starts: Any = None) -> tuple[list[np.ndarray], list[dict]]:
        if starts is None:
            return self.inner.reset_lanes(lanes, seeds)
        return self.inner.reset_lanes(lanes, seeds, starts=starts)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        return self.inner.step(self.native(actions))

    def step_async(self, actions: np.ndarray) -> None:
        self.inner.step_async(self.native(actions))

    def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        return self.inner.step_wait()

    def capture_state(self, lane: int) -> bytes:
        return self.inner.capture_state(lane)

    def restore_state(self, lane: int, state: bytes) -> np.ndarray:
        return self.inner.restore_state(lane, state)

    def state_problem(self) -> str | None:
        return self.inner.state_problem()

    def flag_values(self, name: str) -> np.ndarray:
        return self.inner.flag_values(name)

    def ram(self) -> np.ndarray:
        return self.inner.ram()

    def render(self) -> list[np.ndarray]:
        return self.inner.render()

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # provider extras (enable_screen, screen) pass through
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def profiled_info(provider: Provider, spec: EnvironmentSpec, info: EnvInfo) -> EnvInfo:
    """``info`` as the policy sees it under ``spec``'s action profile: ``Discrete(k)``, the
    profile's action names as meanings, and in ``extra`` the profile (name, each action's buttons
    and native action) and the native action space it maps onto."""
    profile = spec.action_profile
    if profile is None:
        return info
    table = native_table(provider, spec)
    actions = [{"name": a.name, "buttons": list(a.buttons), "native": np.asarray(row).tolist()}
               for a, row in zip(profile.actions, table, strict=True)]
    extra = {**info.extra, "action_profile": profile.name, "profile_actions": actions,
             "native_action_space": info.action_space}
    return dataclasses.replace(info, action_space=f"Discrete({len(actions)})", n_actions=len(actions),
                               action_meanings=profile.meanings, extra=extra)
