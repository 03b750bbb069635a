"""Lane groups: one vector env of N lanes built as G smaller ones, so one group steps while the
rollout computes the next actions of another.

A rollout alternates between the policy's forward pass and the env's step, and with one vector
env each waits for the other. ale-py's ``AtariVectorEnv`` steps its lanes on its own C++ threads
between ``send`` and ``recv`` (:attr:`gradlab.envs.backend.LaneBackend.steps_in_background`), so
with two groups of N/2 lanes the forward pass of one group runs while the other group's lanes
step. Breakout, 8 lanes, one torch thread, this 2-core machine: 4.1 ms per step of all 8 lanes in
one env against 2.8 ms in two groups of 4 (measured here; docs/BENCHMARKS.md).

Each lane is exactly the lane of the one-env build: lane ``offset_g + i`` is lane ``i`` of group
``g``, with the same first-reset seed (``seed * 1024 + lane``) and its own RNG stream, so a lane
given the same actions plays the same episode. :class:`LaneGroups` also steps all groups as one
vector env (:meth:`LaneGroups.step`), merging their results with global lane indices.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.envs.records import StepResult
from gradlab.envs.vector import VectorEnv, make_vector_env, training_lane_seeds


class LaneGroups:
    """G :class:`VectorEnv` groups of one environment, stepped as N lanes.

    Attributes:
        groups: the vector envs, in lane order.
        offsets: the first global lane of each group.
        slices: ``slice(offset, offset + group.num_envs)`` per group.
        num_envs: N, the sum of the groups' lanes.
        single_observation_space, single_action_space, spec: as a :class:`VectorEnv`'s (group 0's).
    """

    def __init__(self, groups: list[VectorEnv]):
        if not groups:
            raise ValueError("groups: expected at least one vector env")
        self.groups = groups
        self.offsets = list(np.cumsum([0] + [g.num_envs for g in groups[:-1]]).tolist())
        self.slices = [slice(o, o + g.num_envs) for o, g in zip(self.offsets, groups, strict=True)]
        self.num_envs = sum(g.num_envs for g in groups)
        self.single_observation_space = groups[0].single_observation_space
        self.single_action_space = groups[0].single_action_space
        self.spec = groups[0].spec
        self._closed = False

    @property
    def steps_in_background(self) -> bool:
        return all(g.steps_in_background for g in self.groups)

    def reset(self) -> np.ndarray:
        """Reset every lane of every group; (N, *obs_shape) first observations."""
        return np.concatenate([g.reset() for g in self.groups])

    def step(self, actions: np.ndarray) -> StepResult:
        """Step every group at once (each in the background where it can), as one vector env."""
        actions = np.asarray(actions)
        for g, sl in zip(self.groups, self.slices, strict=True):
            g.step_async(actions[sl])
        return merge_results([g.step_wait() for g in self.groups], self.offsets)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            for g in self.groups:
                g.close()

    def __enter__(self) -> LaneGroups:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def merge_results(results: list[StepResult], offsets: list[int]) -> StepResult:
    """The groups' results of one step as one :class:`StepResult` over global lane indices."""
    episodes = []
    final_obs: dict[int, np.ndarray] = {}
    infos: list[dict[str, Any]] = []
    for res, off in zip(results, offsets, strict=True):
        group_infos = list(res.infos)
        for ep in res.episodes:
            moved = dataclasses.replace(ep, lane=ep.lane + off)
            episodes.append(moved)
            info = dict(group_infos[ep.lane] or {})
            info["gradlab_episode"] = moved.as_json()
            group_infos[ep.lane] = info
        final_obs.update({lane + off: o for lane, o in res.final_obs.items()})
        infos.extend(group_infos)

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(r, name) for r in results])

    def cat_dict(name: str) -> dict[str, np.ndarray]:
        keys = getattr(results[0], name).keys()
        return {k: np.concatenate([getattr(r, name)[k] for r in results]) for k in keys}

    return StepResult(obs=cat("obs"), reward=cat("reward"), raw_reward=cat("raw_reward"), terminated=cat("terminated"),
                      truncated=cat("truncated"), final_obs=final_obs, episodes=episodes, infos=infos,
                      signals=cat_dict("signals"), events=cat_dict("events"))


def make_lane_groups(spec: EnvironmentSpec, *, seed: int, groups: int = 2) -> LaneGroups | VectorEnv:
    """``spec.n_envs`` training lanes as ``groups`` vector envs, where their lanes step in the background.

    Where the provider's lanes do not step in the background (``Provider.lanes_step_in_background``:
    every provider but ``ale``), or there are fewer lanes than groups, this is
    :func:`make_vector_env` (one vector env).

    Args:
        spec: the environment contract; its ``n_envs`` lanes are split as evenly as possible.
        seed: the run seed (lane ``i``'s first reset uses ``seed * 1024 + i``, as in one env).
        groups: how many groups (>= 1).

    Raises:
        As :func:`make_vector_env`.
    """
    from gradlab.envs.registry import get_provider

    n = spec.n_envs
    if groups <= 1 or n < groups or not get_provider(spec.provider).lanes_step_in_background:
        return make_vector_env(spec, seed=seed)
    seeds = training_lane_seeds(seed, n)
    sizes = [n // groups + (1 if g < n % groups else 0) for g in range(groups)]
    # The groups share the machine's cores: each gets its share of worker threads unless the spec
    # names a number (on 2 cores two groups of 2 threads each stepped slower than one env of 8 lanes,
    # two groups of 1 thread each 1.5x faster; measured here).
    threads = spec.num_threads or max(1, usable_cpus() // groups)
    built: list[VectorEnv] = []
    try:
        start = 0
        for size in sizes:
            built.append(make_vector_env(spec.model_copy(update={"n_envs": size, "num_threads": threads}), seed=seed,
                                         lane_seeds=seeds[start:start + size]))
            start += size
    except BaseException:
        for g in built:
            g.close()
        raise
    return LaneGroups(built)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def draw_training_starts(venv: LaneGroups | VectorEnv, weights: dict[str, float] | None, *, seed: int
                         ) -> LaneGroups | VectorEnv:
    """Make every lane of ``venv`` (one vector env or lane groups) draw its episodes' starts with
    ``weights`` (:meth:`VectorEnv.draw_starts`); ``weights`` None leaves it as it is. Returns ``venv``.

    Raises:
        ContractViolation: as :meth:`VectorEnv.draw_starts`.
    """
    if weights:
        for group in getattr(venv, "groups", None) or [venv]:
            group.draw_starts(weights, seed=seed)
    return venv
