"""Cohorts of seeds, their per-seed scores and statistics, the cohort receipt, and leaders
(docs/ARCHITECTURE.md section 12).

A cohort is the runs of one recipe of one goal with the same overrides, one per seed (the latest
run of a seed counts). Overrides are compared in their canonical form (:func:`canonical_overrides`:
one per key, the last given winning, sorted by key), so ``--set a=1 --set b=2`` and ``--set b=2
--set a=1`` are one cohort. ``gradlab sweep`` trains one and seals a create-only :class:`CohortReceipt`
under ``cohorts/<cohort_id>.json`` in the control store; runs trained one by one with ``gradlab
train --seed`` join the same cohort when recipe and overrides match. The receipt itself is
:mod:`gradlab.results.cohort_receipts`.

Per seed (:class:`SeedResult`): the evaluation of the promoted checkpoint, or of the highest-step
evaluated checkpoint when nothing was promoted; its objective score (the goal's ``objective.rank``
metric; where that is a ``train/`` metric, as on a training-only goal, the value its terminal
receipt recorded from the attempt's last training report: ``TerminalMetrics.objective``), return mean, success rate; steps to acceptance (the promoted step) and wall time to
acceptance (first attempt start to promotion). Statistics: :mod:`gradlab.results.stats`.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gradlab.errors import ContractViolation, NotFound
from gradlab.results import stats

log = logging.getLogger(__name__)

SCORED_PROMOTED, SCORED_BEST, SCORED_TRAINING, NOT_SCORED = "promoted", "best evaluated", "training", "not scored"
#: How every seed of a cohort is scored, the same in ``leaders``, ``compare``, reports and the
#: sweep's cohort receipt (which say it): no seed drops out silently.
SCORING_RULE = ("each seed scores its promoted checkpoint's evaluation; a seed that promoted nothing (failed, "
                "cancelled, rejected) scores its best evaluated result; where the goal's objective is a training "
                "metric (a training-only goal), each seed scores that metric's last training value, from its "
                "receipt; a seed with no score is left out of the statistics and named")
_FALLBACK_OBJECTIVE = ("eval/episode/return/mean", "maximize")


# -- per-seed results ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SeedResult:
    """One run's contribution to its cohort (see the module docstring)."""

    run_id: str
    goal_id: str
    recipe_id: str
    overrides: tuple[str, ...]
    seed: int
    outcome: str | None
    score: float | None
    return_mean: float | None
    success_rate: float | None
    evaluated_step: int | None
    accepted: bool
    steps_to_acceptance: int | None
    seconds_to_acceptance: float | None
    checkpoint_sha256: str | None
    created_at: datetime
    scored_by: str = "not scored"  #: promoted | best evaluated | training | not scored (:data:`SCORING_RULE`)
    #: (start name, success rate) of the scored evaluation (``eval/start/{start}/success/rate``), by
    #: name; empty for a goal with one start.
    start_success: tuple[tuple[str, float], ...] = ()

    @property
    def cohort(self) -> tuple[str, str, tuple[str, ...]]:
        return self.goal_id, self.recipe_id, self.overrides

    def as_json(self) -> dict:
        out = {k: (v.isoformat() if isinstance(v, datetime) else list(v) if isinstance(v, tuple) else v)
               for k, v in self.__dict__.items()}
        out["start_success"] = dict(self.start_success)
        return out


def start_success_rates(aggregates: dict) -> tuple[tuple[str, float], ...]:
    """(start name, ``eval/start/{start}/success/rate``) of an evaluation's aggregates, by name."""
    prefix, suffix = "eval/start/", "/success/rate"
    return tuple((k[len(prefix):-len(suffix)], float(v)) for k, v in sorted(aggregates.items())
                 if k.startswith(prefix) and k.endswith(suffix) and k.count("/") == 4)


def canonical_overrides(overrides: Iterable[str] | None) -> tuple[str, ...]:
    """``--set`` overrides in the one form cohorts are keyed by: ``key=value`` with the key and value
    stripped, one per key (the last given wins, as when they are applied), sorted by key.

    Examples: ``["b=2", "a = 1", "b=3"]`` → ``("a=1", "b=3")``.
    """
    last: dict[str, str] = {}
    for text in overrides or ():
        key, sep, value = str(text).partition("=")
        key = key.strip()
        last.pop(key, None)
        last[key] = f"{key}={value.strip()}" if sep else key
    return tuple(last[k] for k in sorted(last))


