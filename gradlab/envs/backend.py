"""What a provider implements: a :class:`Provider` that describes environments and builds a
:class:`LaneBackend` of N lanes that step without autoreset.

A lane backend never resets a lane on its own: when a lane's episode ends, the vector env
(:mod:`gradlab.envs.vector`) asks it to reset exactly those lanes, right away, so no reset-step
transition ever exists. Single-environment providers build their lanes from a
:data:`LaneFactory` and get in-process (:class:`gradlab.envs.lanes.SyncLanes`) or subprocess
(:class:`gradlab.envs.lanes.AsyncLanes`) stepping for free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.envs.snapshot import StateUnsupported
from gradlab.version import __version__


@dataclass(frozen=True)
class EnvInfo:
    """What ``gradlab env inspect`` prints about one environment.

    Attributes:
        provider, env_id: the environment's name.
        observation_space, action_space: ``str()`` of the single-lane gymnasium spaces.
        obs_shape, obs_dtype: the single-lane observation shape and numpy dtype name.
        n_actions: for discrete action spaces, else None.
        action_meanings: one label per discrete action (may be empty when unknown).
        render_shape: (H, W, 3) of ``render()`` frames, or None when rendering is unsupported.
        native_max_steps: the provider's own time limit in policy steps, or None.
        version: the provider package's version.
        extra: provider-specific facts (native flags, RAM size...).
    """

    provider: str
    env_id: str
    observation_space: str
    action_space: str
    obs_shape: tuple[int, ...]
    obs_dtype: str
    n_actions: int | None
    action_meanings: list[str]
    render_shape: tuple[int, int, int] | None
    native_max_steps: int | None
    version: str | None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider, "env_id": self.env_id, "observation_space": self.observation_space,
            "action_space": self.action_space, "obs_shape": list(self.obs_shape), "obs_dtype": self.obs_dtype,
            "n_actions": self.n_actions, "action_meanings": list(self.action_meanings),
            "render_shape": list(self.render_shape) if self.render_shape else None,
            "native_max_steps": self.native_max_steps, "version": self.version, "extra": dict(self.extra),
        }


class LaneBackend:
    """N lanes that step together and never autoreset.

    Attributes:
        num_envs: N.
        single_observation_space, single_action_space: gymnasium spaces of one lane.
        flags: names of extra provider flags :meth:`flag_values` can return (besides the
            ``terminated``, ``truncated`` and ``reward`` every backend has).
        has_ram: whether :meth:`ram` works.
        starts: the start states a reset can name (stable-retro save states, ``Corridor-v0``'s
            ``provider_args.starts``), or None when the environment has a single start. Only a
            backend with starts receives the ``starts`` argument of :meth:`reset_lanes`.
    """

    num_envs: int
    single_observation_space: Any
    single_action_space: Any
    flags: tuple[str, ...] = ()
    has_ram: bool = False
    starts: tuple[str, ...] | None = None

    def reset_lanes(self, lanes: Sequence[int], seeds: Sequence[int | None], *,
                    starts: Sequence[str | None] | None = None) -> tuple[list[np.ndarray], list[dict]]:
        """Reset ``lanes`` (ascending) with ``seeds`` (None = continue the lane's RNG).

        Args:
            lanes: lane indices, ascending.
            seeds: one per lane; None continues the lane's RNG stream.
            starts: one per lane, a name from :attr:`starts` or None for the environment's default
                start; only passed to backends whose :attr:`starts` is not None.

        Returns:
            (first observation per lane, reset info per lane), in the order of ``lanes``.
        """
        raise NotImplementedError

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        """Step every lane once.

        Args:
            actions: (N, *action_shape) actions.

        Returns:
            (obs (N, *obs_shape), native reward (N,) float, terminated (N,) bool, truncated (N,) bool,
            infos: N dicts). A lane that ended must be reset with :meth:`reset_lanes` before the
            next step.
        """
        raise NotImplementedError

    #: Whether :meth:`step_async` returns while the lanes step (ale-py's native vector env), so a
    #: caller can compute something else meanwhile; otherwise the step happens in :meth:`step_wait`.
    steps_in_background: bool = False

    def step_async(self, actions: np.ndarray) -> None:
        """Start :meth:`step` with ``actions``; :meth:`step_wait` returns its result.

        The default keeps the actions and steps in :meth:`step_wait`.
        """
        self._pending_actions = actions

    def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        """The result of the step :meth:`step_async` started (as :meth:`step` returns it)."""
        actions = self._pending_actions
        self._pending_actions = None
        return self.step(actions)

    def capture_state(self, lane: int) -> bytes:
        """Lane ``lane``'s complete state as portable bytes (:mod:`gradlab.envs.snapshot`), no pickle.

        Restoring it with :meth:`restore_state` in any process holding lanes of the same spec and
        stepping the same actions gives the same observations, rewards and flags.

        Raises:
            StateUnsupported: the provider's API cannot capture this environment's state (the default).
        """
        raise StateUnsupported(self.state_problem() or f"{type(self).__name__}: provider state capture is not supported")

    def restore_state(self, lane: int, state: bytes) -> np.ndarray:
        """Put lane ``lane`` back into a state :meth:`capture_state` wrote.

        Returns:
            The lane's observation in that state (*obs_shape).

        Raises:
            StateUnsupported: as for :meth:`capture_state`. IntegrityError: ``state`` is not a
                snapshot of this environment.
        """
        raise StateUnsupported(self.state_problem() or f"{type(self).__name__}: provider state restore is not supported")

    def state_problem(self) -> str | None:
        """Why :meth:`capture_state` cannot work here, or None when it can."""
        return f"{type(self).__name__}: provider state capture is not supported"

    def flag_values(self, name: str) -> np.ndarray:
        """(N,) values of provider flag ``name`` after the last step."""
        raise KeyError(name)

    def ram(self) -> np.ndarray:
        """(N, ram_size) uint8 RAM of every lane (only when ``has_ram``)."""
        raise NotImplementedError

    def render(self) -> list[np.ndarray]:
        """One RGB frame (H, W, 3) uint8 per lane."""
        raise NotImplementedError

    def close(self) -> None:
        return None


class Provider:
    """An environment family (``gradlab``, ``gymnasium``, ``ale``, ``vizdoom``, ``retro``...).

    Subclasses set ``name`` and ``package`` (the distribution whose version they report) and
    implement :meth:`env_ids`, :meth:`describe` and :meth:`make_backend`.
    """

    name: str = ""
    package: str | None = None
    #: Vectorisation used for ``vectorization: auto``: "sync", "async" or "native".
    default_vectorization: str = "sync"
    #: Whether the backends it makes step their lanes in the background
    #: (:attr:`LaneBackend.steps_in_background`), so lane groups can overlap stepping with the
    #: rollout's forward pass (:mod:`gradlab.envs.groups`).
    lanes_step_in_background: bool = False

    def version(self) -> str | None:
        if not self.package:
            return __version__
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(self.package)
        except PackageNotFoundError:
            return None

    def availability(self) -> tuple[bool, str]:
        """(available here, reason when not)."""
        return (self.version() is not None, "" if self.version() is not None else f"{self.package} is not installed")

    def env_ids(self) -> list[str]:
        raise NotImplementedError

    def describe(self, spec: EnvironmentSpec) -> EnvInfo:
        """Spaces, action meanings, render shape and native limit of ``spec``'s environment."""
        raise NotImplementedError

    def check(self, spec: EnvironmentSpec) -> list[tuple[str, str]]:
        """What stops ``spec`` from being built here, found without starting an emulator.

        The env id exists (with a did-you-mean), ``provider_args`` and ``preprocessing`` are valid
        for this provider, and files the environment needs (ROMs) are present. Must be cheap (no
        emulator, no environment instance): ``gradlab validate`` runs it for every goal.

        Returns:
            ``[(key, message)]``: ``key`` is the spec field at fault (``env_id``, ``provider_args``,
            ``preprocessing``); empty when the environment can be built. The default checks the env id
            against :meth:`env_ids` only.
        """
        ids = self.env_ids()
        if spec.env_id in ids:
            return []
        import difflib

        hint = difflib.get_close_matches(spec.env_id, ids, n=1)
        return [("env_id", f"provider '{self.name}' has no environment '{spec.env_id}'"
                 + (f" (did you mean {hint[0]}?)" if hint else ""))]

    def missing_files(self, spec: EnvironmentSpec) -> list[str]:
        """Files the user must supply before ``spec`` can be built on this machine (a ROM that is
        not bundled), each as a message saying what is missing and how to add it; empty when none is
        missing (the default). Cheap, like :meth:`check`, whose problems include these messages:
        ``gradlab validate`` reports them apart, as this machine's lack rather than the goal's fault."""
        return []

    def static_starts(self, spec: EnvironmentSpec) -> list[str] | None:
        """The named starts of ``spec``'s environment, when they are known without building it
        (stable-retro's save states); None when unknown (the default), and then ``eval.starts`` is
        checked when the environment is built."""
        return None

    def make_backend(self, spec: EnvironmentSpec, *, render_mode: str | None) -> LaneBackend:
        """Build ``spec.n_envs`` lanes of ``spec``'s environment (preprocessing applied)."""
        raise NotImplementedError

    def action_buttons(self, spec: EnvironmentSpec) -> tuple[str, ...] | None:
        """The button names an action profile of ``spec`` may press, or None when this provider
        takes no action profiles (the default). Cheap: no emulator (docs/ARCHITECTURE.md section 4)."""
        return None

    def native_action(self, spec: EnvironmentSpec, buttons: list[str]) -> Any:
        """The native action (an int or a button vector) that presses ``buttons`` together, in the
        action space :meth:`make_backend` builds when ``spec.action_profile`` is set.

        Raises:
            ValueError: a combination the provider cannot press (ALE: UP with DOWN).
        """
        raise ValueError(f"provider '{self.name}' has no action profiles")

    def semantic_args(self, spec: EnvironmentSpec) -> dict[str, Any]:
        """Provider conventions recorded in ``environment_sha256`` beyond the spec (none by default)."""
        return {}


def seed32(seed: int) -> int:
    """Map a gradlab seed (up to 2**31 + 2**30 for evaluation) into [0, 2**31 - 1) for emulators
    that take 32-bit seeds, without folding evaluation seeds onto training ones.

    Uses ``numpy.random.SeedSequence(seed).generate_state(1)`` masked to 31 bits: deterministic,
    and distinct seeds collide only by chance (probability ~2**-31 per pair).
    """
    return int(np.random.SeedSequence(int(seed)).generate_state(1, dtype=np.uint32)[0] & 0x7FFFFFFF)


def args_problems(model: type, spec: EnvironmentSpec) -> list[tuple[str, str]]:
    """``spec.provider_args`` checked against a pydantic ``model``, as :meth:`Provider.check` problems.

    Returns:
        ``[("provider_args.<key>", message)]``; an unknown key's message offers the closest field name.
    """
    import difflib

    from pydantic import ValidationError

    try:
        model.model_validate(spec.provider_args)
    except ValidationError as e:
        problems = []
        for err in e.errors(include_url=False):
            key = ".".join(str(p) for p in ("provider_args", *err["loc"]))
            if err["type"] == "extra_forbidden":
                valid = sorted(model.model_fields)
                hint = difflib.get_close_matches(str(err["loc"][-1]), valid, n=1)
                msg = "unknown key" + (f" (did you mean {hint[0]}?)" if hint
                                       else f" (expected one of: {', '.join(valid) or 'none'})")
            else:
                msg = f"{err['msg']} (found {err.get('input')!r})"
            problems.append((key, f"{spec.provider}:{spec.env_id}: {msg}"))
        return problems
    return []


def no_args_problems(spec: EnvironmentSpec) -> list[tuple[str, str]]:
    """Problems for a provider that takes no ``provider_args``."""
    return [(f"provider_args.{k}", f"{spec.provider}:{spec.env_id}: unknown key (this provider takes no provider_args)")
            for k in sorted(spec.provider_args)]
