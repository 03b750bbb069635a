"""The metric registry: every metric name gradlab emits, exact or as a template.

This is the executable contract; ``METRICS.md`` is the human one and a test keeps the two equal
(same names, meanings, units and cadences, in any order). A template's placeholders
(``{algorithm}``, ``{reason}``, ``{start}``, ``{condition}``, ``{component}``)
each match exactly one path segment: letters, digits and ``_ . - :``, no ``/``.

To add a metric: add a row to ``METRICS.md`` and the same :class:`MetricSpec` below, in the group
of the part that emits it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from gradlab.errors import ContractViolation

PLACEHOLDERS = ("algorithm", "reason", "start", "condition", "component")
_SEGMENT = r"[A-Za-z0-9_.\-:]+"
_PLACEHOLDER_RE = re.compile(r"\{([a-z_]+)\}")


@dataclass(frozen=True)
class MetricSpec:
    """One registered metric (a row of METRICS.md).

    Attributes:
        name: the exact name, or a template with ``{placeholder}`` path segments.
        meaning: what the number is, in one sentence.
        unit: unit of the value (``steps``, ``s``, ``steps/s``, ``frac``, ``count``, ``reward``, ``nats``...).
        cadence: when it is emitted (``per rollout``, ``per checkpoint``, ``per evaluation``...).
    """

    name: str
    meaning: str
    unit: str
    cadence: str

    @property
    def is_template(self) -> bool:
        return "{" in self.name

    def pattern(self) -> re.Pattern[str]:
        parts = _PLACEHOLDER_RE.split(self.name)
        out = []
        for i, part in enumerate(parts):
            if i % 2 == 0:
                out.append(re.escape(part))
            else:
                if part not in PLACEHOLDERS:
                    raise ContractViolation(f"metric template {self.name!r}: unknown placeholder {{{part}}}; "
                                            f"expected one of {', '.join(PLACEHOLDERS)}")
                out.append(_SEGMENT)
        return re.compile("^" + "".join(out) + "$")


_ALGO = "train/algorithm/{algorithm}"
_ROLL = "per rollout"

TRAINING: tuple[MetricSpec, ...] = (
    MetricSpec("train/global_step", "Env steps taken so far, all lanes together (the training x axis).", "steps", _ROLL),
    MetricSpec("train/episode/count", "Episodes finished since the run started (all lanes).", "count", _ROLL),
    MetricSpec("train/episode/return/shaped/mean", "Mean shaped return (task program applied) of the last 100 finished episodes.", "reward", _ROLL),
    MetricSpec("train/episode/return/raw/mean", "Mean raw (provider-native) return of the last 100 finished episodes.", "reward", _ROLL),
    MetricSpec("train/episode/length/mean", "Mean length of the last 100 finished episodes.", "steps", _ROLL),
    MetricSpec("train/episode/reason/{reason}/count", "Episodes finished since the run started that ended for this reason.", "count", _ROLL),
    MetricSpec("train/start/{start}/episode/count", "Episodes finished since the run started that began from this start state (goals with several).", "count", _ROLL),
    MetricSpec("train/start/{start}/success/count", "Episodes finished since the run started from this start state with outcome success.", "count", _ROLL),
    MetricSpec("train/outcome/success/count", "Episodes finished since the run started with outcome success.", "count", _ROLL),
    MetricSpec("train/outcome/failure/count", "Episodes finished since the run started with outcome failure.", "count", _ROLL),
    MetricSpec("train/outcome/timeout/count", "Episodes finished since the run started with outcome timeout.", "count", _ROLL),
    MetricSpec("train/outcome/ended/count", "Episodes finished since the run started with outcome ended.", "count", _ROLL),
    MetricSpec("train/outcome/success/window_100/rate", "Fraction of the last 100 finished episodes whose outcome was success.", "frac", _ROLL),
    MetricSpec("train/reward/shaped/mean", "Mean shaped per-step reward over the rollout's steps (before reward normalisation).", "reward", _ROLL),
    MetricSpec("train/reward/shaped/std", "Standard deviation of the shaped per-step reward over the rollout.", "reward", _ROLL),
    MetricSpec("train/reward/shaped/min", "Smallest shaped per-step reward in the rollout.", "reward", _ROLL),
    MetricSpec("train/reward/shaped/max", "Largest shaped per-step reward in the rollout.", "reward", _ROLL),
    MetricSpec("train/reward/component/{component}/mean", "Mean per lane-step value of one named reward component (a reward term; or `native` and each rewarded event) since the previous rollout, in task-reward units before `reward_scale` and clipping; absent when the reward is native alone.", "reward", _ROLL),
    MetricSpec("train/reward/component/{component}/nonzero_rate", "Fraction of lane-steps since the previous rollout on which that reward component was not zero.", "frac", _ROLL),
    MetricSpec("train/reward/component/{component}/share", "That component's sum of absolute values over the sum of every component's, since the previous rollout (task-reward units).", "frac", _ROLL),
    MetricSpec(f"{_ALGO}/update/approx_kl", "Approximate KL divergence between the rollout policy and the updated one (PPO).", "nats", "per update"),
    MetricSpec(f"{_ALGO}/update/clip_fraction", "Fraction of samples whose probability ratio was clipped (PPO).", "frac", "per update"),
    MetricSpec(f"{_ALGO}/update/clip_range", "PPO clip range used by the update (after its schedule).", "ratio", "per update"),
    MetricSpec(f"{_ALGO}/update/policy_gradient_loss", "Policy-gradient loss of the update (last minibatch mean for A2C, mean over minibatches for PPO).", "loss", "per update"),
    MetricSpec(f"{_ALGO}/update/value_loss", "Value-function loss of the update.", "loss", "per update"),
    MetricSpec(f"{_ALGO}/update/loss", "Total loss of the update's last minibatch (policy + vf_coef*value - ent_coef*entropy).", "loss", "per update"),
    MetricSpec(f"{_ALGO}/update/learning_rate", "Learning rate used by the update (after its schedule).", "lr", "per update"),
    MetricSpec(f"{_ALGO}/update/entropy_coef", "Entropy coefficient used by the update (after its schedule).", "coef", "per update"),
    MetricSpec(f"{_ALGO}/update/count", "Gradient steps taken since the run started.", "count", "per update"),
    MetricSpec(f"{_ALGO}/policy/entropy", "Mean entropy of the policy's action distribution over the update's samples.", "nats", "per update"),
    MetricSpec(f"{_ALGO}/value/explained_variance", "Explained variance of the value predictions against the value targets (1 = perfect).", "frac", "per update"),
    MetricSpec(f"{_ALGO}/update/epochs", "Epochs the update completed (gradlab.ppo; fewer than n_epochs when target_kl stopped it).", "count", "per update"),
    MetricSpec(f"{_ALGO}/update/grad_norm", "Mean gradient norm before clipping to max_grad_norm, over the update's minibatches (gradlab.ppo).", "norm", "per update"),
    MetricSpec("train/throughput/loop_fps", "Env steps per second of wall time over the whole iteration (rollout + update + bookkeeping).", "steps/s", _ROLL),
    MetricSpec("train/throughput/rollout_fps", "Env steps per second during the rollout phase (env steps + policy inference).", "steps/s", _ROLL),
    MetricSpec("train/throughput/env_step_fps", "Env steps per second counting only time spent inside the vector env's step.", "steps/s", _ROLL),
    MetricSpec("train/throughput/rollout/seconds", "Wall time of the iteration's rollout phase.", "s", _ROLL),
    MetricSpec("train/throughput/update/seconds", "Wall time of the iteration's gradient update phase.", "s", _ROLL),
    MetricSpec("train/throughput/bookkeeping/seconds", "Wall time of the previous iteration's bookkeeping (metrics, outbox, stop check; checkpoint saves excluded).", "s", _ROLL),
    MetricSpec("train/artifact/save/seconds", "Wall time of writing the checkpoint (files, fsync, rename).", "s", "per checkpoint"),
    MetricSpec("train/artifact/save/size_bytes", "Total size of the checkpoint's files.", "bytes", "per checkpoint"),
)
"""Metrics the learner emits (owner: learner)."""

_EVAL = "per evaluation"

EVALUATION: tuple[MetricSpec, ...] = (
    MetricSpec("eval/episode/return/mean", "Mean shaped return over the evaluation's completed manifest episodes.", "reward", _EVAL),
    MetricSpec("eval/episode/return/std", "Population standard deviation (ddof=0) of the shaped return over completed episodes.", "reward", _EVAL),
    MetricSpec("eval/episode/return/median", "Median shaped return over completed episodes.", "reward", _EVAL),
    MetricSpec("eval/episode/return/min", "Smallest shaped return over completed episodes.", "reward", _EVAL),
    MetricSpec("eval/episode/return/max", "Largest shaped return over completed episodes.", "reward", _EVAL),
    MetricSpec("eval/episode/raw_return/mean", "Mean raw (provider-native) return over completed episodes.", "reward", _EVAL),
    MetricSpec("eval/episode/length/mean", "Mean episode length over completed episodes (per-lane quotas: not biased toward short episodes).", "steps", _EVAL),
    MetricSpec("eval/outcome/success/rate", "Fraction of completed episodes whose outcome was success.", "frac", _EVAL),
    MetricSpec("eval/outcome/failure/rate", "Fraction of completed episodes whose outcome was failure.", "frac", _EVAL),
    MetricSpec("eval/outcome/timeout/rate", "Fraction of completed episodes whose outcome was timeout (truncated).", "frac", _EVAL),
    MetricSpec("eval/outcome/ended/rate", "Fraction of completed episodes that ended with neither success nor failure.", "frac", _EVAL),
    MetricSpec("eval/outcome/success/rate_ci95_low", "Lower bound of the Wilson 95% interval of the success rate.", "frac", _EVAL),
    MetricSpec("eval/outcome/success/rate_ci95_high", "Upper bound of the Wilson 95% interval of the success rate.", "frac", _EVAL),
    MetricSpec("eval/outcome/failure/{reason}/rate", "Fraction of completed episodes that failed for this reason (absent = 0).", "frac", _EVAL),
    MetricSpec("eval/start/{start}/success/rate", "Success rate of completed episodes from this start state.", "frac", _EVAL),
    MetricSpec("eval/start/{start}/success/rate_ci95_low", "Lower bound of the Wilson 95% interval of this start's success rate.", "frac", _EVAL),
    MetricSpec("eval/start/{start}/success/rate_ci95_high", "Upper bound of the Wilson 95% interval of this start's success rate.", "frac", _EVAL),
    MetricSpec("eval/start/{start}/episodes", "Completed episodes from this start state.", "count", _EVAL),
    MetricSpec("eval/acceptance/pass", "1 when the goal's acceptance rules hold and every planned episode completed, else 0.", "bool", _EVAL),
    MetricSpec("eval/acceptance/episodes/planned", "Episodes in the goal's fixed manifest (N).", "count", _EVAL),
    MetricSpec("eval/acceptance/episodes/completed", "Episodes completed (below planned only when fail-fast stopped at a failure).", "count", _EVAL),
    MetricSpec("eval/checkpoint_step", "Env steps of the evaluated checkpoint (the evaluation x axis).", "steps", _EVAL),
)
"""Aggregates of an evaluation result (owner: evaluation; names in gradlab.evaluation.names)."""

EARLY_STOP: tuple[MetricSpec, ...] = (
    MetricSpec("train/early_stop/{condition}/value", "The condition's training metric as of this rollout.", "metric", _ROLL),
    MetricSpec("train/early_stop/{condition}/best", "Best value of the condition's metric so far (max/min by operator or direction).", "metric", _ROLL),
    MetricSpec("train/early_stop/{condition}/patience/progress", "Held (threshold) or stalled (plateau) steps over patience_steps, clipped to [0, 1].", "frac", _ROLL),
    MetricSpec("train/early_stop/{condition}/would_trigger", "1 when the condition is met after warmup and patience (also for action observe), else 0.", "bool", _ROLL),
)
"""Early-stop condition metrics (gradlab.learn.early_stop, emitted by the learner per rollout)."""

EXPLORATION: tuple[MetricSpec, ...] = (
    MetricSpec("train/algorithm/go_explore/archive/cell_count", "Cells the Go-Explore archive holds now.", "count", _ROLL),
    MetricSpec("train/algorithm/go_explore/archive/entry_count", "Archive entries held now (one per cell: a replaced trajectory is dropped at once).", "count", _ROLL),
    MetricSpec("train/algorithm/go_explore/archive/blob_count", "Distinct provider-state blobs the archive references.", "count", _ROLL),
    MetricSpec("train/algorithm/go_explore/archive/blob_bytes", "Bytes of the distinct provider-state blobs the archive references.", "bytes", _ROLL),
    MetricSpec("train/algorithm/go_explore/archive/selection_count", "Cells chosen to explore from since the run started.", "count", _ROLL),
    MetricSpec("train/algorithm/go_explore/archive/visit_count", "Cell visits (steps that ended in a cell) since the run started.", "count", _ROLL),
    MetricSpec("train/algorithm/go_explore/archive/update_count", "Times a cell's trajectory was replaced by a better one since the run started.", "count", _ROLL),
    MetricSpec("train/algorithm/go_explore/archive/recent_new_cell_rate", "Share of the recent visits that found a new cell.", "frac", _ROLL),
    MetricSpec("train/algorithm/go_explore/archive/recent_visit_window", "Visits in the window of recent_new_cell_rate (at most 1000).", "count", _ROLL),
    MetricSpec("train/algorithm/go_explore/archive/visits_per_cell", "Visits since the run started divided by the cells held now.", "ratio", _ROLL),
    MetricSpec("train/algorithm/go_explore/success_guided/cell_count", "Cells on the lineage of the best successful trajectory.", "count", _ROLL),
    MetricSpec("train/algorithm/go_explore/success_guided/selection_count", "Selections drawn from the best successful lineage since the run started.", "count", _ROLL),
    MetricSpec("train/algorithm/go_explore/best/progress", "Progress (sum of the goal's progress signals) of the best retained trajectory.", "progress", _ROLL),
    MetricSpec("train/algorithm/go_explore/best/return", "Shaped return of the best retained trajectory.", "reward", _ROLL),
    MetricSpec("train/algorithm/go_explore/best/program_steps", "Actions in the best retained action program.", "steps", _ROLL),
    MetricSpec("train/algorithm/go_explore/best/program_runs", "Runs of equal consecutive actions in the best retained action program.", "count", _ROLL),
    MetricSpec("train/algorithm/go_explore/best/completed", "1 once a retained trajectory completed the task (outcome success), else 0.", "bool", _ROLL),
    MetricSpec("train/algorithm/go_explore/best/improvement_count", "Times a better successful trajectory replaced the first one.", "count", _ROLL),
    MetricSpec("train/algorithm/jerk/retained/count", "Action sequences JERK keeps for replay.", "count", _ROLL),
    MetricSpec("train/algorithm/jerk/best/return_mean", "Mean shaped return over the replays of JERK's best retained sequence.", "reward", _ROLL),
    MetricSpec("train/algorithm/jerk/best/sequence_length", "Actions in JERK's best retained sequence.", "steps", _ROLL),
    MetricSpec("train/algorithm/jerk/archive/selected_prefix_return_mean", "Mean return of the retained sequences chosen for replay since the run started.", "reward", _ROLL),
    MetricSpec("train/algorithm/jerk/exploit/probability", "Probability that a JERK episode starts by replaying the best retained sequence.", "frac", _ROLL),
)
"""Search backends' metrics (gradlab.learn.go_explore, gradlab.learn.jerk, gradlab.explore.archive)."""

