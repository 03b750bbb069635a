"""Named reward shapes: terms, per-term clipping, components that sum to the task reward, their
metrics, the player's per-term telemetry, and ``reward_scale`` as a positive divisor."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gradlab.contracts.task import TaskProgram
from gradlab.envs.task import TaskRunner, signal_array
from gradlab.metrics.registry import is_registered

TERMS = {
    "progress": {"kind": "progress", "signal": "x", "weight": 0.5},
    "time": {"kind": "time", "weight": -0.1},
    "death": {"kind": "event", "event": "died", "weight": -10.0, "clip": [-3.0, 0.0]},
    "flag": {"kind": "event", "event": "won", "weight": 5.0},
    "native": {"kind": "native", "weight": 2.0},
}


def _program(**reward) -> TaskProgram:
    return TaskProgram.model_validate({
        "signals": {"x": {"source": "info", "key": "x"}, "lives": {"source": "info", "key": "lives"},
                    "flag": {"source": "info", "key": "flag"}},
        "events": {"died": {"signal": "lives", "op": "decrease"}, "won": {"signal": "flag", "op": "equals", "value": 1}},
        "reward": {"source": "terms", "terms": TERMS, **reward},
    })


def _steps(runner: TaskRunner, xs, lives, flags, raws):
    f = np.zeros(2, dtype=bool)
    out = []
    for x, life, flag, raw in zip(xs, lives, flags, raws, strict=True):
        sig = {"x": signal_array(x, 2), "lives": signal_array(life, 2), "flag": signal_array(flag, 2)}
        out.append(runner.step(np.asarray(raw, dtype=np.float64), f, f, sig))
    return out


def test_terms_are_clipped_one_by_one_and_their_components_sum_to_the_task_reward() -> None:
    runner = TaskRunner(_program(), 2)
    runner.reset_lanes([0, 1], [0, 1], {"x": signal_array([10, 0], 2), "lives": signal_array([3, 3], 2),
                                        "flag": signal_array([0, 0], 2)})
    # Lane 0 goes 10 -> 14 -> 12 -> 20 (new progress 4, 0, 6); lane 1 dies on step 2 and wins on step 3.
    steps = _steps(runner, xs=[[14, 0], [12, 0], [20, 0]], lives=[[3, 3], [3, 2], [3, 2]],
                   flags=[[0, 0], [0, 0], [0, 1]], raws=[[1.0, 0.0], [0.0, 0.0], [0.0, 0.5]])
    comps = [{k: v.tolist() for k, v in s.components.items()} for s in steps]
    assert comps[0] == {"progress": [2.0, 0.0], "time": [-0.1, -0.1], "death": [0.0, 0.0], "flag": [0.0, 0.0],
                        "native": [2.0, 0.0]}
    assert comps[1]["progress"] == [0.0, 0.0] and comps[1]["death"] == [0.0, -3.0]  # -10 clipped to -3
    assert comps[2]["progress"] == [3.0, 0.0] and comps[2]["flag"] == [0.0, 5.0] and comps[2]["native"] == [0.0, 1.0]
    for s in steps:  # no scale, no clip: the components sum to the shaped reward
        np.testing.assert_allclose(np.sum(list(s.components.values()), axis=0), s.reward, rtol=1e-6)
    metrics = runner.take_component_metrics()
    assert all(is_registered(name) for name in metrics)
    assert metrics["train/reward/component/progress/mean"] == pytest.approx(5.0 / 6)
    assert metrics["train/reward/component/death/nonzero_rate"] == pytest.approx(1 / 6)
    assert metrics["train/reward/component/time/nonzero_rate"] == 1.0
    assert sum(metrics[f"train/reward/component/{n}/share"] for n in TERMS) == pytest.approx(1.0)
    assert runner.take_component_metrics() == {}  # reset by the call


def test_lane_groups_pool_their_component_totals() -> None:
    from gradlab.envs.task import component_metrics

    def run(n: int, xs: list) -> TaskRunner:
        runner = TaskRunner(_program(), n)
        runner.reset_lanes(list(range(n)), [None] * n, {"x": signal_array([0] * n, n),
                                                        "lives": signal_array([3] * n, n), "flag": signal_array([0] * n, n)})
        f = np.zeros(n, dtype=bool)
        runner.step(np.zeros(n), f, f, {"x": signal_array(xs, n), "lives": signal_array([3] * n, n),
                                        "flag": signal_array([0] * n, n)})
        return runner

    whole = run(4, [2, 0, 4, 0]).take_component_metrics()
    pooled = component_metrics([run(2, [2, 0]), run(2, [4, 0])])
    assert pooled == pytest.approx(whole)


def test_reward_scale_divides_the_task_reward_then_reward_clip_clips_it() -> None:
    runner = TaskRunner(_program(reward_scale=4.0, reward_clip=[-0.5, 0.6]), 2)
    runner.reset_lanes([0, 1], [0, 1], {"x": signal_array([0, 0], 2), "lives": signal_array([3, 3], 2),
                                        "flag": signal_array([0, 0], 2)})
    (step,) = _steps(runner, xs=[[4, 0]], lives=[[3, 2]], flags=[[0, 0]], raws=[[1.0, 0.0]])
    task_reward = np.sum(list(step.components.values()), axis=0)  # [2 - 0.1 + 2, -0.1 - 3]
    np.testing.assert_allclose(task_reward, [3.9, -3.1])
    np.testing.assert_allclose(step.reward, np.clip(task_reward / 4.0, -0.5, 0.6), rtol=1e-6)


@pytest.mark.parametrize("value", ["-0.0", "-2.5"])
def test_validate_refuses_a_reward_scale_that_is_not_positive(value: str, experiments_copy: Path) -> None:
    from typer.testing import CliRunner

    from gradlab.cli.app import app

    goal = experiments_copy / "goals" / "Bandit" / "Arms4" / "Shaped" / "_goal.yaml"
    goal.write_text(goal.read_text() + f"train: {{environment: {{task: {{reward: {{reward_scale: {value}}}}}}}}}\n")
    out = CliRunner().invoke(app, ["validate"])
    assert out.exit_code != 0
    assert ("experiments/goals/Bandit/Arms4/Shaped/_goal.yaml:5:39: train.environment.task.reward.reward_scale: "
            f"expected greater than 0; found {value}") in out.stderr.replace("\n", "")


@pytest.mark.slow
def test_the_learner_logs_each_component_and_the_player_shows_it(tmp_path: Path) -> None:
    from gradlab.benchmarks.play import write_untrained_run
    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.learn.learner import run_learner
    from gradlab.outbox import Outbox
    from gradlab.play.session import PlaybackSession

    resolved = Experiments().resolve("Bandit/Arms4/Shaped/ppo", ["train.timesteps=1024"])
    spec = RunSpec.from_resolved(resolved, seed=0, run_id="gradlab-20250101T000000-0123abcd")
    run_learner(spec, tmp_path / "run")
    rows = [e.payload["metrics"] for e in Outbox(tmp_path / "run" / "outbox.sqlite").read(kind="metrics", limit=10_000)
            if "train/throughput/loop_fps" in e.payload["metrics"]]
    assert rows and all(m["train/reward/component/time_cost/mean"] == pytest.approx(-0.01) for m in rows)
    for m in rows:  # every lane-step is a hit or a miss
        assert m["train/reward/component/hit_bonus/nonzero_rate"] + m["train/reward/component/miss_penalty/nonzero_rate"] \
            == pytest.approx(1.0)
        assert sum(m[f"train/reward/component/{n}/share"] for n in ("native", "miss_penalty", "time_cost", "hit_bonus")) \
            == pytest.approx(1.0)

    run_dir, ckpt = write_untrained_run(tmp_path / "play", "Bandit/Arms4/Shaped/ppo", "gradlab-20250101T000000-0000beef")
    session = PlaybackSession(ckpt, json.loads((run_dir / "spec.json").read_text()), deterministic=False, seed=3)
    session.reset()
    for _ in range(6):
        report = session.step().telemetry()
        parts = report["reward_components"]
        assert sorted(parts) == ["hit_bonus", "miss_penalty", "native", "time_cost"]
        assert report["reward_shaped"] == pytest.approx(np.clip(sum(parts.values()) / 2.0, -1, 1), abs=1e-6)
