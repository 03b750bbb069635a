"""Task timeouts derived from the goal (docs/ARCHITECTURE.md section 8).

Every Prefect task of the training run gets a ``timeout_seconds`` from here, and the evaluation
backend the same deadline, so no phase can hang the run: a timed-out task fails with a transient
error, is retried per the retry policy (``tasks/_policy.py``), and after its last try is recorded
as failed (an evaluation) while the run drains.

The figures are deliberately generous upper bounds for a slow, loaded machine and a slow object
store, not estimates: a timeout should fire only on a hang.

* publication: ``BASE_S + 2 × bytes / STORE_BYTES_PER_S`` (every file is uploaded, then re-read
  and hashed);
* evaluation: ``STARTUP_S + episodes × step cap / (lanes × LANE_STEPS_PER_S)``, the step cap
  being the goal's ``termination.max_episode_steps``, else the provider's own time limit
  (gymnasium's registered ``max_episode_steps``; ALE's 108,000 emulator frames / frame skip),
  else :data:`DEFAULT_STEP_CAP`;
* the store-only tasks (open, stop request, promotion, seal): ``BASE_S``, plus for ``open-run``
  the resume checkpoint's download and one lease TTL (a previous attempt's lease held from
  another host is waited out).

``GRADLAB_TASK_TIMEOUT_SCALE`` (a positive float, default 1) multiplies every figure: an operator
on a slower machine raises it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradlab.errors import ConfigError
from gradlab.receipts.lease import lease_ttl_s

#: Seconds any store-only task may take (a few small objects, retried reads included).
BASE_S = 60.0
#: Slowest object-store throughput planned for, bytes per second (1 MiB/s).
STORE_BYTES_PER_S = 1024.0 * 1024.0
#: Seconds an evaluation may take before its first episode step (process start, imports, policy load).
STARTUP_S = 120.0
#: Slowest evaluation rate planned for, env steps per second per lane (policy forward included).
LANE_STEPS_PER_S = 50.0
#: Step cap of an episode whose goal and provider state none (ALE's default at frame skip 4).
DEFAULT_STEP_CAP = 27_000
#: ALE v5's episode cap in emulator frames (``max_num_frames_per_episode``).
ALE_FRAME_CAP = 108_000
#: Environment variable scaling every timeout.
SCALE_ENV = "GRADLAB_TASK_TIMEOUT_SCALE"


def timeout_scale() -> float:
    """``GRADLAB_TASK_TIMEOUT_SCALE`` as a positive float (1.0 when unset).

    Raises:
        ConfigError: not a positive number (names the variable and the value).
    """
    raw = os.environ.get(SCALE_ENV)
    if raw is None or raw == "":
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        raise ConfigError(f"{SCALE_ENV}={raw!r}: expected a positive number")
    return value


def episode_step_cap(goal: Any) -> int:
    """The most agent steps one evaluation episode of ``goal`` can last (see the module docstring)."""
    env = goal.train.environment
    cap = env.task.termination.max_episode_steps
    if cap is not None:
        return int(cap)
    if env.provider == "gymnasium":
        try:
            import gymnasium

            registered = gymnasium.spec(env.env_id).max_episode_steps
        except Exception:  # noqa: BLE001 - an id gymnasium does not know: the default cap
            registered = None
        if registered:
            return int(registered)
    if env.provider == "ale":  # preprocessing is the validated dict, defaults filled
        return -(-ALE_FRAME_CAP // max(1, int(env.preprocessing.get("frame_skip", 4))))  # the cap is in frames
    return DEFAULT_STEP_CAP


@dataclass(frozen=True)
class TaskTimeouts:
    """Seconds each task of one run may take (see the module docstring)."""

    open_run_s: float
    start_learner_s: float
    evaluate_s: float
    request_stop_s: float
    promote_s: float
    seal_s: float
    scale: float = 1.0

    def publish_s(self, size_bytes: int) -> float:
        """Seconds publishing a checkpoint of ``size_bytes`` bytes may take."""
        return self.scale * (BASE_S + 2.0 * size_bytes / STORE_BYTES_PER_S)


def task_timeouts(spec: Any, *, resume_bytes: int = 0) -> TaskTimeouts:
    """The task timeouts of a run (a :class:`gradlab.contracts.run_spec.RunSpec`).

    Args:
        resume_bytes: size of the checkpoint ``open-run`` may download to resume from.

    Raises:
        ConfigError: ``GRADLAB_TASK_TIMEOUT_SCALE`` is not a positive number.
    """
    scale = timeout_scale()
    goal = spec.goal
    lanes = max(1, int(goal.eval.n_envs))
    evaluate = STARTUP_S + goal.eval.episodes * episode_step_cap(goal) / (lanes * LANE_STEPS_PER_S)
    return TaskTimeouts(
        open_run_s=scale * (BASE_S + lease_ttl_s() + resume_bytes / STORE_BYTES_PER_S),
        start_learner_s=scale * STARTUP_S,
        evaluate_s=scale * evaluate,
        request_stop_s=scale * BASE_S,
        promote_s=scale * BASE_S,
        seal_s=scale * BASE_S,
        scale=scale,
    )


def folder_bytes(path: Path) -> int:
    """Total size of the files under ``path`` (0 when it does not exist)."""
    path = Path(path)
    if not path.is_dir():
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


DEFAULT_STOP_WAIT_S = 120.0
#: Environment variable overriding how long a learner gets to act on a stop request before it is
#: stopped by signals (seconds; a compliant learner stops after its current update and a final checkpoint).
STOP_WAIT_ENV = "GRADLAB_STOP_WAIT_S"


def _positive_seconds(name: str, default: float) -> float:
    """Environment variable ``name`` as a finite number of seconds > 0, ``default`` when unset or empty.

    Raises:
        ConfigError: naming the variable, what was expected and what was found.
    """
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ConfigError(f"{name}: expected a finite number of seconds > 0, found {raw!r}")
    return seconds


def stop_wait_s() -> float:
    """Seconds a learner gets to act on its stop request: ``GRADLAB_STOP_WAIT_S``, else 120 s.

    Raises:
        ConfigError: the variable is not a finite number of seconds > 0.
    """
    return _positive_seconds(STOP_WAIT_ENV, DEFAULT_STOP_WAIT_S)


#: W&B's own start-up timeout variable, which gradlab also takes as the W&B sink's budget.
WANDB_BUDGET_ENV = "WANDB_INIT_TIMEOUT"
DEFAULT_WANDB_BUDGET_S = 30.0


def wandb_budget_s() -> float:
    """The W&B sink's budget: ``WANDB_INIT_TIMEOUT`` (W&B reads it as its start-up timeout too),
    else 30 s (docs/ARCHITECTURE.md section 10).

    Raises:
        ConfigError: the variable is not a finite number of seconds > 0 (W&B itself would refuse
            one that is not a number, and a budget of none leaves nothing to close its service with).
    """
    return _positive_seconds(WANDB_BUDGET_ENV, DEFAULT_WANDB_BUDGET_S)


def check_run_environment() -> None:
    """Check the environment variables a run's attempt reads (``GRADLAB_LEASE_TTL_S``,
    ``GRADLAB_STOP_WAIT_S``, ``WANDB_INIT_TIMEOUT``) before anything is created: ``gradlab train``,
    ``gradlab runs retry`` and the training-run flow call it first.

    Raises:
        ConfigError: naming the variable, what was expected and what was found.
    """
    from gradlab.errors import ContractViolation
    from gradlab.receipts.lease import lease_ttl_s

    try:
        lease_ttl_s()
    except ContractViolation as e:
        raise ConfigError(str(e)) from None
    stop_wait_s()
    wandb_budget_s()
