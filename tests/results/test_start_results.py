"""Per-start evaluation metrics where results are shown: ``gradlab eval``'s table, cohort seed
results and the report's seeds table (a goal with several starts, docs/ARCHITECTURE.md section 7)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gradlab.benchmarks.reports import synthesize
from gradlab.results.cohorts import start_success_rates

GOAL = "gradlab__keydoor/TwoStarts"


def test_gradlab_eval_prints_each_starts_success_and_episodes(gradlab_home: Path) -> None:
    from typer.testing import CliRunner

    from gradlab.cli.app import app

    out = CliRunner().invoke(app, ["eval", "--baseline", "noop", GOAL])
    assert out.exit_code == 0, out.output
    # Acceptance below 100% (no fail-fast): each start gets its half of the 8 episodes and its row.
    assert "8 of 8" in out.stdout
    for start in ("corner", "door"):
        row = next(line for line in out.stdout.splitlines() if f"from start {start}" in line)
        assert "success 0.000" in row and "4 episodes" in row, row


def test_seed_results_and_the_report_show_per_start_success(gradlab_home: Path, tmp_path: Path) -> None:
    from gradlab.results.cohorts import goal_results
    from gradlab.results.reports import goal_page
    from gradlab.settings import load_settings
    from gradlab.stores import open_stores

    aggregates = {"eval/start/corner/success/rate": 0.25, "eval/start/door/success/rate": 1.0,
                  "eval/start/door/episodes": 4.0, "eval/outcome/success/rate": 0.625}
    assert start_success_rates(aggregates) == (("corner", 0.25), ("door", 1.0))
    synthesize(gradlab_home, runs=2, rollouts=4)
    stores = open_stores()
    plain = goal_results(stores, "gradlab__bandit")
    assert plain and all(r.start_success == () for r in plain)  # one start: nothing per start
    assert plain[0].as_json()["start_success"] == {}
    results = [dataclasses.replace(r, start_success=start_success_rates(aggregates)) for r in plain]
    assert results[0].as_json()["start_success"] == {"corner": 0.25, "door": 1.0}
    html = goal_page(load_settings(), stores, "gradlab__bandit", results)
    seeds = html[html.index("<table id='seeds'>"):]
    seeds = seeds[:seeds.index("</table>")]
    assert "<th>success from corner</th><th>success from door</th>" in seeds
    assert "<td>0.250</td><td>1.000</td></tr>" in seeds
    assert "success from" not in goal_page(load_settings(), stores, "gradlab__bandit", plain)