def split_recipe_ref(ref: str) -> tuple[str, str]:
    """``GOAL/RECIPE`` (the goal may be a nested path) -> (goal id, recipe id).

    Raises:
        ContractViolation: not GOAL/RECIPE with valid ids.
    """
    from gradlab.contracts.experiments import split_ref
    from gradlab.errors import ConfigError

    try:
        return split_ref(ref)
    except ConfigError as e:
        raise ContractViolation(f"{ref!r}: expected GOAL/RECIPE ({e})") from None


def require_goal(stores, goal_id: str) -> None:
    """Refuse a goal id that is neither in the experiments tree nor the goal of any sealed run.

    A goal removed from the tree since its runs were sealed stays readable; the tree is looked at
    first, so a known goal costs no store listing.

    Raises:
        NotFound: ``unknown goal 'X'`` with a did-you-mean or the known goals.
    """
    from gradlab.contracts.experiments import check_id
    from gradlab.errors import GradlabError
    from gradlab.receipts import list_runs, read_run

    try:
        check_id("goal", goal_id)
    except GradlabError as e:
        raise NotFound(f"unknown goal {goal_id!r}: {e}") from None
    try:
        experiments = _experiments()
        known = experiments.goal_ids()
    except GradlabError:  # no experiments tree here: only sealed runs can name the goal
        experiments, known = None, []
    if goal_id in known:
        return
    for run_id in list_runs(stores):
        try:
            if read_run(stores, run_id).goal_id == goal_id:
                return
        except NotFound:
            continue
    if experiments is not None:
        experiments.goal_path(goal_id)  # raises: unknown goal 'X' (did you mean ... / known goals: ...)
    raise NotFound(f"unknown goal {goal_id!r}: no experiments tree here and no sealed run of it in "
                   f"{stores.control.base_url}")


def require_recipe(stores, ref: str) -> None:
    """Refuse ``GOAL/RECIPE`` whose goal is unknown (:func:`require_goal`) or whose recipe is neither
    in the goal's ``recipes/`` nor the recipe of a sealed run of the goal.

    Raises:
        ContractViolation: ``ref`` is not GOAL/RECIPE. NotFound: unknown goal or recipe (names the
            goal's recipes).
    """
    goal_id, recipe_id = split_recipe_ref(ref)
    require_goal(stores, goal_id)
    try:
        known = _experiments().recipe_ids(goal_id)
    except Exception:  # noqa: BLE001 - an id the tree refuses: only sealed runs can name it
        known = []
    if recipe_id in known:
        return
    from gradlab.receipts import list_runs, read_run

    for run_id in list_runs(stores):
        try:
            record = read_run(stores, run_id)
        except NotFound:
            continue
        if (record.goal_id, record.recipe_id) == (goal_id, recipe_id):
            return
    import difflib

    hint = difflib.get_close_matches(recipe_id, known, n=1)
    raise NotFound(f"unknown recipe {ref!r}: goal {goal_id} has no recipe {recipe_id!r}"
                   + (f" (did you mean {goal_id}/{hint[0]}?)" if hint else "")
                   + (f"; its recipes: {', '.join(known)}" if known else ""))


def cohort_label(recipe_id: str, overrides: Sequence[str]) -> str:
    """``recipe`` or ``recipe [k=v, ...]``."""
    return recipe_id + (f" [{', '.join(overrides)}]" if overrides else "")


#: W&B's longest group name.
WANDB_GROUP_MAX = 128