CURRICULUM: tuple[MetricSpec, ...] = (
    MetricSpec("train/episode/return/shaped/from/target/mean", "Mean shaped return of the last 100 finished target-origin episodes (begun by the goal's own reset); emitted with train.curriculum.archive.", "reward", _ROLL),
    MetricSpec("train/episode/return/raw/from/target/mean", "Mean raw (provider-native) return of the last 100 finished target-origin episodes; emitted with train.curriculum.archive.", "reward", _ROLL),
    MetricSpec("train/episode/return/shaped/from/archive/mean", "Mean shaped return of the last 100 finished archive-origin episodes (begun from an archived state; counted from the archived episode's reset).", "reward", _ROLL),
    MetricSpec("train/episode/return/raw/from/archive/mean", "Mean raw (provider-native) return of the last 100 finished archive-origin episodes.", "reward", _ROLL),
    MetricSpec("train/curriculum/archive/episode_count", "Archive-origin episodes finished since the run started (not in train/episode/count).", "count", _ROLL),
    MetricSpec("train/curriculum/archive/cell_count", "Cells the curriculum's archive holds now (at most reservoir_size).", "count", _ROLL),
    MetricSpec("train/curriculum/archive/blob_bytes", "Bytes of the distinct provider-state blobs the curriculum's archive references.", "bytes", _ROLL),
    MetricSpec("train/curriculum/archive/start_count", "Episodes begun from an archived cell since the run started.", "count", _ROLL),
    MetricSpec("train/curriculum/archive/start_share", "Share of the episodes begun since the run started that began from an archived cell.", "frac", _ROLL),
    MetricSpec("train/curriculum/archive/priority/tried_cell_count", "Archived cells with a priority (an archive-origin trajectory from them completed).", "count", _ROLL),
    MetricSpec("train/curriculum/archive/priority/mean", "Mean priority (EMA of a trajectory's mean abs raw GAE advantage) over the tried cells; 0 before one.", "reward", _ROLL),
    MetricSpec("train/curriculum/archive/priority/max", "Largest priority over the tried cells; 0 before one.", "reward", _ROLL),
    MetricSpec("train/curriculum/archive/priority/update_count", "Completed archive-origin trajectories folded into a cell's priority since the run started.", "count", _ROLL),
)
"""Archive curriculum metrics (gradlab.learn.ppo_curriculum, gradlab.explore.curriculum)."""

