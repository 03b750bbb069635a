"""The task program, step by step, against hand-computed expectations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradlab.contracts.task import TaskProgram
from gradlab.envs.task import TaskRunner, signal_array


def _program(**kw) -> TaskProgram:
    return TaskProgram.model_validate(kw)


def _run(program: TaskProgram, values: list, *, baseline=None, nterm=None, ntrunc=None, raw=None):
    """One lane; feed signal 's' the given values; return the per-step TaskSteps."""
    runner = TaskRunner(program, 1)
    base = None if baseline is None else {"s": signal_array([baseline], 1)}
    runner.reset_lanes([0], [7], base)
    out = []
    for t, v in enumerate(values):
        step = runner.step(
            np.array([0.0 if raw is None else raw[t]]),
            np.array([bool(nterm and nterm[t])]),
            np.array([bool(ntrunc and ntrunc[t])]),
            {"s": signal_array([v], 1)},
        )
        out.append(step)
    return out


def _fired(steps, name="e"):
    return [bool(s.fired[name][0]) for s in steps]


def _event_program(**event) -> TaskProgram:
    return _program(signals={"s": {"source": "info", "key": "s"}}, events={"e": {"signal": "s", **event}})


def test_equals_fires_on_each_equal_step():
    steps = _run(_event_program(op="equals", value=1), [0, 1, 2, 1])
    assert _fired(steps) == [False, True, False, True]


def test_equals_matches_bools_and_strings_and_never_missing_values():
    assert _fired(_run(_event_program(op="equals", value=True), [False, True, None, 1])) == [False, True, False, True]
    assert _fired(_run(_event_program(op="equals", value="win"), ["lose", "win", None])) == [False, True, False]


def test_equals_for_counts_consecutive_steps_of_this_episode():
    # value 1 for 2 consecutive steps: counts 1,2,3,0,1,2 -> fires at counts >= 2
    steps = _run(_event_program(op="equals_for", value=1, steps=2), [1, 1, 1, 0, 1, 1], baseline=1)
    assert _fired(steps) == [False, True, True, False, False, True]


def test_increase_and_decrease_compare_with_previous_step_and_reset_baseline():
    values = [3, 4, 4, 2, 5]
    assert _fired(_run(_event_program(op="increase"), values, baseline=3)) == [False, True, False, False, True]
    assert _fired(_run(_event_program(op="decrease"), values, baseline=3)) == [False, False, False, True, False]
    # Baseline 5 at reset: the first step (3) is already a decrease.
    assert _fired(_run(_event_program(op="decrease"), [3], baseline=5)) == [True]
    # No baseline (value unknown at reset): the first step cannot be a change.
    assert _fired(_run(_event_program(op="increase"), [9, 10])) == [False, True]
    # A missing value (NaN) never increases.
    assert _fired(_run(_event_program(op="increase"), [1, None, 2])) == [False, False, False]


def test_unchanged_for_counts_steps_equal_to_the_previous_one():
    # baseline 3; same-as-previous: T,T,F,T,T -> counts 1,2,0,1,2 -> fires at >= 2
    steps = _run(_event_program(op="unchanged_for", steps=2), [3, 3, 4, 4, 4], baseline=3)
    assert _fired(steps) == [False, True, False, False, True]


def _two_event_program(precedence=None, timeout_event=False):
    term = {"success": ["win"], "failure": ["lose"]}
    if timeout_event:
        term = {"success": ["win"], "timeout": ["late"]}
    if precedence:
        term["outcome_precedence"] = precedence
    events = {"win": {"signal": "a", "op": "equals", "value": 1}, "lose": {"signal": "b", "op": "equals", "value": 1},
              "late": {"signal": "b", "op": "equals", "value": 1}}
    return _program(signals={"a": {"source": "info", "key": "a"}, "b": {"source": "info", "key": "b"}},
                    events=events, termination=term)


def _one_step(program, a, b, nterm=False, ntrunc=False, raw=0.0):
    runner = TaskRunner(program, 1)
    runner.reset_lanes([0], [None])
    return runner.step(np.array([raw]), np.array([nterm]), np.array([ntrunc]),
                       {"a": signal_array([a], 1), "b": signal_array([b], 1)})


def test_outcome_precedence_when_success_and_failure_fire_together():
    step = _one_step(_two_event_program(), 1, 1)
    ep = step.episodes[0]
    assert (ep.outcome, ep.reason) == ("failure", "lose")  # default precedence: failure, success, timeout
    assert step.terminated.tolist() == [True] and step.truncated.tolist() == [False]
    step = _one_step(_two_event_program(["success", "failure", "timeout"]), 1, 1)
    assert (step.episodes[0].outcome, step.episodes[0].reason) == ("success", "win")


def test_terminal_and_truncated_in_one_step_is_terminal():
    step = _one_step(_two_event_program(timeout_event=True), 1, 1)
    assert step.terminated.tolist() == [True] and step.truncated.tolist() == [False]
    assert step.episodes[0].outcome == "success"
    # The precedence picks the outcome; the flags stay terminal.
    step = _one_step(_two_event_program(["timeout", "success", "failure"], timeout_event=True), 1, 1)
    assert step.terminated.tolist() == [True] and step.truncated.tolist() == [False]
    assert (step.episodes[0].outcome, step.episodes[0].reason) == ("timeout", "late")
    # Provider flags both set: terminal.
    step = _one_step(_program(), 0, 0, nterm=True, ntrunc=True)
    assert step.terminated.tolist() == [True] and step.truncated.tolist() == [False]
    assert (step.episodes[0].outcome, step.episodes[0].reason) == ("ended", "native_terminated")


def test_timeout_event_truncates():
    step = _one_step(_two_event_program(timeout_event=True), 0, 1)
    assert step.terminated.tolist() == [False] and step.truncated.tolist() == [True]
    assert (step.episodes[0].outcome, step.episodes[0].reason) == ("timeout", "late")


def test_native_flags_map_to_outcomes():
    prog = _program(termination={"native_terminated": "failure"})
    step = _one_step(prog, 0, 0, nterm=True)
    assert (step.episodes[0].outcome, step.episodes[0].reason) == ("failure", "native_terminated")
    step = _one_step(prog, 0, 0, ntrunc=True)
    assert step.truncated.tolist() == [True] and step.terminated.tolist() == [False]
    assert (step.episodes[0].outcome, step.episodes[0].reason) == ("timeout", "native_time_limit")
    # An event outcome outranks the provider's "ended".
    step = _one_step(_two_event_program(), 1, 0, nterm=True)
    assert (step.episodes[0].outcome, step.episodes[0].reason) == ("success", "win")


def test_max_episode_steps_truncates_with_length_and_returns():
    prog = _program(termination={"max_episode_steps": 3})
    runner = TaskRunner(prog, 2)
    runner.reset_lanes([0, 1], [11, 12])
    f = np.zeros(2, dtype=bool)
    for _ in range(2):
        s = runner.step(np.array([1.0, 2.0]), f, f, {})
        assert not s.episodes
    s = runner.step(np.array([1.0, 2.0]), f, f, {})
    assert s.truncated.tolist() == [True, True] and s.terminated.tolist() == [False, False]
    eps = [e.as_json() for e in s.episodes]
    assert eps == [
        {"lane": 0, "seed": 11, "return": 3.0, "raw_return": 3.0, "length": 3, "outcome": "timeout",
         "reason": "max_episode_steps", "progress": {}},
        {"lane": 1, "seed": 12, "return": 6.0, "raw_return": 6.0, "length": 3, "outcome": "timeout",
         "reason": "max_episode_steps", "progress": {}},
    ]


@pytest.mark.parametrize(("clip", "expected"), [(True, 1.0), ([-2, 3], 3.0), (False, 3.5), ([-2, 4], 3.5)])
def test_reward_is_scaled_then_clipped(clip, expected):
    prog = _program(reward={"reward_scale": 2.0, "reward_clip": clip})
    step = _one_step(prog, 0, 0, raw=7.0)
    assert step.reward.dtype == np.float32
    assert step.reward.tolist() == [expected]


def test_negative_reward_clip():
    step = _one_step(_program(reward={"reward_scale": 0.5, "reward_clip": True}), 0, 0, raw=-3.0)
    assert step.reward.tolist() == [-1.0]


def test_event_rewards_sum_then_scale_then_clip():
    signals = {"a": {"source": "info", "key": "a"}, "b": {"source": "info", "key": "b"}}
    events = {"win": {"signal": "a", "op": "equals", "value": 1}, "bonus": {"signal": "b", "op": "equals", "value": 1}}
    prog = _program(signals=signals, events=events,
                    reward={"source": "events", "events": {"win": 10.0, "bonus": 0.5}, "reward_scale": 10.0})
    assert _one_step(prog, 1, 1, raw=100.0).reward.tolist() == [pytest.approx(1.05)]
    prog = _program(signals=signals, events=events,
                    reward={"source": "native_plus_events", "events": {"win": 10.0}, "reward_clip": [-5, 12]})
    assert _one_step(prog, 1, 0, raw=3.0).reward.tolist() == [12.0]  # 3 + 10 = 13, clipped to 12
    assert _one_step(prog, 0, 0, raw=3.0).reward.tolist() == [3.0]


def test_shaped_and_raw_returns_and_progress_are_recorded():
    prog = _program(signals={"lives": {"source": "info", "key": "lives"}},
                    events={"lost": {"signal": "lives", "op": "decrease"}},
                    termination={"failure": ["lost"]}, reward={"reward_scale": 2.0},
                    progress=["lives"])
    runner = TaskRunner(prog, 1)
    runner.reset_lanes([0], [5], {"lives": signal_array([3], 1)})
    f = np.zeros(1, dtype=bool)
    s1 = runner.step(np.array([4.0]), f, f, {"lives": signal_array([3], 1)})
    s2 = runner.step(np.array([2.0]), f, f, {"lives": signal_array([2], 1)})
    assert not s1.episodes
    ep = s2.episodes[0]
    assert (ep.outcome, ep.reason, ep.length) == ("failure", "lost", 2)
    assert ep.return_ == 3.0 and ep.raw_return == 6.0
    assert ep.progress == {"lives": 2.0}


def test_reset_clears_counters_and_returns():
    prog = _event_program(op="equals_for", value=1, steps=2)
    runner = TaskRunner(prog, 1)
    runner.reset_lanes([0], [None])
    f = np.zeros(1, dtype=bool)
    runner.step(np.array([1.0]), f, f, {"s": signal_array([1], 1)})
    runner.reset_lanes([0], [None])
    s = runner.step(np.array([1.0]), f, f, {"s": signal_array([1], 1)})
    assert s.fired["e"].tolist() == [False]
    assert runner.returns.tolist() == [1.0] and runner.steps.tolist() == [1]


def test_signal_array_types():
    assert signal_array([True, None, 2], 3).tolist()[0] == 1.0
    assert math.isnan(signal_array([True, None, 2], 3)[1])
    assert signal_array(["a", None], 2).dtype == object