def cohort_group(goal_id: str, recipe_id: str, overrides: Iterable[str] | None) -> str:
    """The leaders' cohort key of a run (goal, recipe, canonical overrides) as one string: its W&B group.

    Every run of one cohort (a ``sweep``'s seeds and runs trained one by one with ``gradlab train``
    alike) gets the same group, so the runs the leaders table counts together appear together in
    W&B (docs/ARCHITECTURE.md section 10).

    Returns:
        ``goal/recipe`` or ``goal/recipe [k=v, ...]`` (:func:`canonical_overrides`); past W&B's
        128 characters, ``goal/recipe [overrides sha256:<16 hex>]`` (of the canonical overrides' JSON list).
    """
    canonical = canonical_overrides(overrides)
    group = f"{goal_id}/{cohort_label(recipe_id, canonical)}"
    if len(group) <= WANDB_GROUP_MAX:
        return group
    from gradlab.contracts.hashing import sha256_json

    return f"{goal_id}/{recipe_id} [overrides sha256:{sha256_json(list(canonical))[:16]}]"


def goal_objective(goal_id: str) -> tuple[str, str]:
    """(metric, direction) of the goal's objective; ``eval/episode/return/mean``, maximize when the
    goal is no longer in the experiments tree."""
    try:
        goal = _experiments().load_goal(goal_id)
    except Exception as e:  # noqa: BLE001 - a goal removed or renamed since its runs: the generic objective
        log.debug("goal %s not loadable (%s): ranking by the return mean", goal_id, e)
        return _FALLBACK_OBJECTIVE
    return goal.objective.rank, goal.objective.direction


_EXPERIMENTS = None


def _experiments():
    global _EXPERIMENTS
    from gradlab.contracts import Experiments

    if _EXPERIMENTS is None:
        _EXPERIMENTS = Experiments()
    return _EXPERIMENTS


def _eval_key(stores, uri: str | None) -> str | None:
    base = stores.eval.base_url.rstrip("/") + "/"
    return uri[len(base):] if uri and uri.startswith(base) else None


def seed_result(stores, run_id: str, *, objective: tuple[str, str] | None = None) -> SeedResult | None:
    """The run's per-seed result from its latest sealed terminal receipt; None when it has none yet.

    The evaluation record read is checked to be of the checkpoint the receipt names (sha256).

    Raises:
        NotFound: no run ``run_id``.
    """
    from gradlab.receipts import list_attempts, read_promotion, read_run, read_terminal
    from gradlab.receipts.io import read_optional
    from gradlab.receipts.models import EvaluationRecord

    record = read_run(stores, run_id)
    attempts = list_attempts(stores, run_id)
    receipt = next((r for a in reversed(attempts) if (r := read_terminal(stores, run_id, a.attempt_id))), None)
    if receipt is None:
        return None
    metric, direction = objective or goal_objective(record.goal_id)
    shas = {c.step: c.sha256 for c in receipt.checkpoints}
    evaluated = [e for e in receipt.evaluations if e.status in ("accepted", "rejected") and e.result_uri]

    def aggregates_of(e) -> dict:
        key = _eval_key(stores, e.result_uri)
        rec = read_optional(stores.eval, key, EvaluationRecord) if key else None
        if rec is not None and rec.checkpoint_sha256 != shas.get(e.checkpoint_step):
            raise ContractViolation(f"run {run_id}: evaluation {e.result_uri} is of checkpoint "
                                    f"{rec.checkpoint_sha256[:16]}, the receipt lists {shas.get(e.checkpoint_step)}")
        return (rec.result or {}).get("aggregates", {}) if rec is not None else {}

    def score_of(e, aggregates: dict) -> float | None:
        value = aggregates.get(metric, e.return_mean if metric == "eval/episode/return/mean" else None)
        return None if value is None else float(value)

    chosen, aggregates, scored_by = None, {}, NOT_SCORED
    if receipt.promotion is not None:
        chosen = next((e for e in evaluated if e.checkpoint_step == receipt.promotion.checkpoint_step), None)
        if chosen is not None:
            aggregates, scored_by = aggregates_of(chosen), SCORED_PROMOTED
    if chosen is None and evaluated:  # nothing promoted: the best evaluated result, never only the survivors
        sign = 1.0 if direction == "maximize" else -1.0
        scored = [(e, a) for e in evaluated if score_of(e, a := aggregates_of(e)) is not None]
        if scored:
            chosen, aggregates = max(scored, key=lambda ea: (sign * score_of(*ea), -ea[0].checkpoint_step))
            scored_by = SCORED_BEST
    seconds = None
    promotion = read_promotion(stores, run_id) if receipt.promotion is not None else None
    if promotion is not None and attempts:
        seconds = (promotion.promoted_at - attempts[0].started_at).total_seconds()
    score = score_of(chosen, aggregates) if chosen is not None else None
    trained = receipt.metrics.objective
    if metric.startswith("train/") and trained is not None and trained.metric == metric:
        score, scored_by = trained.value, SCORED_TRAINING  # a training-only goal ranks by its training metric
    return SeedResult(
        run_id=run_id, goal_id=record.goal_id, recipe_id=record.recipe_id,
        overrides=canonical_overrides(record.overrides),
        seed=record.seed, outcome=receipt.outcome, score=score, scored_by=scored_by if score is not None else NOT_SCORED,
        return_mean=chosen.return_mean if chosen is not None else None,
        success_rate=aggregates.get("eval/outcome/success/rate"),
        evaluated_step=chosen.checkpoint_step if chosen is not None else None,
        accepted=receipt.promotion is not None,
        steps_to_acceptance=receipt.promotion.checkpoint_step if receipt.promotion is not None else None,
        seconds_to_acceptance=seconds, checkpoint_sha256=shas.get(chosen.checkpoint_step) if chosen else None,
        created_at=record.created_at, start_success=start_success_rates(aggregates),
    )


