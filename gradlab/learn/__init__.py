"""Training backends and the learner process (docs/ARCHITECTURE.md section 5).

Public names:
    run_learner(spec, run_dir, *, resume_from=None, ...) -> LearnerResult: train one run in-process.
    Backend: the interface every backend implements (setup → begin → collect → update → save/restore),
        with its MUST rules (``gradlab.learn.backend``).
    make_backend(backend_id) -> Backend: the backend for ``train.backend.id`` [``sb3.ppo``].
    registered_backends() -> list[str]: backend ids, for tests over every backend.
    SB3Backend(backend_id): the ``sb3.ppo`` / ``sb3.a2c`` backend (collect → update → save/restore).
    gradlab.learn.ppo.PPOBackend: the ``gradlab.ppo`` backend (same interface; tensor-native PPO;
        its network in gradlab.learn.ppo_net, its rollout in gradlab.learn.ppo_rollout, its update
        in gradlab.learn.ppo_update with hand-written MLP gradients in gradlab.learn.ppo_mlp, its
        checkpoint files in gradlab.learn.ppo_checkpoint).
    EarlyStopMonitor, EarlyStopDecision: threshold/plateau early stop over training metrics
        (``gradlab.learn.early_stop``).
    schedule_fn(value): a recipe schedule (constant or linear) as SB3's ``progress_remaining`` callable.
    make_training_env(spec): the SB3 VecEnv over gradlab's vector env (``gradlab.learn.sb3``).

Shared by the backends: ``gradlab.learn.backend_config`` (config checks), ``gradlab.learn.stats``
(training statistics), ``gradlab.learn.resume_state`` (RNG streams, normalisation statistics,
resume policy) and ``gradlab.learn.warm_start``. The warm learner is ``gradlab.learn.zygote``
(requester side) and ``gradlab.learn.zygote_server`` (the zygote process).

The process entry point is ``python -m gradlab.learn --spec RUN_SPEC.json --run-dir DIR``.
Importing this package does not import torch or stable-baselines3.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "Backend", "EarlyStopDecision", "EarlyStopMonitor", "LearnerResult", "SB3Backend", "make_backend",
    "make_training_env", "registered_backends", "run_learner", "schedule_fn",
]

_MODULES = {
    "run_learner": "gradlab.learn.learner",
    "LearnerResult": "gradlab.learn.learner",
    "Backend": "gradlab.learn.backend",
    "make_backend": "gradlab.learn.backend",
    "registered_backends": "gradlab.learn.backend",
    "SB3Backend": "gradlab.learn.sb3",
    "make_training_env": "gradlab.learn.sb3",
    "EarlyStopMonitor": "gradlab.learn.early_stop",
    "EarlyStopDecision": "gradlab.learn.early_stop",
    "schedule_fn": "gradlab.learn.schedules",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name]), name)
    raise AttributeError(name)
