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

``import gradlab`` is cheap: it imports neither torch nor prefect.
"""

__version__ = "0.1.0"
