"""Preflight: build an environment exactly as training will, step random actions, check it.

Permanent errors (a missing ROM, a bad provider argument, a signal the provider cannot read, an
observation that does not fit its declared space) are found here, before compute is spent.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.errors import GradlabError


@dataclass
class PreflightReport:
    """What ``gradlab env preflight`` prints.

    Attributes:
        ok: every check passed.
        checks: ``[{"name", "ok", "detail"}]`` in the order run.
        obs_shape, obs_dtype: the per-lane observation seen (None when the env did not build).
        n_envs, steps: lanes and vector steps taken.
        episodes: episodes finished; ``outcomes`` counts them by outcome, ``reasons`` by reason.
        steps_per_s: lane steps per second of wall time, random actions included.
    """

    target: str
    provider: str
    env_id: str
    ok: bool = True
    checks: list[dict[str, Any]] = field(default_factory=list)
    obs_shape: list[int] | None = None
    obs_dtype: str | None = None
    action_space: str | None = None
    n_envs: int = 0
    steps: int = 0
    episodes: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)
    steps_per_s: float | None = None

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail})
        self.ok = self.ok and bool(ok)
        return bool(ok)

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("target", "provider", "env_id", "ok", "checks", "obs_shape", "obs_dtype",
                                               "action_space", "n_envs", "steps", "episodes", "outcomes", "reasons",
                                               "steps_per_s")}


def random_actions(space: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, *action_shape) uniformly random valid actions drawn from ``rng``."""
    from gymnasium.spaces import Box, Discrete, MultiBinary, MultiDiscrete

    if isinstance(space, Discrete):
        return space.start + rng.integers(0, space.n, size=n)
    if isinstance(space, MultiDiscrete):
        return space.start + rng.integers(0, space.nvec, size=(n, *space.nvec.shape))
    if isinstance(space, MultiBinary):
        return rng.integers(0, 2, size=(n, *space.shape)).astype(space.dtype)
    if isinstance(space, Box):
        low = np.where(np.isfinite(space.low), space.low, -1.0)
        high = np.where(np.isfinite(space.high), space.high, 1.0)
        return rng.uniform(low, high, size=(n, *space.shape)).astype(space.dtype)
    raise TypeError(f"unsupported action space {space}")


def preflight(spec: EnvironmentSpec, *, steps: int = 200, seed: int = 0, target: str = "") -> PreflightReport:
    """Build ``spec`` as training does and step ``steps`` vector steps of random actions.

    Checks: the env builds; observations (reset, every step, every final observation) have the
    declared shape and dtype and lie in the declared space; rewards are finite; no lane is both
    terminated and truncated; every finished episode has an outcome and a length >= 1.

    Returns:
        The report (``ok`` False when a check failed; never raises for an env problem).
    """
    from gradlab.envs.vector import make_vector_env

    rep = PreflightReport(target=target or f"{spec.provider}:{spec.env_id}", provider=spec.provider,
                          env_id=spec.env_id, n_envs=spec.n_envs)
    try:
        venv = make_vector_env(spec, seed=seed)
    except (GradlabError, ImportError, OSError) as e:
        rep.check("build", False, f"{type(e).__name__}: {e}")
        return rep
    rng = np.random.default_rng(seed)
    try:
        rep.check("build", True, f"{spec.n_envs} lane(s), vectorization {spec.vectorization}")
        space = venv.single_observation_space
        rep.action_space = str(venv.single_action_space)
        shape = tuple(space.shape or ())
        obs = venv.reset()
        rep.obs_shape, rep.obs_dtype = list(obs.shape[1:]), str(obs.dtype)
        rep.check("reset observation", obs.shape == (venv.num_envs, *shape) and obs.dtype == space.dtype
                  and all(space.contains(o) for o in obs),
                  f"expected ({venv.num_envs}, {shape}) {space.dtype} in {space}, found {obs.shape} {obs.dtype}")
        bad_obs = bad_final = bad_reward = both = 0
        outcomes: Counter[str] = Counter()
        reasons: Counter[str] = Counter()
        short = 0
        t0 = time.perf_counter()
        for _ in range(steps):
            res = venv.step(random_actions(venv.single_action_space, venv.num_envs, rng))
            if res.obs.shape != obs.shape or res.obs.dtype != obs.dtype:
                bad_obs += 1
            bad_reward += int(not np.all(np.isfinite(res.reward)) or not np.all(np.isfinite(res.raw_reward)))
            both += int(np.any(res.terminated & res.truncated))
            for o in res.final_obs.values():
                if o.shape != shape or o.dtype != space.dtype or not space.contains(o):
                    bad_final += 1
            for ep in res.episodes:
                outcomes[ep.outcome] += 1
                reasons[ep.reason] += 1
                short += int(ep.length < 1 or not math.isfinite(ep.return_))
        elapsed = time.perf_counter() - t0
        rep.steps = steps
        rep.steps_per_s = round(steps * venv.num_envs / elapsed, 1) if elapsed > 0 else None
        rep.episodes = sum(outcomes.values())
        rep.outcomes, rep.reasons = dict(outcomes), dict(reasons)
        rep.check("step observations", bad_obs == 0, f"{bad_obs} step(s) with a wrong shape or dtype")
        rep.check("final observations", bad_final == 0, f"{bad_final} final observation(s) outside the declared space")
        rep.check("rewards finite", bad_reward == 0, f"{bad_reward} step(s) with a non-finite reward")
        rep.check("terminal wins over truncated", both == 0, f"{both} step(s) with both flags set")
        rep.check("episode records", short == 0, f"{short} episode(s) with length < 1 or a non-finite return")
    except Exception as e:  # noqa: BLE001 - a preflight reports, it does not crash
        rep.check("stepping", False, f"{type(e).__name__}: {e}")
    finally:
        venv.close()
    return rep