_SUP = "per supervisor event"

ORCHESTRATION: tuple[MetricSpec, ...] = (
    MetricSpec("orchestration/event_seq", "Outbox sequence number of the delivered event (W&B's step).", "count", "every delivered event"),
    MetricSpec("orchestration/checkpoint/publish_seconds", "Wall time from checkpoint_ready in the outbox to its verified publication.", "s", "per checkpoint"),
    MetricSpec("orchestration/eval/seconds", "Wall time of one evaluation, from submission to a recorded result.", "s", _EVAL),
    MetricSpec("orchestration/eval/result_to_stop_seconds", "Wall time from the first accepted result to the learner's stop request.", "s", "once per run"),
    MetricSpec("orchestration/checkpoints/published", "Checkpoints published so far in this attempt.", "count", _SUP),
    MetricSpec("orchestration/checkpoints/evaluated", "Checkpoints with a recorded evaluation so far in this attempt.", "count", _SUP),
    MetricSpec("orchestration/checkpoints/accepted", "Checkpoints accepted so far in this attempt.", "count", _SUP),
    MetricSpec("orchestration/learner/eval_wait_seconds", "Wall time the learner waited at a checkpoint boundary for the verdict on the checkpoint before (at_checkpoint stop rule).", "s", "per checkpoint boundary"),
)
"""Metrics the supervisor flow emits about the run's orchestration (owner: flows/training_run)."""

