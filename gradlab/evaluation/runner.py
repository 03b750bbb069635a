"""The evaluation runner: run every manifest episode exactly once and build the result.

:func:`run_evaluation` is what every backend calls (locally in a pool worker, or inside the Modal
function): verify the checkpoint, load its policy weights-only, rebuild the goal's evaluation
environment, check its ``environment_sha256`` against training's and the checkpoint's, run the
manifest, aggregate. :func:`evaluate_policy` does the same for any policy object (scripted policies
in tests); :func:`run_episodes` is the stepping loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.contracts.goal import Goal
from gradlab.errors import ContractViolation, IntegrityError
from gradlab.evaluation.acceptance import requires_perfect_success
from gradlab.evaluation.manifest import EpisodeManifest, build_manifest
from gradlab.evaluation.result import EpisodeRow, EvalRequest, EvalResult, PolicyMode, build_result

if TYPE_CHECKING:
    from gradlab.contracts.run_spec import RunSpec

logger = logging.getLogger(__name__)

#: Files evaluation loads from a checkpoint (weights-only: no unpickling).
WEIGHTS_ONLY_FILES = ("policy.safetensors", "policy_spec.json")


class Policy(Protocol):
    def act(self, obs: np.ndarray, *, deterministic: bool, rng: np.random.Generator | None) -> np.ndarray:
        """(N, *obs_shape) observations -> (N,) actions (or (N, *action_shape))."""
        ...


class StepObserver(Protocol):
    """What :func:`run_episodes` tells a recorder (``gradlab dataset record``) about every step.

    ``started`` is called once with the first observations (after the first reset); ``step`` after each vector step with the observations the actions were chosen on,
    the actions and the step's result; ``ended`` once per finished episode of a lane, with its row
    when the episode is a manifest episode and None when it ran beyond the lane's quota (discarded).
    """

    def started(self, obs: np.ndarray) -> None: ...

    def step(self, obs: np.ndarray, actions: np.ndarray, result: Any) -> None: ...

    def ended(self, lane: int, row: EpisodeRow | None) -> None: ...


def policy_rng(manifest: EpisodeManifest) -> np.random.Generator:
    """The action-sampling generator of an evaluation: seeded from the manifest hash, so reproducible."""
    return np.random.default_rng(int(manifest.sha256[:16], 16))


def run_episodes(
    venv: Any,
    manifest: EpisodeManifest,
    policy: Policy,
    *,
    deterministic: bool,
    rng: np.random.Generator,
    fail_fast: bool = False,
    max_steps: int | None = None,
    observer: StepObserver | None = None,
) -> list[EpisodeRow]:
    """Step a vector env until every lane has finished its manifest quota.

    Args:
        venv: a ``gradlab.envs.VectorEnv`` with ``manifest.n_lanes`` lanes whose first reset uses
            each lane's first manifest seed (``make_vector_env(..., lane_seeds=...)``).
        manifest: the episodes to run; lane ``l`` runs ``manifest.lane_queues()[l]`` in order.
        policy: ``act(obs (N, *obs_shape), deterministic=, rng=) -> (N,) actions``; a policy with
            ``after_step(step_result)`` (an action program) is told every step's result.
        deterministic: greedy actions (True) or sampled ones.
        rng: the generator passed to ``policy.act``.
        fail_fast: stop at the first completed episode whose outcome is not ``success`` (records
            of the same step in earlier lanes are kept; later lanes' are not).
        max_steps: safety limit on vector steps; None = unlimited.
        observer: told every step and every episode end (:class:`StepObserver`); None = nobody.

    Returns:
        Rows of completed manifest episodes, sorted by index. Episodes a lane runs beyond its quota
        are discarded, so every manifest episode counts exactly once.

    Raises:
        ContractViolation: the env's lane count differs from the manifest's, an episode record
            reports a seed or start other than the manifest's, the manifest has start states and
            the env has none (raised by ``set_next_start`` before the first reset, so before any
            episode runs), or ``max_steps`` was reached first.
    """
    queues = manifest.lane_queues()
    if venv.num_envs != manifest.n_lanes:
        raise ContractViolation(f"evaluation env has {venv.num_envs} lanes, the manifest plans {manifest.n_lanes}")
    has_starts = any(e.start is not None for e in manifest.episodes)

    def stage(lane: int, pos: int) -> None:
        """Make the lane's next reset start manifest episode ``queues[lane][pos]``."""
        if pos < len(queues[lane]):
            ident = queues[lane][pos]
            venv.set_next_seed(lane, ident.seed)
            if has_starts:
                venv.set_next_start(lane, ident.start)

    for lane in range(manifest.n_lanes):
        stage(lane, 0)
    obs = venv.reset()
    if observer is not None:
        observer.started(obs)
    for lane in range(manifest.n_lanes):
        stage(lane, 1)
    pos = [0] * manifest.n_lanes
    remaining = manifest.planned
    after_step = getattr(policy, "after_step", None)
    rows: list[EpisodeRow] = []
    steps = 0
    while remaining > 0:
        if max_steps is not None and steps >= max_steps:
            raise ContractViolation(
                f"evaluation did not finish {manifest.planned} episodes within {max_steps} vector steps "
                f"({manifest.planned - remaining} done)"
            )
        actions = np.asarray(policy.act(obs, deterministic=deterministic, rng=rng))
        res = venv.step(actions)
        if after_step is not None:  # an open-loop action program counts each lane's steps
            after_step(res)
        steps += 1
        if observer is not None:
            observer.step(obs, actions, res)
        obs = res.obs
        for rec in sorted(res.episodes, key=lambda r: r.lane):
            lane = rec.lane
            if pos[lane] >= len(queues[lane]):
                if observer is not None:
                    observer.ended(lane, None)
                continue  # beyond the lane's quota: discarded
            ident = queues[lane][pos[lane]]
            if rec.seed is not None and rec.seed != ident.seed:
                raise ContractViolation(
                    f"lane {lane}: episode {ident.index} should have been reset with seed {ident.seed}, "
                    f"the environment reports {rec.seed}"
                )
            if has_starts and getattr(rec, "start", None) != ident.start:
                raise ContractViolation(
                    f"lane {lane}: episode {ident.index} should have started from {ident.start!r}, "
                    f"the environment reports {getattr(rec, 'start', None)!r}"
                )
            row = EpisodeRow(
                index=ident.index, lane=lane, seed=ident.seed, start=ident.start,
                return_=float(rec.return_), raw_return=float(rec.raw_return), length=int(rec.length),
                outcome=rec.outcome, reason=rec.reason,
                progress={k: float(v) for k, v in sorted(rec.progress.items())},
            )
            rows.append(row)
            if observer is not None:
                observer.ended(lane, row)
            remaining -= 1
            pos[lane] += 1
            stage(lane, pos[lane] + 1)
            if fail_fast and row.outcome != "success":
                logger.info("fail-fast: episode %d ended %s (%s); %d of %d completed",
                            row.index, row.outcome, row.reason, len(rows), manifest.planned)
                return sorted(rows, key=lambda r: r.index)
    return sorted(rows, key=lambda r: r.index)


def environment_hash(environment: EnvironmentSpec) -> str:
    from gradlab.contracts.experiments import environment_sha256

    return environment_sha256(environment)


def evaluate_policy(
    policy: Policy,
    *,
    goal: Goal,
    environment: EnvironmentSpec,
    hashes: Mapping[str, str],
    checkpoint_sha256: str,
    checkpoint_step: int,
    run_id: str | None = None,
    episodes: int | None = None,
    policy_mode: PolicyMode | None = None,
    max_steps: int | None = None,
) -> EvalResult:
    """Evaluate any policy object on the goal's manifest.

    Args:
        policy: ``act(obs, *, deterministic, rng)``.
        goal: the goal (manifest, action mode, rules).
        environment: the effective evaluation environment (lane count replaced by the manifest's).
        hashes: ``goal_contract_sha256``, ``recipe_sha256``, ``environment_sha256`` the result
            is computed under; ``environment_sha256`` is checked against ``environment``.
        checkpoint_sha256, checkpoint_step: identity of what is evaluated.
        episodes, policy_mode: protocol overrides (``gradlab eval``); None = the goal's.
        max_steps: safety limit on vector steps.

    Raises:
        ContractViolation: the environment's hash is not ``hashes["environment_sha256"]``, or see
            :func:`run_episodes`.
    """
    from gradlab.envs import make_vector_env

    started = time.perf_counter()
    env_hash = environment_hash(environment)
    if "environment_sha256" in hashes and hashes["environment_sha256"] != env_hash:
        raise ContractViolation(
            f"evaluation environment sha256 {env_hash} differs from the training environment's "
            f"{hashes['environment_sha256']}"
        )
    manifest = build_manifest(goal, episodes=episodes)
    mode: PolicyMode = policy_mode or goal.eval.policy
    queues = manifest.lane_queues()
    env_spec = environment.model_copy(update={"n_envs": manifest.n_lanes})
    venv = make_vector_env(env_spec, seed=manifest.base_seed, lane_seeds=[q[0].seed for q in queues])
    try:
        rows = run_episodes(
            venv, manifest, policy, deterministic=(mode == "deterministic"), rng=policy_rng(manifest),
            fail_fast=requires_perfect_success(goal.eval.acceptance), max_steps=max_steps,
        )
    finally:
        venv.close()
    all_hashes = {k: hashes[k] for k in ("goal_contract_sha256", "recipe_sha256") if k in hashes}
    all_hashes.update(environment_sha256=env_hash, episode_manifest_sha256=manifest.sha256)
    result = build_result(
        rows, goal=goal, planned=manifest.planned, policy=mode, checkpoint_sha256=checkpoint_sha256,
        checkpoint_step=checkpoint_step, hashes=all_hashes, run_id=run_id,
        wall_s=round(time.perf_counter() - started, 3),
    )
    logger.info("evaluated checkpoint %s (step %d): %s, %d/%d episodes, return mean %.3f",
                checkpoint_sha256[:16], checkpoint_step, result.verdict, result.completed, result.planned,
                result.aggregates["eval/episode/return/mean"])
    return result


def verify_weights_only(path: Path) -> Any:
    """Check the manifest and the files evaluation loads (policy weights and spec) only.

    Used where only those files were shipped (the Modal backend, a published repository).

    Raises:
        NotFound: no manifest. IntegrityError: a loaded file is missing or differs from the manifest.
    """
    from gradlab.checkpoints import read_manifest
    from gradlab.checkpoints.bundle import file_sha256

    manifest = read_manifest(path)
    for name in WEIGHTS_ONLY_FILES:
        entry = manifest.files.get(name)
        if entry is None:
            raise IntegrityError(f"{path / 'manifest.json'}: does not list {name}")
        fpath = path / name
        if not fpath.is_file():
            raise IntegrityError(f"{fpath}: listed in the manifest but missing")
        digest = file_sha256(fpath)
        if digest != entry.sha256:
            raise IntegrityError(f"{fpath}: sha256 expected {entry.sha256}, found {digest}")
    return manifest


def parse_spec(spec: Mapping[str, Any], *, source: str = "evaluation request") -> RunSpec:
    """Validate a run spec's JSON.

    Raises:
        ContractViolation: naming the first bad key paths.
    """
    from pydantic import ValidationError

    from gradlab.contracts.run_spec import RunSpec

    try:
        return RunSpec.model_validate(spec)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()[:5])
        raise ContractViolation(f"{source}: spec is not a valid run spec: {problems}") from None


