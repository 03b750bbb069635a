"""``gradlab benchmark run``'s arithmetic: the ratio per round and the medians without the first command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gradlab.benchmarks.run import _BARE, Row, render, summary


def test_ratio_and_summary_leave_the_first_command_out(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [
        Row("cartpole-acceptance", 0, "succeeded", 40.0, 4.0, 40_000, 20.0, "new process", "in-process", "started"),
        Row("cartpole-acceptance", 0, "succeeded", 12.0, 0.5, 40_000, 20.0, "zygote", "warm", "daemon"),
        Row("cartpole-acceptance", 1, "succeeded", 15.0, 0.5, 50_000, 25.0, "zygote", "warm", "daemon"),
        Row("cartpole-acceptance", 2, "succeeded", 9.0, 0.5, 30_000, 10.0, "zygote", "warm", "daemon"),
        Row("bandit-acceptance", 0, "failed", 30.0, 0.5, None, None, "zygote", "warm", "daemon"),
    ]
    assert rows[0].first and rows[0].ratio == 2.0 and rows[2].ratio == 0.6 and rows[4].ratio is None
    agg = summary(rows)
    # 12/20 = 0.6, 15/25 = 0.6, 9/10 = 0.9: the first command (40/20 = 2.0) is not counted.
    assert agg["cartpole-acceptance"] == {"rounds": 3, "wall_s_median": 12.0, "bare_s_median": 20.0,
                                          "ratio_median": 0.6, "ratio_min": 0.6, "ratio_max": 0.9}
    assert agg["bandit-acceptance"] == {"rounds": 1, "wall_s_median": 30.0, "bare_s_median": None,
                                        "ratio_median": None, "ratio_min": None, "ratio_max": None}
    render(rows, as_json=True)
    doc = json.loads(capsys.readouterr().out)
    assert [r["first"] for r in doc["rows"]] == [True, False, False, False, False]
    assert doc["summary"]["cartpole-acceptance"]["ratio_median"] == 0.6
    assert doc["first_command"] is None  # no server start-up measured for it


@pytest.mark.parametrize(("startup_s", "met"), [(28.0, True), (27.9, False)])
def test_the_first_command_is_judged_against_the_servers_start_up_over_a_warm_command(
        startup_s: float, met: bool, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [
        Row("cartpole-acceptance", 0, "succeeded", 40.0, 4.0, 40_000, 20.0, "zygote", "warm", "started", startup_s),
        Row("cartpole-acceptance", 0, "succeeded", 12.0, 0.5, 40_000, 20.0, "zygote", "warm", "daemon"),
        Row("cartpole-acceptance", 1, "succeeded", 15.0, 0.5, 50_000, 25.0, "zygote", "warm", "daemon"),
        Row("cartpole-acceptance", 2, "succeeded", 9.0, 0.5, 30_000, 10.0, "zygote", "warm", "daemon"),
    ]
    render(rows, as_json=True)  # 40 s first, warm median 12 s: 28 s over it
    assert json.loads(capsys.readouterr().out)["first_command"] == {
        "wall_s": 40.0, "warm_wall_s_median": 12.0, "over_warm_s": 28.0, "server_startup_s": startup_s, "met": met}
    render(rows, as_json=False)
    line = " ".join(capsys.readouterr().out.split())
    assert (f"first command of a fresh shell: 40.0 s, 28.0 s over the warm median (12.0 s); the server's own "
            f"start-up (daemon.log): {startup_s:.1f} s; goal (at most the start-up over a warm command): "
            f"{'met' if met else 'not met'}") in line


def test_bare_side_trains_the_recipe_for_the_given_steps() -> None:
    """The bare SB3 script runs the bandit's recipe (a goal only gradlab provides) for 256 steps."""
    out = subprocess.run([sys.executable, "-c", _BARE, "gradlab__bandit/ppo", "256", "0"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip().splitlines()[-1]) > 0