def static_check(spec: EnvironmentSpec, *, missing: list[str] | None = None) -> list[tuple[str, str]]:
    """What stops ``spec`` from being built on this machine, found without starting an emulator.

    The provider is registered and available, the env id exists in it (did-you-mean on a typo),
    ``provider_args`` are valid and the ROM it needs is present (:meth:`Provider.check`). Cheap:
    ``gradlab validate`` runs it for every goal and ``gradlab train`` before it creates a run.

    Args:
        spec: the environment.
        missing: when given, files this machine lacks (:meth:`Provider.missing_files`: a ROM to
            import) are appended here as messages instead of being returned as problems.

    Returns:
        ``[(key, message)]`` with ``key`` the field of the environment spec at fault; empty when fine.
    """
    from gradlab.envs.registry import get_provider
    from gradlab.errors import NotFound

    try:
        provider = get_provider(spec.provider)
    except NotFound as e:
        return [("provider", str(e))]
    available, reason = provider.availability()
    if not available:
        return [("provider", f"provider '{spec.provider}' is not available here: {reason}")]
    try:
        from gradlab.envs.action_profile import profile_problems

        problems = provider.check(spec) + profile_problems(provider, spec)
        if missing is not None:
            lacking = provider.missing_files(spec)
            missing += lacking
            problems = [p for p in problems if p[1] not in lacking]
        return problems
    except Exception as e:  # noqa: BLE001 - a broken third-party provider is a problem to report, not a crash
        return [("", f"{spec.provider}:{spec.env_id}: cannot be checked: {type(e).__name__}: {e}")]


def missing_files(spec: EnvironmentSpec) -> list[str]:
    """What this machine lacks to build ``spec`` (:meth:`Provider.missing_files`: a ROM to import),
    as messages saying how to add it; empty when nothing is missing or the provider is unusable
    (:func:`static_check` says why). Cheap: no emulator."""
    from gradlab.envs.registry import get_provider

    try:
        provider = get_provider(spec.provider)
        return provider.missing_files(spec) if provider.availability()[0] else []
    except Exception:  # noqa: BLE001 - static_check reports a broken provider
        return []


#: Providers whose observations are always images (uint8 frames; gradlab.learn.ppo_net.is_image).
IMAGE_PROVIDERS = ("ale", "vizdoom", "retro")


def cuda_present() -> bool:
    """An NVIDIA driver is loaded (what ``torch.cuda.is_available()`` needs first), found without torch."""
    from pathlib import Path

    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidiactl").exists()


def state_capture_problem(env: EnvironmentSpec) -> str | None:
    """Why ``env``'s lanes cannot capture their state, known from the spec alone; None when they may.

    ViZDoom never captures (its save/load are savegame files); ale-py's native vector env does not
    (``provider_args.single_lanes: true`` gives lanes that do). Other providers are asked when the
    env is built (``LaneBackend.state_problem``, docs/ARCHITECTURE.md section 12a).
    """
    if env.provider == "vizdoom":
        return (f"restores provider states, which {env.provider}:{env.env_id} cannot capture (ViZDoom's "
                "save/load are savegame files without a step-exact replay guarantee)")
    if env.provider == "ale" and not (env.provider_args or {}).get("single_lanes"):
        return (f"restores provider states, which {env.provider}:{env.env_id} cannot capture in ale-py's native "
                "vector env; set train.environment.provider_args.single_lanes: true")
    return None


def training_problems(resolved: Any) -> list[tuple[str, str]]:
    """Recipe settings the learner would refuse for this environment, found without building it.

    ``gradlab.ppo`` with ``precision: fp16-amp`` on CPU (``train.device: cpu``, or ``auto`` where
    the learner picks the CPU: vector observations, or no NVIDIA driver), and
    ``train.curriculum.archive`` where the lanes cannot capture their state
    (:func:`state_capture_problem`) or with frame cells on vector observations: the same messages
    :class:`gradlab.learn.ppo.PPOBackend` gives when it sets up (docs/ARCHITECTURE.md section 3).

    Returns:
        ``[(dotted key path, message)]``; empty when fine.
    """
    train, env = resolved.recipe.train, resolved.environment
    if train.backend.id != "gradlab.ppo":
        return []
    problems: list[tuple[str, str]] = []
    archive = train.archive_curriculum
    if archive is not None and (why := state_capture_problem(env)) is not None:
        problems.append(("train.curriculum.archive", why))
    elif archive is not None and archive.cell.kind == "frame" and env.provider not in IMAGE_PROVIDERS:
        problems.append(("train.curriculum.archive.cell.kind",
                         f"frame cells need image observations, and {env.provider}:{env.env_id} gives vectors; "
                         "use cell.kind: signals"))
    images = env.provider in IMAGE_PROVIDERS
    if train.backend.config.get("precision") == "fp16-amp" and (
            train.device == "cpu" or (train.device == "auto" and not (images and cuda_present()))):
        problems.append(("train.backend.config.precision", "fp16-amp needs device cuda; use bf16 on CPU"))
    return problems