def checked_policy(req: EvalRequest) -> tuple[Policy, RunSpec, Any]:
    """Verify a request's checkpoint against the request and its run spec, then load its policy weights-only.

    Returns:
        ``(policy, run spec, checkpoint manifest)``.

    Raises:
        As :func:`run_evaluation`.
    """
    spec = parse_spec(req.spec)
    path = Path(req.checkpoint_dir)
    if req.verify == "full":
        from gradlab.checkpoints import verify_checkpoint

        manifest = verify_checkpoint(path)
    else:
        manifest = verify_weights_only(path)
    where = f"checkpoint {path}"
    if manifest.sha256 != req.checkpoint_sha256:
        raise IntegrityError(f"{where}: sha256 expected {req.checkpoint_sha256}, found {manifest.sha256}")
    if manifest.step != req.checkpoint_step:
        raise IntegrityError(f"{where}: step expected {req.checkpoint_step}, found {manifest.step}")
    for key in ("goal_contract_sha256", "recipe_sha256", "environment_sha256"):
        if getattr(manifest, key) != getattr(spec, key):
            raise ContractViolation(f"{where}: {key} is {getattr(manifest, key)}, the run spec says {getattr(spec, key)}")
    train_hash = environment_hash(spec.environment)
    if train_hash != spec.environment_sha256:
        raise ContractViolation(f"run spec {spec.run_id}: environment hashes to {train_hash}, "
                                f"the spec records {spec.environment_sha256}")
    from gradlab.checkpoints import load_policy

    return load_policy(path, verify=False), spec, manifest  # verified above