def goal_results(stores, goal_id: str | None = None, run_ids: Iterable[str] | None = None) -> list[SeedResult]:
    """Per-seed results of every sealed run (of ``goal_id`` when given), latest run per seed and cohort."""
    from gradlab.receipts import list_runs, read_run

    objectives: dict[str, tuple[str, str]] = {}
    latest: dict[tuple, SeedResult] = {}
    for run_id in run_ids if run_ids is not None else list_runs(stores):
        try:
            record = read_run(stores, run_id)
        except NotFound:
            continue
        if goal_id is not None and record.goal_id != goal_id:
            continue
        objective = objectives.setdefault(record.goal_id, goal_objective(record.goal_id))
        result = seed_result(stores, run_id, objective=objective)
        if result is None:
            continue
        key = (*result.cohort, result.seed)
        if key not in latest or result.created_at >= latest[key].created_at:
            latest[key] = result
    return sorted(latest.values(), key=lambda r: (r.goal_id, r.recipe_id, r.overrides, r.seed))


# -- cohort statistics -----------------------------------------------------------------------------
@dataclass(frozen=True)
class CohortStats:
    """A cohort's seeds and statistics (``score`` is the goal's objective metric)."""

    goal_id: str
    recipe_id: str
    overrides: tuple[str, ...]
    objective: str
    direction: str
    seeds: list[SeedResult]
    iqm: stats.Estimate
    median: stats.Estimate
    success_median: stats.Estimate
    steps_to_acceptance: stats.Estimate
    seconds_to_acceptance: stats.Estimate
    accepted: int
    scores: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        return cohort_label(self.recipe_id, self.overrides)

    @property
    def not_scored(self) -> list[SeedResult]:  # no evaluated result: left out of the statistics, named
        return [r for r in self.seeds if r.score is None]

    @property
    def note(self) -> str:
        """What the statistics count, for a person: the seeds scored, by which rule, and any left out by name."""
        best = [f"seed {r.seed}" for r in self.seeds if r.scored_by == SCORED_BEST]
        trained = [f"seed {r.seed}" for r in self.seeds if r.scored_by == SCORED_TRAINING]
        out = [f"seed {r.seed} {r.run_id} ({r.outcome or 'no receipt'})" for r in self.not_scored]
        why = "no training report of the objective" if self.objective.startswith("train/") else "no evaluated result"
        return "; ".join([f"{len(self.scores)} of {len(self.seeds)} seed{'s' if len(self.seeds) != 1 else ''} scored"]
                         + ([f"by the best evaluated result (nothing promoted): {', '.join(best)}"] if best else [])
                         + ([f"by the last training value of {self.objective}: {', '.join(trained)}"] if trained else [])
                         + ([f"left out ({why}): {', '.join(out)}"] if out else []))

    def as_json(self) -> dict:
        return {"goal_id": self.goal_id, "recipe_id": self.recipe_id, "overrides": list(self.overrides),
                "label": self.label, "objective": self.objective, "direction": self.direction,
                "n_seeds": len(self.seeds), "n_scored": len(self.scores), "accepted": self.accepted,
                "scoring_rule": SCORING_RULE, "note": self.note,
                "not_scored": [{"seed": r.seed, "run_id": r.run_id, "outcome": r.outcome} for r in self.not_scored],
                "iqm": self.iqm.as_json(), "median_iqr": self.median.as_json(),
                "success_rate_median_iqr": self.success_median.as_json(),
                "steps_to_acceptance_median_iqr": self.steps_to_acceptance.as_json(),
                "seconds_to_acceptance_median_iqr": self.seconds_to_acceptance.as_json(),
                "seeds": [s.as_json() for s in self.seeds]}


