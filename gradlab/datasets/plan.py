"""A recording's plan: which goal, agent and episodes, cut into chunks; the policy a chunk acts with.

:func:`plan_recording` resolves what ``gradlab dataset record`` names: the agent (a checkpoint
``RUN[:STEP]``, a checkpoint folder, ``hf://OWNER/NAME``, ``random``, ``noop``, or ``human``: a
person at the web player's keyboard), the goal (a
checkpoint's must be the named one), and the episode plan: the goal's evaluation manifest for N
episodes (docs/ARCHITECTURE.md section 7; ``base_seed`` replaces the goal's ``eval.seed``), cut into
consecutive chunks, one Prefect task each. The plan is plain JSON, so it travels to the workers.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from pydantic import Field

from gradlab.contracts.base import Contract
from gradlab.contracts.dataset import DatasetAgent, Determinism
from gradlab.errors import ConfigError
from gradlab.evaluation.manifest import EpisodeIdentity

DEFAULT_CHUNK_EPISODES = 50


class RecordingPlan(Contract):
    name: str
    recording_id: str
    staging_dir: str = Field(description="Local folder the chunks write into before the files are stored.")
    goal: dict[str, Any]
    environment: dict[str, Any]
    agent: DatasetAgent
    eval_request: dict[str, Any] | None = Field(default=None, description="kind checkpoint: the EvalRequest JSON "
                                                "whose checkpoint the chunks verify and load weights-only.")
    base_seed: int
    n_lanes: int = Field(ge=1)
    episodes: list[EpisodeIdentity]
    chunks: list[list[EpisodeIdentity]]
    frames: bool
    determinism: Determinism

    @property
    def goal_id(self) -> str:
        return str(self.goal["goal_id"])


class ChunkResult(Contract):
    chunk: int
    folder: str
    rows: list[dict[str, Any]]
    files: dict[str, dict[str, Any]]
    written: dict[str, list[str | None]] = Field(description="episode index -> [steps file, frames file or null].")
    offsets: dict[str, list[int]] = Field(description="episode index -> [step offset, observation offset] in its "
                                          "steps file (gradlab.datasets.shard).")
    spaces: dict[str, dict[str, Any]] = Field(description="{observation, action}: space_json of one lane.")


def new_recording_id() -> str:
    return time.strftime("rec-%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(4)


def determinism_of(environment: Any) -> Determinism:
    """``sticky`` for ALE with ``repeat_action_probability`` > 0, else ``deterministic`` (gradlab's
    providers reset from the episode's seed and draw nothing else outside the actions)."""
    if environment.provider == "ale" and float(environment.preprocessing.get("repeat_action_probability", 0)) > 0:
        return "sticky"
    return "deterministic"


def space_json(space: Any) -> dict[str, Any]:
    """A gymnasium space as ``{type, shape, dtype[, n, start, low, high, nvec]}``."""
    import numpy as np
    from gymnasium import spaces

    out: dict[str, Any] = {"type": type(space).__name__, "shape": list(space.shape or ()),
                           "dtype": str(np.dtype(space.dtype)) if space.dtype is not None else None}
    if isinstance(space, spaces.Discrete):
        out.update(n=int(space.n), start=int(space.start))
    elif isinstance(space, spaces.Box):
        # JSON has no infinity: unbounded sides as the strings "inf" / "-inf" (numpy parses them back).
        # One number when every element shares it (image spaces).
        def bounds(a: Any) -> list | float | str:
            flat = [float(v) if np.isfinite(v) else str(float(v)) for v in np.asarray(a, dtype=np.float64).ravel()]
            return flat[0] if flat and all(v == flat[0] for v in flat) else flat

        out.update(low=bounds(space.low), high=bounds(space.high))
    elif isinstance(space, spaces.MultiDiscrete):
        out.update(nvec=np.asarray(space.nvec).tolist())
    return out


def space_from_json(data: dict[str, Any]) -> Any:
    """The gymnasium space :func:`space_json` describes.

    Raises:
        ConfigError: a space type other than Discrete, Box, MultiDiscrete, MultiBinary.
    """
    import numpy as np
    from gymnasium import spaces

    kind = data["type"]
    if kind == "Discrete":
        return spaces.Discrete(data["n"], start=data.get("start", 0))
    if kind == "Box":
        shape = tuple(data["shape"])
        low, high = (np.broadcast_to(np.array(data[k], dtype=np.float64), shape).astype(data["dtype"])
                     for k in ("low", "high"))
        return spaces.Box(low=low, high=high, dtype=data["dtype"])
    if kind == "MultiDiscrete":
        return spaces.MultiDiscrete(data["nvec"])
    if kind == "MultiBinary":
        return spaces.MultiBinary(data["shape"])
    raise ConfigError(f"dataset space {kind!r}: expected Discrete, Box, MultiDiscrete or MultiBinary")


def make_policy(plan: RecordingPlan, action_space: Any) -> Any:
    """The policy a chunk acts with: the checkpoint's (verified, weights-only) or a reference policy."""
    if plan.agent.kind == "checkpoint":
        import torch

        torch.set_num_threads(1)  # batched small-policy inference: a second thread only contends

        from gradlab.evaluation.result import EvalRequest
        from gradlab.evaluation.runner import checked_policy

        return checked_policy(EvalRequest.model_validate(plan.eval_request))[0]
    if plan.agent.kind in ("random", "noop"):
        from gradlab.evaluation.baselines import BaselinePolicy

        return BaselinePolicy(plan.agent.kind, action_space)
    raise ConfigError(f"dataset {plan.name}: agent {plan.agent.kind!r} does not record through the workers")


def plan_recording(name: str, *, goal_id: str, policy: str, episodes: int, base_seed: int | None = None,
                   frames: bool = True, chunk_episodes: int = DEFAULT_CHUNK_EPISODES,
                   policy_mode: str | None = None, settings: Any = None, warn: Any = None) -> RecordingPlan:
    """Resolve what to record (see the module docstring).

    Args:
        name: the dataset's name (one path segment).
        goal_id: the goal; a checkpoint's run must have trained it.
        policy: ``RUN[:STEP]``, a checkpoint folder, ``hf://OWNER/NAME``, ``random``, ``noop`` or
            ``human`` (played in the web player: :class:`gradlab.play.human.HumanSession`; one chunk).
        episodes: N. base_seed: the manifest's base seed (default: the goal's ``eval.seed``).
        chunk_episodes: episodes per chunk (one Prefect task each).
        policy_mode: ``deterministic`` / ``stochastic`` (default: the goal's ``eval.policy``); not
            used for ``random`` (stochastic) and ``noop`` (deterministic).

    Raises:
        ConfigError: a bad name, a checkpoint of another goal, bad counts.
        NotFound, IntegrityError: as :func:`gradlab.checkpoints.resolve.resolve_checkpoint`.
    """
    from gradlab.contracts.experiments import Experiments, check_id, environment_sha256
    from gradlab.evaluation.manifest import build_manifest
    from gradlab.settings import load_settings
    from gradlab.stores.keys import dataset_prefix

    try:
        check_id("dataset", name)
        dataset_prefix(name)
    except Exception as e:  # noqa: BLE001 - one message for every bad name
        shown = repr(name) if len(name) <= 80 else repr(name[:80]) + f"... ({len(name)} characters)"
        raise ConfigError(f"dataset name {shown}: {e}") from None
    if episodes < 1 or chunk_episodes < 1:
        raise ConfigError(f"--episodes {episodes} / chunk size {chunk_episodes}: expected >= 1")
    settings = settings or load_settings()
    request = None
    if policy == "human":  # a person at the web player's keyboard (gradlab.play.human) plays the plan
        goal = Experiments().load_goal(goal_id)
        environment = goal.eval_environment()
        agent = DatasetAgent(kind="human", input_device="keyboard")
        chunk_episodes = episodes  # one session plays every episode, in index order: one chunk
    elif policy in ("random", "noop"):
        goal = Experiments().load_goal(goal_id)
        environment = goal.eval_environment()
        from gradlab.evaluation.baselines import BASELINE_ACTIONS

        # A baseline acts as it is, whatever mode the goal's evaluation protocol (``policy_mode``,
        # as an evaluation result records it) asks of a trained policy.
        agent = DatasetAgent(kind=policy, policy_mode=BASELINE_ACTIONS[policy])  # type: ignore[arg-type]
    else:
        from gradlab.checkpoints import read_manifest
        from gradlab.checkpoints.resolve import resolve_checkpoint
        from gradlab.evaluation.result import EvalRequest
        from gradlab.evaluation.runner import parse_spec

        verify = "full"
        if policy.startswith("hf://"):
            from gradlab.share.hub import resolve_repo

            resolved, verify = resolve_repo(policy), "weights_only"
        else:
            resolved = resolve_checkpoint(policy, settings=settings, warn=warn)
        spec = parse_spec(resolved.spec, source=resolved.spec_source)
        if spec.goal.goal_id != goal_id:
            raise ConfigError(f"--policy {policy}: the checkpoint's run trained goal {spec.goal.goal_id!r}, "
                              f"not --goal {goal_id!r}")
        ckpt = read_manifest(resolved.path)
        goal, environment = spec.goal, spec.eval_environment
        mode = policy_mode or goal.eval.policy
        request = EvalRequest(checkpoint_dir=str(resolved.path), checkpoint_sha256=ckpt.sha256,
                              checkpoint_step=ckpt.step, spec=resolved.spec, verify=verify).as_json()  # type: ignore[arg-type]
        agent = DatasetAgent(kind="checkpoint", checkpoint_sha256=ckpt.sha256, checkpoint_step=ckpt.step,
                             run_id=spec.run_id, publication=policy if policy.startswith("hf://") else str(resolved.path),
                             policy_mode=mode)  # type: ignore[arg-type]
    eval_spec = goal.eval if base_seed is None else goal.eval.model_copy(update={"seed": base_seed})
    manifest = build_manifest(eval_spec, episodes=episodes)
    plan_episodes = manifest.episodes
    chunks = [plan_episodes[i:i + chunk_episodes] for i in range(0, len(plan_episodes), chunk_episodes)]
    recording_id = new_recording_id()
    environment_sha256(environment)  # a contract that does not hash fails here, before any worker starts
    return RecordingPlan(
        name=name, recording_id=recording_id, staging_dir=str(settings.home / "datasets" / "staging" / recording_id),
        goal=goal.model_dump(mode="json"), environment=environment.model_dump(mode="json"), agent=agent,
        eval_request=request, base_seed=manifest.base_seed, n_lanes=manifest.n_lanes, episodes=plan_episodes,
        chunks=chunks, frames=frames, determinism=determinism_of(environment),
    )
