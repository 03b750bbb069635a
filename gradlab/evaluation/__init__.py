"""Evaluation: fixed episode manifests, the runner, acceptance, statistics, backends.

Public names (shipped defaults in brackets):
    build_manifest, EpisodeManifest, EpisodeIdentity: the goal's fixed episode list (``manifest``).
    EvalRequest, EvalResult, EpisodeRow: the JSON request and result every backend shares (``result``).
    run_evaluation(request) -> EvalResult: load a checkpoint weights-only and run its manifest (``runner``).
    evaluate_policy(...): the same for any object with ``act(obs, *, deterministic, rng)`` (``runner``).
    validate_result(result, *, expected, goal): recompute aggregates and verdict; refuse mismatches.
    compute_aggregates, wilson_interval, requires_perfect_success: statistics and acceptance.
    get_backend(name) [local]: ``local`` (process pool on spare cores) or ``modal`` (``backends``).

Importing this package does not import torch or any environment library; the runner imports them
when it runs. Early stop on training metrics is the learner's (:mod:`gradlab.learn.early_stop`).
"""

from __future__ import annotations

from typing import Any

from gradlab.evaluation.acceptance import requires_perfect_success, rules_pass
from gradlab.evaluation.manifest import PROTOCOL_VERSION, EpisodeIdentity, EpisodeManifest, build_manifest
from gradlab.evaluation.result import (
    EpisodeRow,
    EvalRequest,
    EvalResult,
    build_result,
    compute_aggregates,
    validate_result,
)
from gradlab.evaluation.stats import wilson_interval

_LAZY = {
    "run_evaluation": "gradlab.evaluation.runner",
    "evaluate_policy": "gradlab.evaluation.runner",
    "run_episodes": "gradlab.evaluation.runner",
    "get_backend": "gradlab.evaluation.backends",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gradlab.evaluation' has no attribute {name!r}")


__all__ = [
    "PROTOCOL_VERSION", "EpisodeIdentity", "EpisodeManifest", "EpisodeRow", "EvalRequest", "EvalResult",
    "build_manifest", "build_result", "compute_aggregates", "evaluate_policy", "get_backend",
    "requires_perfect_success", "rules_pass", "run_episodes", "run_evaluation", "validate_result",
    "wilson_interval",
]
