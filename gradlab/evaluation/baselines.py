"""Reference policies on a goal's manifest: ``random`` (uniform over the action space) and ``noop``.

A baseline result is an ordinary :class:`~gradlab.evaluation.result.EvalResult` of the goal's fixed
episode manifest, so it compares directly with a checkpoint's. Its identity stands where a
checkpoint's would: ``checkpoint_sha256`` (and ``recipe_sha256``) is the sha256 of the canonical
JSON ``{"format": "gradlab.baseline/1", "policy": <name>}``, ``checkpoint_step`` is 0, ``run_id`` None.
Results are stored in the eval store at ``baselines/<goal_id>/<name>-<manifest sha16>.json``
(create-only; ``wall_s`` is stored as 0 so a re-run writes the same bytes) and read back with their
hashes checked (docs/ARCHITECTURE.md section 7).

* ``random``: each lane's action drawn uniformly from the action space with the evaluation's
  generator (seeded from the manifest hash: the same episodes every time), whatever the goal's
  action mode.
* ``noop``: action 0 (ALE's NOOP) for Discrete spaces, the zero vector for MultiDiscrete /
  MultiBinary, the zero action clipped to the bounds for Box.

A goal's ``reference_scores`` (e.g. ``{human: 30.5}``) with the random baseline give the normalised
score ``(score - random) / (reference - random)`` (Mnih et al. 2015, "Human-level control through
deep reinforcement learning", Methods: human-normalised score).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from gradlab.contracts.goal import Goal
from gradlab.contracts.hashing import sha256_json
from gradlab.errors import ConfigError, Conflict, ContractViolation, NotFound
from gradlab.evaluation.result import EvalResult, validate_result

BASELINES = ("random", "noop")
#: How each baseline acts, whatever the goal's action mode its result records (the protocol's, so
#: it validates against the goal): ``random`` samples (seeded, so reproducible), ``noop`` never varies.
BASELINE_ACTIONS = {"random": "stochastic", "noop": "deterministic"}


def baseline_sha256(name: str) -> str:
    """The identity of a baseline policy (in place of a checkpoint sha256)."""
    return sha256_json({"format": "gradlab.baseline/1", "policy": name})


class BaselinePolicy:
    """``act(obs, *, deterministic, rng)`` of a reference policy over a gymnasium action space."""

    def __init__(self, name: str, action_space: Any):
        if name not in BASELINES:
            raise ConfigError(f"--baseline: expected one of {', '.join(BASELINES)}, found {name!r}")
        self.name = name
        self.action_space = action_space

    def act(self, obs: np.ndarray, *, deterministic: bool, rng: np.random.Generator | None) -> np.ndarray:
        """(N, *obs_shape) -> (N,) int64 for Discrete, (N, *action_shape) otherwise."""
        from gymnasium import spaces

        n = len(obs)
        space = self.action_space
        rng = rng or np.random.default_rng()
        if isinstance(space, spaces.Discrete):
            if self.name == "noop":
                return np.full(n, int(space.start), dtype=np.int64)
            return rng.integers(0, int(space.n), size=n).astype(np.int64) + int(space.start)
        if isinstance(space, spaces.MultiDiscrete):
            nvec = np.asarray(space.nvec)
            if self.name == "noop":
                return np.zeros((n, *nvec.shape), dtype=np.int64)
            return (rng.random((n, *nvec.shape)) * nvec).astype(np.int64)
        if isinstance(space, spaces.MultiBinary):
            shape = (n, *np.atleast_1d(space.n))
            return np.zeros(shape, dtype=np.int8) if self.name == "noop" else rng.integers(0, 2, shape).astype(np.int8)
        if isinstance(space, spaces.Box):
            low = np.broadcast_to(space.low, space.shape)
            high = np.broadcast_to(space.high, space.shape)
            if self.name == "noop":
                return np.repeat(np.clip(np.zeros(space.shape), low, high)[None], n, axis=0).astype(space.dtype)
            if not (np.isfinite(low).all() and np.isfinite(high).all()):
                raise ContractViolation("random baseline: the Box action space has infinite bounds")
            return rng.uniform(low, high, size=(n, *space.shape)).astype(space.dtype)
        raise ContractViolation(f"baselines support Discrete, MultiDiscrete, MultiBinary and Box actions, "
                                f"found {type(space).__name__}")


def _hashes(goal: Goal, name: str) -> dict[str, str]:
    from gradlab.contracts.experiments import environment_sha256, goal_contract_sha256

    return {"goal_contract_sha256": goal_contract_sha256(goal), "recipe_sha256": baseline_sha256(name),
            "environment_sha256": environment_sha256(goal.train.environment)}


def evaluate_baseline(goal: Goal, name: str, *, episodes: int | None = None) -> EvalResult:
    """Run baseline ``name`` on the goal's manifest (``episodes`` overrides N: not a protocol result).

    Raises:
        ConfigError: unknown baseline. ContractViolation: an action space the baseline cannot act in.
    """
    from gradlab.envs import make_vector_env
    from gradlab.evaluation.runner import evaluate_policy

    env = goal.eval_environment()
    probe = make_vector_env(env.model_copy(update={"n_envs": 1}), seed=0)
    try:
        policy = BaselinePolicy(name, probe.single_action_space)
    finally:
        probe.close()
    return evaluate_policy(policy, goal=goal, environment=env, hashes=_hashes(goal, name),
                           checkpoint_sha256=baseline_sha256(name), checkpoint_step=0, episodes=episodes)


def store_baseline(stores: Any, goal: Goal, name: str, result: EvalResult) -> str:
    """Write a protocol baseline result (create-only); returns its URL.

    Raises:
        ContractViolation: the result is not the goal's protocol or not this baseline's.
        Conflict: a different result is stored for the same goal, baseline and manifest.
    """
    from gradlab.stores import keys

    validate_result(result, expected={"checkpoint_sha256": baseline_sha256(name), **_hashes(goal, name)}, goal=goal)
    key = keys.baseline_result(goal.goal_id, name, result.hashes["episode_manifest_sha256"])
    body = json.dumps(result.model_copy(update={"wall_s": 0.0}).as_json(), sort_keys=True, separators=(",", ":"))
    try:
        stores.eval.put_create_only(key, body.encode())
    except Conflict:
        raise Conflict(f"{stores.eval.url(key)}: a different {name} baseline result is stored for this manifest "
                       "(the goal's environment or gradlab's environments changed?)") from None
    return stores.eval.url(key)


def read_baselines(stores: Any, goal: Goal) -> dict[str, EvalResult]:
    """The stored baseline results of a goal's current manifest, by name, each validated against the goal.

    Raises:
        ContractViolation: a stored result does not check out (hashes, rows, aggregates).
    """
    from gradlab.evaluation.manifest import build_manifest
    from gradlab.stores import keys

    manifest = build_manifest(goal)
    out: dict[str, EvalResult] = {}
    for name in BASELINES:
        key = keys.baseline_result(goal.goal_id, name, manifest.sha256)
        try:
            data = json.loads(stores.eval.get(key))
        except NotFound:
            continue
        out[name] = validate_result(EvalResult.from_json(data, source=stores.eval.url(key)),
                                    expected={"checkpoint_sha256": baseline_sha256(name), **_hashes(goal, name)},
                                    goal=goal)
    return out


def normalised_score(score: float, *, random: float, reference: float) -> float:
    """``(score - random) / (reference - random)``; raises ContractViolation when reference == random."""
    if reference == random:
        raise ContractViolation(f"normalised score: reference {reference} equals the random baseline")
    return (score - random) / (reference - random)
