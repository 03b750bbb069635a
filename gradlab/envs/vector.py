"""The vector env every part of gradlab steps: lanes + task program + same-step autoreset.

Autoreset, explicitly: a lane backend never resets on its own. When the task program ends a
lane's episode (terminated or truncated), :meth:`VectorEnv.step` keeps the lane's true final
observation in ``final_obs``, resets that lane at once, and returns the new episode's first
observation in ``obs``. So every transition a caller sees is real: no reset-step transition, no
final observation paired with a reset observation.

Lane seeds: the first reset of lane ``i`` uses ``seed * 1024 + i`` (training; below
``EVAL_SEED_OFFSET`` since ``seed <= MAX_RUN_SEED``) or ``lane_seeds[i]`` (evaluation). Later
episodes continue each lane's own RNG stream unless :meth:`VectorEnv.set_next_seed` names a seed.
Likewise every reset uses the environment's default start unless :meth:`VectorEnv.set_next_start`
names one of its start states (providers with several: stable-retro save states, ``Corridor-v0``).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.contracts.seeds import EVAL_SEED_OFFSET, MAX_RUN_SEED
from gradlab.envs.backend import LaneBackend
from gradlab.envs.records import EpisodeRecord, StepResult
from gradlab.envs.task import TaskRunner, signal_array
from gradlab.errors import ConfigError, ContractViolation

logger = logging.getLogger(__name__)

#: Lane seed stride: training lane seed = run seed * LANE_SEED_STRIDE + lane (contract: n_envs <= 1024).
LANE_SEED_STRIDE = 1024
_BASE_FLAGS = ("terminated", "truncated", "reward")


def training_lane_seeds(seed: int, n_envs: int) -> list[int]:
    """Lane seeds of a training run: ``seed * 1024 + lane``, all below ``EVAL_SEED_OFFSET``.

    Raises:
        ConfigError: seed outside [0, MAX_RUN_SEED] or more than 1024 lanes.
    """
    if not 0 <= seed <= MAX_RUN_SEED:
        raise ConfigError(f"seed: expected 0..{MAX_RUN_SEED}, found {seed}")
    if n_envs > LANE_SEED_STRIDE:
        raise ConfigError(f"n_envs: expected at most {LANE_SEED_STRIDE}, found {n_envs}")
    seeds = [seed * LANE_SEED_STRIDE + lane for lane in range(n_envs)]
    if seeds and seeds[-1] >= EVAL_SEED_OFFSET:  # pragma: no cover - guaranteed by the bounds above
        raise ConfigError("training lane seeds would overlap evaluation seeds")
    return seeds


class VectorEnv:
    """N lanes of one environment with the task program applied (see the module docstring).

    Attributes:
        num_envs: N.
        single_observation_space, single_action_space: gymnasium spaces of one lane.
        spec: the environment contract it was built from.
        task: the :class:`TaskRunner` (per-lane step counts and returns).
    """

    def __init__(self, spec: EnvironmentSpec, backend: LaneBackend, lane_seeds: list[int]):
        self.spec = spec
        self.backend = backend
        self.num_envs = backend.num_envs
        self.single_observation_space = backend.single_observation_space
        self.single_action_space = backend.single_action_space
        if len(lane_seeds) != self.num_envs:
            raise ContractViolation(f"lane_seeds: expected {self.num_envs} seeds, found {len(lane_seeds)}")
        self._initial_seeds: list[int | None] = list(lane_seeds)
        self._next_seeds: dict[int, int] = {}
        self._next_starts: dict[int, str] = {}
        self._start_draws: tuple[list[str], np.ndarray, list[np.random.Generator]] | None = None
        self._started = False
        self._closed = False
        self.task = TaskRunner(spec.task, self.num_envs)
        self._readers = self._compile_signals(spec)
        self._obs_shape = tuple(self.single_observation_space.shape or ())
        from gymnasium.spaces import Discrete

        self._discrete = isinstance(self.single_action_space, Discrete)
        self._action_shape = (self.num_envs,)
        # No signals: step through TaskRunner.step_native (same results, fewer array operations).
        self._simple = self.task.simple and not self._readers

    # -- signals ---------------------------------------------------------------------------
    def _compile_signals(self, spec: EnvironmentSpec) -> list[tuple[str, str, Any]]:
        readers: list[tuple[str, str, Any]] = []
        problems = []
        for name, sig in spec.task.signals.items():
            if sig.source == "info":
                readers.append((name, "info", sig.key))
            elif sig.source == "flag":
                if sig.key not in _BASE_FLAGS and sig.key not in self.backend.flags:
                    known = ", ".join((*_BASE_FLAGS, *self.backend.flags))
                    problems.append(f"task.signals.{name}.key: provider '{spec.provider}' has no flag "
                                    f"'{sig.key}' (flags: {known})")
                readers.append((name, "flag", sig.key))
            else:
                if not self.backend.has_ram:
                    problems.append(f"task.signals.{name}.source: provider '{spec.provider}' does not expose RAM "
                                    f"for {spec.env_id}")
                readers.append((name, "ram", sig.byte_addresses()))
        if problems:
            raise ConfigError("; ".join(problems))
        return readers

    def _read_signals(self, infos: list[dict], flags: dict[str, np.ndarray] | None,
                      n: int) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        ram = None
        for name, source, key in self._readers:
            if source == "info":
                out[name] = signal_array([info.get(key) for info in infos], n)
            elif source == "flag":
                if flags is None:
                    out[name] = np.full(n, math.nan)
                elif key in flags:
                    out[name] = signal_array(flags[key], n)
                else:
                    out[name] = signal_array(self.backend.flag_values(key), n)
            else:
                if ram is None:
                    ram = self.backend.ram()
                if max(key) >= ram.shape[1]:
                    raise ConfigError(f"task.signals.{name}.address: {max(key)} is past the end of "
                                      f"{self.spec.provider}:{self.spec.env_id}'s RAM ({ram.shape[1]} bytes)")
                value = ram[:, key[0]].astype(np.float64)
                for address in key[1:]:  # several bytes, most significant first
                    value = value * 256.0 + ram[:, address]
                out[name] = value
        return out

    # -- public API ------------------------------------------------------------------------
    def set_next_seed(self, lane: int, seed: int) -> None:
        """Make ``lane``'s next reset use ``seed`` (evaluation manifests)."""
        if not 0 <= lane < self.num_envs:
            raise ContractViolation(f"lane: expected 0..{self.num_envs - 1}, found {lane}")
        self._next_seeds[lane] = int(seed)

    def set_next_start(self, lane: int, start: str | None) -> None:
        """Make ``lane``'s next reset begin from the named start state (evaluation manifests).

        One-shot, like :meth:`set_next_seed`: later resets of the lane use the environment's
        default start again unless named anew. ``None`` clears a pending start. The start is
        reported as ``EpisodeRecord.start`` (and ``"start"`` in ``info["gradlab_episode"]``).
        Starts map to: stable-retro save states (``retro``: ``load_state`` before the reset);
        ``Corridor-v0``'s and ``KeyDoor-v0``'s ``provider_args.starts`` (``gradlab``).

        Args:
            lane: 0..N-1.
            start: a name from ``self.starts``, or None.

        Raises:
            ContractViolation: lane out of range; the provider has no start states for this
                environment (naming provider and env id); ``start`` is not one of its starts.
        """
        if not 0 <= lane < self.num_envs:
            raise ContractViolation(f"lane: expected 0..{self.num_envs - 1}, found {lane}")
        where = f"{self.spec.provider}:{self.spec.env_id}"
        if not self.starts:
            raise ContractViolation(
                f"{where} has no start states, found start {start!r} (eval.starts needs a provider with several: "
                "retro save states, or gradlab Corridor-v0 / KeyDoor-v0 with provider_args.starts)")
        if start is None:
            self._next_starts.pop(lane, None)
            return
        if start not in self.starts:
            raise ContractViolation(f"{where}: start: expected one of {list(self.starts)}, found {start!r}")
        self._next_starts[lane] = start

    def draw_starts(self, weights: dict[str, float], *, seed: int) -> None:
        """From now on, each lane's episode begins from a start drawn with ``weights`` (training).

        A start named with :meth:`set_next_start` still wins for its episode. Lane ``i`` draws from
        its own generator, seeded by ``(seed, lane i's first-reset seed)``, so a lane's sequence of
        starts depends on the run seed and the lane only: the same in one vector env or in lane
        groups (:mod:`gradlab.envs.groups`), and reproducible run to run.

        Args:
            weights: start name -> probability (>= 0, summing to 1), names from :attr:`starts`.
            seed: the run seed.

        Raises:
            ContractViolation: the environment has no start states, or a name is not one of them.
        """
        where = f"{self.spec.provider}:{self.spec.env_id}"
        if not self.starts:
            raise ContractViolation(f"{where} has no start states, found train.starts {sorted(weights)}")
        unknown = [n for n in weights if n not in self.starts]
        if unknown:
            raise ContractViolation(f"{where}: start: expected one of {list(self.starts)}, found {unknown[0]!r}")
        names = list(weights)
        probs = np.array([weights[n] for n in names], dtype=np.float64)
        rngs = [np.random.default_rng(np.random.SeedSequence([_START_STREAM, int(seed), int(lane_seed or 0)]))
                for lane_seed in self._initial_seeds]
        self._start_draws = (names, probs / probs.sum(), rngs)

    @property
    def starts(self) -> tuple[str, ...] | None:
        """The start states :meth:`set_next_start` accepts, or None when the environment has one start."""
        starts = getattr(self.backend, "starts", None)
        return tuple(starts) if starts else None

    def _reset_backend(self, lanes: list[int], seeds: list[int | None]) -> tuple[list[np.ndarray], list[dict],
                                                                                  list[str | None] | None]:
        """Reset ``lanes`` in the backend with their pending starts; returns (obs, infos, starts or None)."""
        if self._start_draws is not None:  # training: every episode without a named start draws one
            names, probs, rngs = self._start_draws
            for lane in lanes:
                if lane not in self._next_starts:
                    self._next_starts[lane] = names[int(rngs[lane].choice(len(names), p=probs))]
        if not self._next_starts:
            obs, infos = self.backend.reset_lanes(lanes, seeds)
            return obs, infos, None
        starts = [self._next_starts.pop(lane, None) for lane in lanes]
        obs, infos = self.backend.reset_lanes(lanes, seeds, starts=starts)
        return obs, infos, starts

    def _seed_for(self, lane: int) -> int | None:
        if lane in self._next_seeds:
            return self._next_seeds.pop(lane)
        if not self._started:
            return self._initial_seeds[lane]
        return None

    def reset(self) -> np.ndarray:
        """Reset every lane.

        Returns:
            (N, *obs_shape) first observations.
        """
        lanes = list(range(self.num_envs))
        seeds = [self._seed_for(lane) for lane in lanes]
        self._started = True
        obs_list, infos, starts = self._reset_backend(lanes, seeds)
        obs = np.stack(obs_list)
        sigs = self._read_signals(infos, None, self.num_envs) if self._readers else None
        self.task.reset_lanes(lanes, seeds, sigs, starts=starts)
        return obs

    def step(self, actions: np.ndarray) -> StepResult:
        """Step every lane once (see :class:`gradlab.envs.records.StepResult`).

        A task program without signals goes through :meth:`TaskRunner.step_native`, which gives
        the same results as the general path with fewer array operations per step.

        Args:
            actions: (N,) int for discrete action spaces, (N, *action_shape) otherwise.

        Raises:
            ContractViolation: actions of the wrong shape.
        """
        self.step_async(actions)
        return self.step_wait()

    @property
    def steps_in_background(self) -> bool:
        """Whether the lanes step between :meth:`step_async` and :meth:`step_wait` (ale-py)."""
        return self.backend.steps_in_background

    def step_async(self, actions: np.ndarray) -> None:
        """Start a step of every lane with ``actions``; :meth:`step_wait` completes it.

        :meth:`step` is the two in a row. With a backend that ``steps_in_background`` the lanes
        step while the caller does other work (the rollout of another lane group).

        Raises:
            ContractViolation: actions of the wrong shape.
        """
        actions = np.asarray(actions)
        if self._discrete:
            if actions.shape != self._action_shape:
                raise ContractViolation(f"actions: expected shape {self._action_shape}, found {actions.shape}")
            if actions.dtype.kind not in "iu":
                actions = actions.astype(np.int64)
        self.backend.step_async(actions)

    def step_wait(self) -> StepResult:
        """The step :meth:`step_async` started: task program, same-step autoreset, the result."""
        obs, raw, nterm, ntrunc, infos = self.backend.step_wait()
        raw = np.asarray(raw, dtype=np.float64)
        fired: dict[str, np.ndarray] = {}
        components: dict[str, np.ndarray] = {}
        if self._simple:
            signals: dict[str, np.ndarray] = {}
            reward, terminated, truncated, episodes = self.task.step_native(
                raw, np.asarray(nterm, dtype=np.bool_), np.asarray(ntrunc, dtype=np.bool_))
        else:
            flags = {"terminated": nterm, "truncated": ntrunc, "reward": raw}
            signals = self._read_signals(infos, flags, self.num_envs) if self._readers else {}
            ts = self.task.step(raw, nterm, ntrunc, signals)
            reward, terminated, truncated, episodes = ts.reward, ts.terminated, ts.truncated, ts.episodes
            fired, components = ts.fired, ts.components or {}
        final_obs: dict[int, np.ndarray] = {}
        if episodes:
            self._autoreset(obs, infos, episodes, final_obs)
        return StepResult(obs=obs, reward=reward, raw_reward=raw.astype(np.float32), terminated=terminated,
                          truncated=truncated, final_obs=final_obs, episodes=episodes, infos=infos,
                          signals=signals, events=fired, components=components)

    def _autoreset(self, obs: np.ndarray, infos: list[dict], episodes: list[EpisodeRecord],
                   final_obs: dict[int, np.ndarray]) -> None:
        """Same-step autoreset of the lanes whose episode ended (updates ``obs``, ``infos``, ``final_obs``)."""
        lanes = [ep.lane for ep in episodes]
        seeds = [self._seed_for(lane) for lane in lanes]
        for lane in lanes:
            final_obs[lane] = obs[lane].copy()
        new_obs, reset_infos, starts = self._reset_backend(lanes, seeds)
        for lane, o in zip(lanes, new_obs, strict=True):
            obs[lane] = o
        if self._readers:
            base = self._read_signals(reset_infos, None, len(lanes))
            self.task.reset_lanes(lanes, seeds, base, starts=starts)
        else:
            self.task.reset_lanes(lanes, seeds, None, starts=starts)
        for ep in episodes:
            info = infos[ep.lane]
            info = dict(info) if info is not None else {}
            info["gradlab_episode"] = ep.as_json()
            infos[ep.lane] = info

    # -- provider state ----------------------------------------------------------------------
    def capture_lane(self, lane: int) -> bytes:
        """Lane ``lane`` mid-episode as portable bytes: the provider's state
        (``LaneBackend.capture_state``) and the task program's lane state, one snapshot
        (:mod:`gradlab.envs.snapshot`, kind ``gradlab.lane``).

        Raises:
            StateUnsupported: the provider cannot capture this environment's state.
        """
        from gradlab.envs.snapshot import Snapshot, pack

        provider = self.backend.capture_state(lane)
        return pack(Snapshot("gradlab.lane", meta={"task": self.task.lane_state(lane),
                                                   "env": f"{self.spec.provider}:{self.spec.env_id}"},
                             blobs={"provider": provider}))

    def restore_lane(self, lane: int, state: bytes) -> np.ndarray:
        """Put lane ``lane`` back into a :meth:`capture_lane` state (after :meth:`reset`); its
        episode continues from there (step count, returns and events included).

        Returns:
            The lane's observation there (*obs_shape).

        Raises:
            StateUnsupported: the provider cannot restore. IntegrityError: ``state`` is not a lane
                snapshot of this environment.
        """
        from gradlab.envs.snapshot import unpack
        from gradlab.errors import IntegrityError

        snap = unpack(state, kind="gradlab.lane")
        where = f"{self.spec.provider}:{self.spec.env_id}"
        if snap.meta["env"] != where:
            raise IntegrityError(f"provider state: a snapshot of {snap.meta['env']}, this env is {where}")
        obs = self.backend.restore_state(lane, snap.blobs["provider"])
        self.task.set_lane_state(lane, snap.meta["task"])
        return obs

    def render(self) -> list[np.ndarray]:
        """One RGB frame (H, W, 3) uint8 per lane (built with ``render_mode="rgb_array"``)."""
        return [np.asarray(frame) for frame in self.backend.render()]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.backend.close()

    def __enter__(self) -> VectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: Tags the RNG stream of training start draws (:meth:`VectorEnv.draw_starts`) apart from other streams.
