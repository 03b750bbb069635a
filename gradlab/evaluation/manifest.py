"""The fixed episode manifest: which N episodes an evaluation runs, on which lane, from which seed.

The manifest is a pure function of the goal's ``eval`` block (episodes N, lanes L, base seed,
starts), so every evaluation of every checkpoint of a goal runs the same episodes. Episode ``i``
runs on lane ``i % L``: lane ``l`` gets the quota ``N // L + (1 if l < N % L else 0)``, and every
episode is run exactly once. A lane that finishes its quota keeps stepping but its further
episodes are discarded, so short episodes are never over-sampled (a "first N episodes to finish"
evaluator is biased toward short episodes).

Seeds: ``EVAL_SEED_OFFSET + (base_seed * SEEDS_PER_BASE + index) % EVAL_SEED_OFFSET``, i.e. in
``[2**31, 2**32)``; training lane seeds are below ``EVAL_SEED_OFFSET`` (``gradlab.contracts.seeds``),
so the two never overlap, and every seed fits a uint32 (ViZDoom and ALE seed with 32 bits).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gradlab.contracts.base import Contract
from gradlab.contracts.goal import Goal, GoalEval
from gradlab.contracts.hashing import sha256_json
from gradlab.contracts.seeds import EVAL_SEED_OFFSET
from gradlab.errors import ContractViolation

#: Seeds reserved per base seed: manifests of base seeds b and b+1 do not share a seed while N <= this.
SEEDS_PER_BASE = 2**16
#: Bumped whenever manifest construction, the runner's episode accounting or the aggregates change.
PROTOCOL_VERSION = "gradlab-eval/1"


class EpisodeIdentity(Contract):
    index: int = Field(ge=0, description="Position in the manifest, 0-based.")
    lane: int = Field(ge=0, description="Vector-env lane that runs the episode.")
    seed: int = Field(ge=EVAL_SEED_OFFSET, lt=2**32, description="Reset seed of the episode.")
    start: str | None = Field(default=None, description="Start state, for providers with several; else null.")


class EpisodeManifest(Contract):
    protocol_version: str = PROTOCOL_VERSION
    base_seed: int
    n_lanes: int = Field(ge=1)
    episodes: list[EpisodeIdentity]

    @property
    def sha256(self) -> str:
        """``episode_manifest_sha256``: sha256 of the canonical JSON of the whole manifest."""
        return sha256_json(self.model_dump(mode="json"))

    @property
    def planned(self) -> int:
        return len(self.episodes)

    def lane_queues(self) -> list[list[EpisodeIdentity]]:
        """Per lane, its episodes in the order the lane runs them; ``len(queue)`` is the lane's quota."""
        queues: list[list[EpisodeIdentity]] = [[] for _ in range(self.n_lanes)]
        for episode in self.episodes:
            queues[episode.lane].append(episode)
        return queues

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def episode_seed(base_seed: int, index: int) -> int:
    """Reset seed of manifest episode ``index`` (see the module docstring); in ``[2**31, 2**32)``."""
    return EVAL_SEED_OFFSET + (base_seed * SEEDS_PER_BASE + index) % EVAL_SEED_OFFSET


def build_manifest(goal: Goal | GoalEval, *, episodes: int | None = None) -> EpisodeManifest:
    """The goal's fixed episode manifest.

    Args:
        goal: a goal, or just its ``eval`` block.
        episodes: N to plan instead of ``goal.eval.episodes`` (``gradlab eval --episodes``); a
            result computed with another N is not a protocol result (see ``validate_result``).

    Returns:
        N identities ``(index, lane, seed, start)``; episode ``i`` on lane ``i % L`` with
        ``L = min(eval.n_envs, N)``; ``start = starts[i % len(starts)]`` or ``None``.

    Raises:
        ContractViolation: ``episodes`` is below 1.
    """
    spec = goal.eval if isinstance(goal, Goal) else goal
    n = spec.episodes if episodes is None else episodes
    if n < 1:
        raise ContractViolation(f"evaluation manifest: episodes must be >= 1, found {n}")
    n_lanes = min(spec.n_envs, n)
    starts = list(spec.starts)
    identities = [
        EpisodeIdentity(
            index=i,
            lane=i % n_lanes,
            seed=episode_seed(spec.seed, i),
            start=starts[i % len(starts)] if starts else None,
        )
        for i in range(n)
    ]
    return EpisodeManifest(base_seed=spec.seed, n_lanes=n_lanes, episodes=identities)