REGISTRY: tuple[MetricSpec, ...] = TRAINING + EVALUATION + EARLY_STOP + EXPLORATION + CURRICULUM + ORCHESTRATION
"""Every registered metric, all parts together."""


@lru_cache(maxsize=1)
def _index() -> tuple[dict[str, MetricSpec], tuple[tuple[re.Pattern[str], MetricSpec], ...]]:
    exact = {m.name: m for m in REGISTRY if not m.is_template}
    templates = tuple((m.pattern(), m) for m in REGISTRY if m.is_template)
    return exact, templates


def lookup(name: str) -> MetricSpec | None:
    """The registry entry ``name`` matches (exact entries first), or None."""
    exact, templates = _index()
    if name in exact:
        return exact[name]
    for pattern, spec in templates:
        if pattern.match(name):
            return spec
    return None


def is_registered(name: str) -> bool:
    """True when ``name`` matches an exact entry or a template."""
    return lookup(name) is not None


def check_name(name: str) -> MetricSpec:
    """The entry for ``name``.

    Raises:
        ContractViolation: ``name`` matches no exact entry and no template (names the metric and
            points at METRICS.md).
    """
    spec = lookup(name)
    if spec is None:
        raise ContractViolation(f"metric {name!r} is not registered: add it to METRICS.md and "
                                "gradlab/metrics/registry.py (exact name or template)")
    return spec


def check_names(names: object) -> None:
    """Check every name of an iterable; the error lists all unregistered names at once.

    Raises:
        ContractViolation: one or more names are not registered.
    """
    bad = sorted({n for n in names if not is_registered(n)})  # type: ignore[attr-defined]
    if bad:
        raise ContractViolation(f"unregistered metric names (add them to METRICS.md and the registry): {', '.join(bad)}")