def run_evaluation(request: EvalRequest | Mapping[str, Any]) -> EvalResult:
    """Evaluate a checkpoint on its goal's manifest (what every backend runs).

    Args:
        request: the request or its JSON.

    Returns:
        The result (docs/ARCHITECTURE.md section 8 shape).

    Raises:
        NotFound: no checkpoint at ``checkpoint_dir``.
        IntegrityError: a checkpoint file fails its sha256, or the checkpoint's hash or step is not
            the requested one.
        ContractViolation: the checkpoint was trained under another goal, recipe or environment
            than the spec says, or the spec's evaluation environment hashes differently from its
            training environment.
    """
    req = request if isinstance(request, EvalRequest) else EvalRequest.model_validate(request)
    policy, spec, manifest = checked_policy(req)
    return evaluate_policy(
        policy, goal=spec.goal, environment=spec.eval_environment, hashes=spec.hashes,
        checkpoint_sha256=manifest.sha256, checkpoint_step=manifest.step, run_id=spec.run_id,
        episodes=req.episodes, policy_mode=req.policy,
    )


def run_evaluation_json(request: Mapping[str, Any]) -> dict[str, Any]:
    """JSON in, JSON out: the entry point of pool workers and the Modal function."""
    return run_evaluation(EvalRequest.model_validate(request)).as_json()
