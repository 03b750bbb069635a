"""Cohorts without survivorship bias: a seed that promoted nothing scores its best evaluated
result, a seed with no evaluated result is left out by name, and leaders, compare, the report
and the sweep's cohort receipt all say so (file stores, receipts written with the real models)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

T0 = datetime(2026, 1, 3, tzinfo=UTC)
IDS = [f"gradlab-20260103T00000{i}-0000000{i}" for i in range(3)]


def _run(stores, i: int, rates: list[float], promote: int | None, outcome: str) -> None:
    """Run ``IDS[i]`` of gradlab__bandit/ppo, seed i: one checkpoint per rate (steps 1000, 2000, ...)."""
    from gradlab.contracts.hashing import sha256_json
    from gradlab.receipts.io import dump_model
    from gradlab.receipts.models import (
        Attempt,
        EvaluationRecord,
        LearnerExit,
        Promotion,
        RunRecord,
        TerminalCheckpoint,
        TerminalEvaluation,
        TerminalMetrics,
        TerminalPromotion,
        TerminalReceipt,
    )
    from gradlab.stores import keys

    run_id, at = IDS[i], T0 + timedelta(seconds=i)
    stores.control.put_create_only(keys.run_record(run_id), dump_model(RunRecord(
        run_id=run_id, goal_id="gradlab__bandit", recipe_id="ppo", seed=i, display_name=f"s{i}", overrides=[],
        goal_contract_sha256="0" * 64, recipe_sha256="0" * 64, environment_sha256="0" * 64, spec_sha256="0" * 64,
        created_at=at)))
    stores.control.put_create_only(keys.attempt(run_id, "attempt-001"), dump_model(Attempt(
        run_id=run_id, attempt_id="attempt-001", number=1, mode="fresh", host="test", pid=1, started_at=at)))
    ckpts, evaluations, promotion = [], [], None
    for c, rate in enumerate(rates, start=1):
        step, sha, key = 1000 * c, f"{i:016x}{c:048x}", f"{c:08x}{i:024x}"
        result = {"aggregates": {"eval/outcome/success/rate": rate, "eval/episode/return/mean": rate}}
        status = "accepted" if c == promote else "rejected"
        stores.eval.put_create_only(keys.evaluation_result(run_id, key), dump_model(EvaluationRecord(
            intent_key=key, run_id=run_id, checkpoint_step=step, checkpoint_sha256=sha, status=status,
            return_mean=rate, result=result, result_sha256=sha256_json(result), recorded_at=at)))
        uri = f"{stores.model.base_url}/{keys.checkpoint_prefix(run_id, step, sha)}"
        ckpts.append(TerminalCheckpoint(step=step, sha256=sha, uri=uri))
        evaluations.append(TerminalEvaluation(checkpoint_step=step, status=status, return_mean=rate,
                                              result_uri=stores.eval.url(keys.evaluation_result(run_id, key))))
        if c == promote:
            promotion = Promotion(run_id=run_id, attempt_id="attempt-001", checkpoint_step=step, checkpoint_sha256=sha,
                                  uri=uri, evaluation_key=key, result_uri=evaluations[-1].result_uri, return_mean=rate,
                                  promoted_at=at + timedelta(seconds=10))
            stores.control.put_create_only(keys.promotion(run_id), dump_model(promotion))
    stores.control.put_create_only(keys.terminal(run_id, "attempt-001"), dump_model(TerminalReceipt(
        run_id=run_id, attempt_id="attempt-001", goal_id="gradlab__bandit", recipe_id="ppo", seed=i, outcome=outcome,
        reason="test", final_step=1000 * max(len(rates), 1), checkpoints=ckpts, evaluations=evaluations,
        promotion=TerminalPromotion(checkpoint_step=promotion.checkpoint_step, sha256=promotion.checkpoint_sha256,
                                    uri=promotion.uri) if promotion else None,
        metrics=TerminalMetrics(local_high_water=0, sinks={}), drained=True,
        learner=LearnerExit(exit_code=0, stop_reason="budget"), sealed_at=at)))


@pytest.fixture
def stores(gradlab_home: Path):
    from gradlab.stores import open_stores

    stores = open_stores()
    _run(stores, 0, [0.5, 1.0], promote=2, outcome="succeeded")
    _run(stores, 1, [0.9, 0.5], promote=None, outcome="failed")  # its best result is not its last
    _run(stores, 2, [], promote=None, outcome="cancelled")  # nothing evaluated
    return stores


def test_every_seed_is_scored_by_one_rule_and_a_seed_left_out_is_named(stores, gradlab_home: Path) -> None:
    from typer.testing import CliRunner

    from gradlab.cli.app import app
    from gradlab.results.cohort_receipts import build_cohort_receipt
    from gradlab.results.cohorts import SCORING_RULE, find_cohort
    from gradlab.results.reports import build_site
    from gradlab.settings import load_settings

    cohort = find_cohort(stores, "gradlab__bandit/ppo")
    assert [(r.seed, r.score, r.scored_by) for r in cohort.seeds] == [
        (0, 1.0, "promoted"), (1, 0.9, "best evaluated"), (2, None, "not scored")]
    assert sorted(cohort.scores) == [0.9, 1.0]
    assert f"left out (no evaluated result): seed 2 {IDS[2]} (cancelled)" in cohort.note
    assert "2 of 3 seeds scored" in cohort.note

    out = CliRunner().invoke(app, ["leaders", "runs", "--goal", "gradlab__bandit", "--json"])
    assert out.exit_code == 0, out.output
    row = json.loads(out.stdout)[0]
    assert (row["n_seeds"], row["n_scored"], row["scoring_rule"]) == (3, 2, SCORING_RULE)
    assert row["not_scored"] == [{"seed": 2, "run_id": IDS[2], "outcome": "cancelled"}]
    out = CliRunner().invoke(app, ["leaders", "runs", "--goal", "gradlab__bandit"])
    assert "2/3" in out.stdout and IDS[2] in out.stdout and "scoring:" in out.stdout, out.stdout
    out = CliRunner().invoke(app, ["compare", "gradlab__bandit/ppo", "gradlab__bandit/ppo"])
    assert out.exit_code == 0 and "best evaluated" in out.stdout and IDS[2] in out.stdout, out.output

    site = build_site(load_settings(), stores, gradlab_home / "site")
    page = next(p for p in site.root.rglob("*.html") if "gradlab__bandit" in p.name).read_text()
    assert "seeds scored" in page and IDS[2] in page and "best evaluated" in page

    receipt = build_cohort_receipt(stores, cohort_id="cohort-20260103T000000-00000000", recipe="gradlab__bandit/ppo",
                                   overrides=[], seeds=[0, 1, 2], launched=[{"run_id": r, "seed": i} for i, r in
                                                                            enumerate(IDS)],
                                   deployment=None, flow_run_id=None, created_at=T0)
    assert receipt.scoring_rule == SCORING_RULE
    assert [r.scored_by for r in receipt.runs] == ["promoted", "best evaluated", "not scored"]


def test_a_run_whose_latest_attempt_is_not_sealed_has_no_outcome_in_the_cohort_receipt(stores) -> None:
    """Seed 1's first attempt sealed ``failed``; a second attempt opened and has not sealed: the run
    has no outcome yet (the first attempt's is not the run's), and once it seals, that is the outcome."""
    from gradlab.receipts.io import dump_model
    from gradlab.receipts.models import Attempt, TerminalReceipt
    from gradlab.results.cohort_receipts import build_cohort_receipt
    from gradlab.stores import keys

    run_id = IDS[1]
    stores.control.put_create_only(keys.attempt(run_id, "attempt-002"), dump_model(Attempt(
        run_id=run_id, attempt_id="attempt-002", number=2, mode="resume", host="test", pid=2, started_at=T0)))

    def outcomes(cohort_id: str) -> list:
        receipt = build_cohort_receipt(stores, cohort_id=cohort_id, recipe="gradlab__bandit/ppo", overrides=[],
                                       seeds=[0, 1, 2], launched=[{"run_id": r, "seed": i} for i, r in enumerate(IDS)],
                                       deployment=None, flow_run_id=None, created_at=T0)
        return [r.outcome for r in receipt.runs]

    assert outcomes("cohort-20260103T000000-00000001") == ["succeeded", None, "cancelled"]
    first = TerminalReceipt.model_validate_json(stores.control.get(keys.terminal(run_id, "attempt-001")))
    second = first.model_copy(update={"attempt_id": "attempt-002", "outcome": "succeeded"})
    stores.control.put_create_only(keys.terminal(run_id, "attempt-002"), dump_model(second))
    assert outcomes("cohort-20260103T000000-00000002") == ["succeeded", "succeeded", "cancelled"]
