"""The run's domain steps, one function each, by phase in the order a training run takes them;
``tasks/run_tasks.py`` wraps each step in a Prefect task (docs/ARCHITECTURE.md section 8).

Each step is idempotent against the receipt store: a retry finds what an earlier try wrote and
agrees with it, so a transient failure (``StoreUnavailable``) is always safe to retry.

Phases and their steps:
    preparing   prepare_spec, write_local_spec (the run's spec.json); wandb_mode, start_wandb_service,
                wandb_sink, outbox_high_water
    opening     open_attempt -> AttemptPlan (reconcile, lease, attempt.json, outbox fence; fresh,
                resume or drain); choose_resume_checkpoint, verified_local_checkpoints (LocalCheckpoint)
    publishing  publish (task ``publish-checkpoint``); local_checkpoint_dir (a published checkpoint's
                verified local folder)
    evaluating  prewarm_evaluation; evaluate (task ``evaluate-checkpoint``); record_unusable (a
                checkpoint that fails verification, recorded ``failed``); record_stop (task ``request-stop``)
    promoting   promote (task ``promote``)
    sealing     seal (task ``seal-receipt``) from inventory; write_local_receipt; close_abandoned_attempt
                (the flow's state hooks)
"""

from gradlab.runs.operations.evaluating import evaluate, prewarm_evaluation, record_stop, record_unusable
from gradlab.runs.operations.opening import (
    AttemptPlan,
    LocalCheckpoint,
    choose_resume_checkpoint,
    open_attempt,
    verified_local_checkpoints,
)
from gradlab.runs.operations.preparing import (
    outbox_high_water,
    prepare_spec,
    start_wandb_service,
    wandb_mode,
    wandb_sink,
    write_local_spec,
)
from gradlab.runs.operations.promoting import promote
from gradlab.runs.operations.publishing import local_checkpoint_dir, publish
from gradlab.runs.operations.sealing import close_abandoned_attempt, inventory, seal, write_local_receipt

__all__ = [
    "AttemptPlan", "LocalCheckpoint", "choose_resume_checkpoint", "close_abandoned_attempt", "evaluate", "inventory",
    "local_checkpoint_dir", "open_attempt", "outbox_high_water", "prepare_spec", "prewarm_evaluation", "promote",
    "publish", "record_stop", "record_unusable", "seal", "start_wandb_service", "verified_local_checkpoints",
    "wandb_mode", "wandb_sink", "write_local_receipt", "write_local_spec",
]
