"""Early-stop conditions over training metrics: hand-traced sequences."""

from __future__ import annotations

import pytest

from gradlab.contracts.goal import EarlyStopCondition
from gradlab.errors import ContractViolation
from gradlab.learn.early_stop import EarlyStopMonitor
from gradlab.metrics.registry import check_names

M = "train/episode/return/shaped/mean"


def _p(name, out):
    return (out[f"train/early_stop/{name}/value"], out[f"train/early_stop/{name}/best"],
            out[f"train/early_stop/{name}/patience/progress"], out[f"train/early_stop/{name}/would_trigger"])


def test_threshold_warmup_patience_and_stop():
    cond = EarlyStopCondition(name="solved", metric=M, kind="threshold", operator=">=", threshold=100.0,
                              warmup_steps=1000, patience_steps=2000, action="stop")
    mon = EarlyStopMonitor([cond])
    trace = []
    for step, value in [(500, 150.0), (1000, 90.0), (1500, 120.0), (2500, 130.0), (3500, 110.0)]:
        d = mon.update(step, {M: value})
        trace.append((_p("solved", d.metrics), d.stop))
    assert trace == [
        ((150.0, 150.0, 0.0, 0.0), False),   # warmup: never triggers
        ((90.0, 150.0, 0.0, 0.0), False),    # below threshold
        ((120.0, 150.0, 0.0, 0.0), False),   # streak starts at 1500
        ((130.0, 150.0, 0.5, 0.0), False),   # held 1000 of 2000
        ((110.0, 150.0, 1.0, 1.0), True),    # held 2000: stop
    ]
    assert d.stop_reason == "early_stop:solved"
    check_names(d.metrics)


def test_threshold_streak_resets_and_zero_patience():
    cond = EarlyStopCondition(name="low_loss", metric="x", kind="threshold", operator="<", threshold=1.0,
                              patience_steps=100)
    mon = EarlyStopMonitor([cond])
    assert _p("low_loss", mon.update(0, {"x": 0.5}).metrics)[2:] == (0.0, 0.0)
    assert _p("low_loss", mon.update(50, {"x": 2.0}).metrics) == (2.0, 0.5, 0.0, 0.0)  # best = min
    assert _p("low_loss", mon.update(100, {"x": 0.9}).metrics)[2:] == (0.0, 0.0)  # new streak
    assert _p("low_loss", mon.update(200, {"x": 0.9}).metrics)[2:] == (1.0, 1.0)
    now = EarlyStopMonitor([cond.model_copy(update={"patience_steps": 0})])
    d = now.update(10, {"x": 0.1})
    assert d.stop and _p("low_loss", d.metrics)[2:] == (1.0, 1.0)


def test_plateau_observe_never_stops():
    cond = EarlyStopCondition(name="stall", metric=M, kind="plateau", direction="maximize", min_delta=1.0,
                              patience_steps=1000, action="observe")
    mon = EarlyStopMonitor([cond])
    seq = [(0, 10.0), (500, 10.5), (1000, 12.0), (1500, 12.9), (2000, 11.0)]
    got = []
    for step, value in seq:
        d = mon.update(step, {M: value})
        got.append(_p("stall", d.metrics))
        assert not d.stop
    assert got == [(10.0, 10.0, 0.0, 0.0), (10.5, 10.0, 0.5, 0.0), (12.0, 12.0, 0.0, 0.0),
                   (12.9, 12.0, 0.5, 0.0), (11.0, 12.0, 1.0, 1.0)]


def test_plateau_counts_from_warmup_and_minimize():
    cond = EarlyStopCondition(name="p", metric="loss", kind="plateau", direction="minimize",
                              warmup_steps=1000, patience_steps=1000)
    mon = EarlyStopMonitor([cond])
    assert _p("p", mon.update(0, {"loss": 5.0}).metrics) == (5.0, 5.0, 0.0, 0.0)
    assert _p("p", mon.update(500, {"loss": 6.0}).metrics) == (6.0, 5.0, 0.0, 0.0)   # warmup
    assert _p("p", mon.update(1000, {"loss": 6.0}).metrics) == (6.0, 5.0, 0.0, 0.0)  # stall counted from 1000
    assert _p("p", mon.update(1500, {"loss": 4.0}).metrics) == (4.0, 4.0, 0.0, 0.0)  # improved
    d = mon.update(2500, {"loss": 4.0})
    assert _p("p", d.metrics) == (4.0, 4.0, 1.0, 1.0) and d.stop and d.stop_reason == "early_stop:p"


def test_missing_metric_emits_nothing_and_state_round_trips():
    a = EarlyStopCondition(name="a", metric="m1", kind="threshold", operator=">", threshold=0.0, patience_steps=10)
    b = EarlyStopCondition(name="b", metric="m2", kind="plateau", direction="maximize", patience_steps=10)
    mon = EarlyStopMonitor([a, b])
    d = mon.update(0, {"m1": 1.0})
    assert set(d.metrics) == {f"train/early_stop/a/{k}" for k in ("value", "best", "patience/progress",
                                                                  "would_trigger")}
    mon.update(5, {"m1": 1.0, "m2": 3.0})
    resumed = EarlyStopMonitor([a, b])
    resumed.load_state_dict(mon.state_dict())
    d = resumed.update(10, {"m1": 2.0, "m2": 3.0})
    assert d.stop and d.condition == "a"  # the streak from step 0 survived the resume
    assert _p("b", d.metrics) == (3.0, 3.0, 0.5, 0.0)


def test_duplicate_names_refused():
    c = EarlyStopCondition(name="a", metric="m", kind="plateau", direction="maximize")
    with pytest.raises(ContractViolation, match="duplicate"):
        EarlyStopMonitor([c, c])
