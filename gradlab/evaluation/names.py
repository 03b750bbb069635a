"""Metric names evaluation emits (mirrored in METRICS.md and the code registry).

A ``{start}`` or ``{reason}`` placeholder matches one path segment; values put into one are made
safe by :func:`segment` (characters outside ``[A-Za-z0-9_.-]`` become ``_``). Early stop's
``train/early_stop/{condition}/...`` names are the learner's: :mod:`gradlab.learn.early_stop`.
"""

from __future__ import annotations

import re

RETURN_STATS = ("mean", "std", "median", "min", "max")

EVAL_RETURN = {stat: f"eval/episode/return/{stat}" for stat in RETURN_STATS}
EVAL_RAW_RETURN_MEAN = "eval/episode/raw_return/mean"
EVAL_LENGTH_MEAN = "eval/episode/length/mean"
EVAL_SUCCESS_RATE = "eval/outcome/success/rate"
EVAL_SUCCESS_LOW = "eval/outcome/success/rate_ci95_low"
EVAL_SUCCESS_HIGH = "eval/outcome/success/rate_ci95_high"
EVAL_OUTCOME_RATE = "eval/outcome/{outcome}/rate"  # internal: outcome in OUTCOMES, not a registry template
OUTCOMES = ("success", "failure", "timeout", "ended")
EVAL_FAILURE_REASON_RATE = "eval/outcome/failure/{reason}/rate"
EVAL_START_SUCCESS_RATE = "eval/start/{start}/success/rate"
EVAL_START_SUCCESS_LOW = "eval/start/{start}/success/rate_ci95_low"
EVAL_START_SUCCESS_HIGH = "eval/start/{start}/success/rate_ci95_high"
EVAL_START_EPISODES = "eval/start/{start}/episodes"
EVAL_PASS = "eval/acceptance/pass"
EVAL_PLANNED = "eval/acceptance/episodes/planned"
EVAL_COMPLETED = "eval/acceptance/episodes/completed"
EVAL_CHECKPOINT_STEP = "eval/checkpoint_step"

#: Every name this part emits: exact names and templates, in METRICS.md order.
EVAL_METRIC_NAMES: tuple[str, ...] = (
    *EVAL_RETURN.values(),
    EVAL_RAW_RETURN_MEAN,
    EVAL_LENGTH_MEAN,
    *(EVAL_OUTCOME_RATE.format(outcome=o) for o in OUTCOMES),
    EVAL_SUCCESS_LOW,
    EVAL_SUCCESS_HIGH,
    EVAL_FAILURE_REASON_RATE,
    EVAL_START_SUCCESS_RATE,
    EVAL_START_SUCCESS_LOW,
    EVAL_START_SUCCESS_HIGH,
    EVAL_START_EPISODES,
    EVAL_PASS,
    EVAL_PLANNED,
    EVAL_COMPLETED,
    EVAL_CHECKPOINT_STEP,
)

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def segment(value: str) -> str:
    """``value`` as one metric path segment: unsafe characters become ``_``; empty becomes ``none``."""
    return _UNSAFE.sub("_", value) or "none"