def _median_or_none(values: list[float]) -> stats.Estimate:
    return stats.median_iqr(values) if values else stats.Estimate(None, None, None, 0, "no values")


def cohort_stats(results: Sequence[SeedResult], *, seed: int = 0) -> CohortStats:
    """Statistics of one cohort's seeds (all of the same goal, recipe and overrides).

    Raises:
        ContractViolation: ``results`` is empty or mixes cohorts.
    """
    if not results:
        raise ContractViolation("a cohort needs at least one run")
    if len({r.cohort for r in results}) != 1:
        raise ContractViolation("cohort_stats: the runs are of different goals, recipes or overrides")
    first = results[0]
    metric, direction = goal_objective(first.goal_id)
    scores = [r.score for r in results if r.score is not None]
    estimate = stats.iqm_estimate(scores, seed=seed) if scores else stats.Estimate(None, None, None, 0, "no evaluated seed")
    return CohortStats(
        goal_id=first.goal_id, recipe_id=first.recipe_id, overrides=first.overrides, objective=metric,
        direction=direction, seeds=list(results), iqm=estimate, median=_median_or_none(scores),
        success_median=_median_or_none([r.success_rate for r in results if r.success_rate is not None]),
        steps_to_acceptance=_median_or_none([float(r.steps_to_acceptance) for r in results
                                             if r.steps_to_acceptance is not None]),
        seconds_to_acceptance=_median_or_none([r.seconds_to_acceptance for r in results
                                               if r.seconds_to_acceptance is not None]),
        accepted=sum(r.accepted for r in results), scores=scores,
    )


def cohorts(results: Sequence[SeedResult]) -> list[CohortStats]:
    """Every cohort among ``results`` with its statistics."""
    groups: dict[tuple, list[SeedResult]] = defaultdict(list)
    for r in results:
        groups[r.cohort].append(r)
    return [cohort_stats(g) for _, g in sorted(groups.items())]


def find_cohort(stores, ref: str, overrides: Sequence[str] | None = None) -> CohortStats:
    """The cohort of ``GOAL/RECIPE``: with exactly ``overrides`` (in any order: compared canonically,
    :func:`canonical_overrides`) when given; otherwise the recipe's only cohort, or else its cohort
    without overrides.

    Raises:
        ContractViolation: ``ref`` is not GOAL/RECIPE, or ``overrides`` is None and the recipe has
            several cohorts, none without overrides (names them).
        NotFound: an unknown goal or recipe (:func:`require_recipe`), or no sealed run of it.
    """
    require_recipe(stores, ref)
    goal_id, recipe_id = split_recipe_ref(ref)
    mine = [r for r in goal_results(stores, goal_id) if r.recipe_id == recipe_id]
    if not mine:
        raise NotFound(f"{ref}: no sealed runs in {stores.control.base_url} (train some with `gradlab sweep {ref} --seeds N`)")
    groups: dict[tuple[str, ...], list[SeedResult]] = defaultdict(list)
    for r in mine:
        groups[r.overrides].append(r)
    if overrides is not None:
        chosen = groups.get(canonical_overrides(overrides))
        if not chosen:
            raise NotFound(f"{ref}: no sealed runs with overrides {list(canonical_overrides(overrides))} (found: "
                           f"{'; '.join(cohort_label(recipe_id, o) for o in groups)})")
    elif len(groups) == 1:
        chosen = next(iter(groups.values()))
    elif () in groups:
        chosen = groups[()]
    else:
        raise ContractViolation(f"{ref}: several cohorts ({'; '.join(cohort_label(recipe_id, o) for o in groups)}); "
                                "name one with its overrides")
    return cohort_stats(chosen)


