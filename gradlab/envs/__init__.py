"""Environments: providers, vector envs and the task program.

Public names (imported lazily, so ``import gradlab.envs`` stays cheap):
    make_vector_env(spec, *, seed, lane_seeds=None, render_mode=None) -> VectorEnv
    VectorEnv, StepResult, EpisodeRecord: the stepping API and its records.
    TaskRunner: the task program (signals → events → termination → reward) over N lanes.
    list_providers(), provider_info(name), get_provider(name), describe(spec_or_ref): the registry.
    training_lane_seeds(seed, n_envs): ``seed * 1024 + lane``.
    gradlab.envs.sb3.SB3VecEnv: the stable-baselines3 adapter.

Shipped providers (entry-point group ``gradlab.providers``): ``gradlab`` (Bandit-v0 and tiny
test envs), ``gymnasium`` (in-process lanes), ``ale`` (ale-py's native ``AtariVectorEnv``),
``vizdoom`` (bundled scenarios, subprocess lanes), ``retro`` (stable-retro, one emulator per
process; ROMs through ``gradlab rom import``).
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "make_vector_env": "gradlab.envs.vector",
    "VectorEnv": "gradlab.envs.vector",
    "training_lane_seeds": "gradlab.envs.vector",
    "StepResult": "gradlab.envs.records",
    "EpisodeRecord": "gradlab.envs.records",
    "TaskRunner": "gradlab.envs.task",
    "list_providers": "gradlab.envs.registry",
    "provider_info": "gradlab.envs.registry",
    "get_provider": "gradlab.envs.registry",
    "describe": "gradlab.envs.registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gradlab.envs' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