def environment_problems(experiments: Any, refs: list[str] | None = None, *,
                         missing: list[Any] | None = None) -> list[Any]:
    """:func:`static_check` of every goal's training environment (and of a recipe's, where it
    changes the provider, env id or provider arguments), as ``ConfigProblem``s naming the file and
    ``train.environment.<key>``; and each goal's ``eval.starts`` against the starts the provider
    knows without building the environment (:meth:`Provider.static_starts`).

    Args:
        experiments: a :class:`gradlab.contracts.Experiments`.
        refs: ``GOAL/RECIPE`` refs to check (their goals and recipes only); None checks every goal
            and recipe. Goals or recipes that do not compose are skipped (``validate`` reports those).
        missing: when given, what this machine lacks to build a goal (a ROM to import) is appended
            here as ``ConfigProblem``s, one per goal, instead of being returned as problems.
    """
    from gradlab.errors import ConfigError, ConfigProblem, NotFound

    def identity(spec: EnvironmentSpec) -> tuple:
        import json

        return spec.provider, spec.env_id, json.dumps(spec.provider_args, sort_keys=True, default=str)

    cache: dict[tuple, tuple[list[tuple[str, str]], list[str]]] = {}

    def check(spec: EnvironmentSpec, file_of: Any, label: str) -> list[tuple[str, str]]:
        key = identity(spec)
        if key not in cache:
            lacking: list[str] = []
            cache[key] = static_check(spec, missing=lacking if missing is not None else None), lacking
        found, lacking = cache[key]
        if missing is not None:
            missing.extend(file_of(("env_id",), f"{label}: {message}") for message in lacking)
        return found

    wanted: dict[str, list[str] | None] = {}
    if refs is None:
        wanted = {goal_id: None for goal_id in experiments.goal_ids()}
    else:
        for ref in refs:
            goal_id, _, recipe_id = ref.rpartition("/")  # a nested goal id keeps its '/'
            wanted.setdefault(goal_id, []).append(recipe_id)  # type: ignore[union-attr]
    problems: list[ConfigProblem] = []
    for goal_id, recipe_ids in wanted.items():
        try:
            goal = experiments.load_goal(goal_id)
        except (ConfigError, NotFound):
            continue
        goal_env = goal.train.environment

        def goal_problem(key: tuple[str, ...], message: str, goal_id: str = goal_id) -> ConfigProblem:
            return experiments.goal_problem(goal_id, ("train", "environment", *key), message)

        for key, message in check(goal_env, goal_problem, f"goal {goal_id}"):
            problems.append(goal_problem(tuple(key.split(".")), message))
        problems += start_problems(experiments, goal_id, goal)
        for recipe_id in (experiments.recipe_ids(goal_id) if recipe_ids is None else recipe_ids):
            try:
                resolved = experiments.resolve(f"{goal_id}/{recipe_id}")
            except (ConfigError, NotFound):
                continue
            problems += [ConfigProblem(file=resolved.recipe_file, key_path=key, message=message)
                         for key, message in training_problems(resolved)]
            if identity(resolved.environment) == identity(goal_env):
                continue

            def recipe_problem(key: tuple[str, ...], message: str, file: str = resolved.recipe_file) -> ConfigProblem:
                return ConfigProblem(file=file, key_path=".".join(("train", "environment", *key)), message=message)

            for key, message in check(resolved.environment, recipe_problem, f"recipe {goal_id}/{recipe_id}"):
                problems.append(ConfigProblem(file=resolved.recipe_file,
                                              key_path=".".join(("train", "environment", key)).rstrip("."),
                                              message=message))
    return problems


def start_problems(experiments: Any, goal_id: str, goal: Any) -> list[Any]:
    """``eval.starts`` names the provider does not know, where it knows its starts without building
    the environment (:meth:`Provider.static_starts`), as ``ConfigProblem``s at ``eval.starts.<i>``."""
    from gradlab.envs.registry import get_provider

    if not goal.eval.starts:
        return []
    try:
        known = get_provider(goal.train.environment.provider).static_starts(goal.train.environment)
    except Exception:  # noqa: BLE001 - static_check reports an unusable provider
        return []
    if known is None:
        return []
    return [experiments.goal_problem(goal_id, ("eval", "starts", str(i)),
                                     f"expected one of {goal.train.environment.provider}:"
                                     f"{goal.train.environment.env_id}'s starts {known}, found {start!r}")
            for i, start in enumerate(goal.eval.starts) if start not in known]