def compare(a: CohortStats, b: CohortStats, *, seed: int = 0) -> stats.Estimate:
    """P(a random seed of A beats one of B) on the goal's objective (direction respected).

    Raises:
        ContractViolation: the cohorts are of different goals, or one has no evaluated seed.
    """
    if a.goal_id != b.goal_id:
        raise ContractViolation(f"compare: {a.goal_id}/{a.recipe_id} and {b.goal_id}/{b.recipe_id} are of different "
                                "goals; their scores are not comparable")
    for c in (a, b):
        if not c.scores:
            raise ContractViolation(f"compare: {c.goal_id}/{c.label} has no evaluated seed")
    sign = 1.0 if a.direction == "maximize" else -1.0
    return stats.probability_of_improvement_estimate([sign * s for s in a.scores], [sign * s for s in b.scores],
                                                     seed=seed)


def leaders_runs(stores, goal_id: str, *, min_seeds: int = 1, results: Sequence[SeedResult] | None = None) -> list[CohortStats]:
    """Cohorts of ``goal_id`` with at least ``min_seeds`` scored seeds, best IQM first.

    Raises:
        NotFound: an unknown goal (:func:`require_goal`), or the goal has no sealed runs.
    """
    if results is None:
        require_goal(stores, goal_id)
    results = list(results) if results is not None else goal_results(stores, goal_id)
    if not results:
        raise NotFound(f"goal {goal_id}: no sealed runs in {stores.control.base_url}")
    found = [c for c in cohorts(results) if len(c.scores) >= min_seeds]
    maximize = not found or found[0].direction == "maximize"
    return sorted(found, key=lambda c: (c.iqm.value is None, -(c.iqm.value or 0.0) if maximize else (c.iqm.value or 0.0)))


@dataclass(frozen=True)
class CheckpointLeader:
    run_id: str
    recipe_id: str
    seed: int
    step: int
    sha256: str
    uri: str
    return_mean: float | None
    promoted: bool

    @property
    def play_command(self) -> str:
        return f"gradlab play {self.run_id}:{self.step}"

    def as_json(self) -> dict:
        return {**self.__dict__, "play_command": self.play_command}


def leaders_checkpoints(stores, goal_id: str, *, limit: int = 10) -> list[CheckpointLeader]:
    """Accepted checkpoints of ``goal_id``'s runs, highest evaluation return mean first.

    Raises:
        NotFound: an unknown goal (:func:`require_goal`), or the goal has no sealed runs.
    """
    from gradlab.receipts import list_attempts, list_runs, read_run, read_terminal

    require_goal(stores, goal_id)
    found: list[CheckpointLeader] = []
    any_run = False
    for run_id in list_runs(stores):
        record = read_run(stores, run_id)
        if record.goal_id != goal_id:
            continue
        attempts = list_attempts(stores, run_id)
        receipt = next((r for a in reversed(attempts) if (r := read_terminal(stores, run_id, a.attempt_id))), None)
        if receipt is None:
            continue
        any_run = True
        ckpts = {c.step: c for c in receipt.checkpoints}
        promoted = receipt.promotion.checkpoint_step if receipt.promotion else None
        for e in receipt.evaluations:
            if e.status == "accepted" and e.checkpoint_step in ckpts:
                c = ckpts[e.checkpoint_step]
                found.append(CheckpointLeader(run_id=run_id, recipe_id=record.recipe_id, seed=record.seed, step=c.step,
                                              sha256=c.sha256, uri=c.uri, return_mean=e.return_mean,
                                              promoted=c.step == promoted))
    if not any_run:
        raise NotFound(f"goal {goal_id}: no sealed runs in {stores.control.base_url}")
    found.sort(key=lambda c: (c.return_mean is None, -(c.return_mean or 0.0), c.step))
    return found[:limit]
