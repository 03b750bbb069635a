"""Exact Wilson bounds at 0 and n successes, and `gradlab eval`'s human table for goals with and
without success events (CartPole: every episode a 500-step timeout; the bandit: hits and misses)."""

from __future__ import annotations

import pytest

from gradlab.evaluation.result import EpisodeRow, build_result
from gradlab.evaluation.stats import Z_95, wilson_interval

Z2 = Z_95 * Z_95  # 3.841458820694124


def test_wilson_zero_successes_low_is_exactly_zero():
    low, high = wilson_interval(0, 100)
    assert low == 0.0 and str(low) == "0.0"  # not 3.47e-18
    # k = 0: high = (z²/2n + z²/2n) / (1 + z²/n) = z² / (n + z²) = 3.8414588 / 103.8414588
    assert high == pytest.approx(Z2 / (100 + Z2), rel=1e-12)
    assert round(high, 4) == 0.0370


def test_wilson_all_successes_high_is_exactly_one():
    low, high = wilson_interval(100, 100)
    assert high == 1.0
    # k = n: low = n / (n + z²) = 100 / 103.8414588
    assert low == pytest.approx(100 / (100 + Z2), rel=1e-12)
    assert round(low, 4) == 0.9630


def test_wilson_bounds_stay_in_unit_interval():
    for n in (1, 2, 3, 7, 10, 33, 100, 1000):
        for k in range(n + 1):
            low, high = wilson_interval(k, n)
            assert 0.0 <= low <= k / n <= high <= 1.0, (k, n, low, high)


def _rows(outcomes: list[tuple[str, str]], length: int) -> list[EpisodeRow]:
    return [EpisodeRow(index=i, lane=0, seed=i, start=None, **{"return": float(length)}, raw_return=float(length),
                       length=length, outcome=o, reason=r) for i, (o, r) in enumerate(outcomes)]


def _spec(ref: str):
    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec

    return RunSpec.from_resolved(Experiments().resolve(ref), seed=0, run_id="gradlab-20260101T000000-0000abcd")


def _table(spec, rows, capsys) -> str:
    from gradlab.cli.eval_cmds import _render

    result = build_result(rows, goal=spec.goal, planned=len(rows), policy="deterministic", checkpoint_sha256="ab" * 32,
                          checkpoint_step=16384, hashes={})
    _render(result, spec.goal, protocol=True, success_defined=bool(spec.eval_environment.task.termination.success))
    return result, capsys.readouterr().out


def test_cartpole_table_shows_outcomes_not_success_rate(capsys):
    spec = _spec("CartPole-v1/ppo")
    assert spec.eval_environment.task.termination.success == []
    result, out = _table(spec, _rows([("timeout", "native_time_limit")] * 100, 500), capsys)
    assert "outcomes" in out and "timeout 100/100" in out
    assert "success rate" not in out and "95% CI" not in out
    assert "accepted" in out and "eval/episode/return/mean = 500 >= 475: pass" in out
    # The JSON fields are unchanged, the interval's low bound now exactly 0.
    agg = result.as_json()["aggregates"]
    assert agg["eval/outcome/success/rate"] == 0.0 and agg["eval/outcome/timeout/rate"] == 1.0
    assert agg["eval/outcome/success/rate_ci95_low"] == 0.0
    assert agg["eval/outcome/success/rate_ci95_high"] == pytest.approx(Z2 / (100 + Z2), rel=1e-12)


def test_bandit_table_keeps_success_rate_and_counts(capsys):
    spec = _spec("gradlab__bandit/ppo")
    assert spec.eval_environment.task.termination.success == ["hit"]
    rows = _rows([("success", "hit")] * 95 + [("failure", "miss")] * 5, 1)
    _, out = _table(spec, rows, capsys)
    assert "success 95/100, failure 5/100" in out
    # Wilson 95/100: (0.8882, 0.9785) (Wilson 1927; the docstring's example)
    assert "success rate" in out and "0.950 [95% CI 0.888, 0.978]" in out
    assert "failure reasons" in out and "miss 0.050" in out
