"""gradlab: a reinforcement-learning workbench for game-playing agents.

Packages and what each ships by default:
    contracts    goal/recipe models, YAML composition, identity hashes (no torch)
    envs         providers (gradlab, gymnasium, ale, vizdoom, retro), vector envs, the task program
    learn        training backends (sb3.ppo, sb3.a2c, gradlab.ppo) and the learner process
    checkpoints  bundle format, manifest, verification, trusted loading
    evaluation   episode manifests, the runner, acceptance and statistics
    outbox       the SQLite WAL outbox between learner and supervisor
    metrics      the metric registry and sinks (local journal, W&B)
    stores       object stores over fsspec (file://, s3://)
    receipts     run, attempt, evaluation, promotion and terminal receipts
    cli          the ``gradlab`` command

Goals as gymnasium environments (imported lazily):
    make_env(GOAL) -> gymnasium.Env; make_vector_env(GOAL, n) -> gymnasium.vector.VectorEnv
    (``gradlab.envs.goal_env``: the goal's provider, preprocessing and task program).

``import gradlab`` is cheap: it imports neither torch nor prefect.
"""

from typing import Any

from gradlab.version import __version__

__all__ = ["__version__", "make_env", "make_vector_env"]


def __getattr__(name: str) -> Any:
    if name in ("make_env", "make_vector_env"):
        from gradlab.envs import goal_env

        return getattr(goal_env, name)
    raise AttributeError(f"module 'gradlab' has no attribute {name!r}")