_START_STREAM = 0x57A27


def make_vector_env(spec: EnvironmentSpec, *, seed: int, lane_seeds: list[int] | None = None,
                    render_mode: str | None = None) -> VectorEnv:
    """Build ``spec.n_envs`` lanes of ``spec`` with its task program, as training and evaluation do.

    Args:
        spec: the environment contract (provider, env id, preprocessing, task program, lanes).
        seed: the run seed; lane ``i``'s first reset uses ``seed * 1024 + i``.
        lane_seeds: explicit first-reset seed per lane (evaluation), overriding ``seed``.
        render_mode: ``"rgb_array"`` to enable :meth:`VectorEnv.render`.

    Raises:
        NotFound: unknown provider or env id. ConfigError: a provider argument, preprocessing or
        task signal the provider cannot honour; a missing ROM (with how to import it).
    """
    from gradlab.envs.registry import get_provider

    provider = get_provider(spec.provider)
    seeds = list(lane_seeds) if lane_seeds is not None else training_lane_seeds(seed, spec.n_envs)
    if spec.action_profile is not None:  # checked before an emulator starts
        from gradlab.envs.action_profile import ProfiledBackend, native_table

        table = native_table(provider, spec)
    backend = provider.make_backend(spec, render_mode=render_mode)
    if spec.action_profile is not None:
        backend = ProfiledBackend(backend, table, spec.action_profile.meanings)
    try:
        return VectorEnv(spec, backend, seeds)
    except BaseException:
        backend.close()
        raise
