"""Training backends and the learner process (docs/ARCHITECTURE.md section 5).

Public names:
    run_learner(spec, run_dir, *, resume_from=None, ...) -> LearnerResult: train one run in-process.
    SB3Backend(backend_id): the ``sb3.ppo`` / ``sb3.a2c`` backend (collect → update → save/restore).
    gradlab.learn.ppo.PPOBackend: the ``gradlab.ppo`` backend (same interface; tensor-native PPO;
        its network in gradlab.learn.ppo_net, hand-written MLP gradients in gradlab.learn.ppo_mlp).
    registered_backends() -> list[str]: backend ids, for tests over every backend.
    schedule_fn(value): a recipe schedule (constant or linear) as SB3's ``progress_remaining`` callable.
    make_training_env(spec): the SB3 VecEnv over gradlab's vector env.

The process entry point is ``python -m gradlab.learn --spec RUN_SPEC.json --run-dir DIR``.
Importing this package does not import torch or stable-baselines3.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SB3Backend", "LearnerResult", "make_training_env", "registered_backends", "run_learner", "schedule_fn"]


def __getattr__(name: str) -> Any:
    if name in ("run_learner", "LearnerResult", "make_training_env"):
        from gradlab.learn import learner

        return getattr(learner, name)
    if name in ("SB3Backend", "registered_backends"):
        from gradlab.learn import sb3

        return getattr(sb3, name)
    if name == "schedule_fn":
        from gradlab.learn.schedules import schedule_fn

        return schedule_fn
    raise AttributeError(name)
