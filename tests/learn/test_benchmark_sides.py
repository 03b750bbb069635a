"""`gradlab benchmark learner` compares like with like: both sides train the same policy."""

from __future__ import annotations

import pytest

from gradlab.benchmarks.learner import measure


def test_plain_and_gradlab_sides_end_with_the_same_parameters() -> None:
    # CartPole-v1/ppo: 8 lanes x n_steps 32 = 256 steps per rollout; 512 steps = 2 rollouts, 2 updates.
    plain = measure("cartpole", "plain", 512)
    ours = measure("cartpole", "gradlab", 512)
    assert (plain.steps, ours.steps) == (512, 512)
    # Same seeds, same vector env, same hyperparameters -> the same actions and the same updates:
    # the ratio of the two timings is the learner's own overhead, nothing else.
    assert ours.params_sha256 == plain.params_sha256
    assert len(ours.params_sha256) == 64
    # The phases add up to the total on both sides; gradlab reports its own parts of "other".
    for m in (plain, ours):
        assert m.rollout_s > 0 and m.update_s > 0
        assert m.rollout_s + m.update_s + m.other_s == pytest.approx(m.seconds)
    assert set(ours.detail) == {"bookkeeping_s", "checkpoint_s"}
    assert ours.detail["checkpoint_s"] > 0  # the final checkpoint (512 < checkpoint_freq 16384)
    assert plain.detail == {}


def test_an_unknown_case_is_a_usage_error_naming_the_cases() -> None:
    from typer.testing import CliRunner

    from gradlab.cli.app import app

    for args in (["--case", "cartpol"], ["--backend", "gradlab.ppo", "--case", "cartpole", "--case", "pong"]):
        res = CliRunner().invoke(app, ["benchmark", "learner", "--rounds", "1", *args])
        text = " ".join(res.output.replace("│", " ").split())
        assert res.exit_code == 2 and "--case" in text and "expected cartpole or breakout" in text, res.output
        assert "Traceback" not in res.output


def test_the_backend_table_says_whether_each_speed_goal_is_met(capsys: pytest.CaptureFixture[str]) -> None:
    from gradlab.benchmarks.learner import CASES, BackendRow, Measurement, render_backend

    def runs(seconds: float) -> list[Measurement]:
        return [Measurement("x", 65536, seconds, seconds, 1.0, 2.0, seconds - 3.0, "") for _ in range(3)]

    label = CASES["cartpole"].label.replace("sb3.ppo ", "")
    render_backend([BackendRow(label, 65536, 3, {"sb3.ppo": runs(10.0), "gradlab.ppo": runs(3.9)}, (0.5, 0.6))], False)
    assert ">= 2.5x: met" in capsys.readouterr().out  # 10.0 / 3.9 = 2.56
    render_backend([BackendRow(label, 65536, 3, {"sb3.ppo": runs(10.0), "gradlab.ppo": runs(4.1)}, (0.5, 0.6))], False)
    assert ">= 2.5x: not met" in capsys.readouterr().out  # 2.44
