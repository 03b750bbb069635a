"""The README's main command: CartPole-v1/ppo trains, stops early, promotes an accepted checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradlab import receipts as rules
from gradlab.contracts import Experiments
from gradlab.stores import open_stores
from tests.runs.conftest import gradlab_env, last_json_line, run_gradlab


@pytest.mark.slow
def test_cartpole_stops_early_promotes_and_eval_reproduces_the_promoted_result(prefect_api: str,
                                                                               gradlab_home: Path) -> None:
    env = gradlab_env(prefect_api)
    out = run_gradlab(["train", "CartPole-v1/ppo", "--json"], env, timeout_s=600)
    assert out.returncode == 0, out.stderr[-3000:]
    receipt = last_json_line(out.stdout)
    assert receipt["outcome"] == "succeeded", receipt["reason"]
    promotion = receipt["promotion"]
    promoted = next(e for e in receipt["evaluations"] if e["checkpoint_step"] == promotion["checkpoint_step"])
    assert promoted["status"] == "accepted"
    assert promoted["return_mean"] >= 475
    # Lower steps were evaluated and rejected; the accepted one asked the learner to stop.
    lower = [e for e in receipt["evaluations"] if e["checkpoint_step"] < promotion["checkpoint_step"]]
    assert all(e["status"] == "rejected" for e in lower)
    stores = open_stores()
    stop = rules.read_stop_request(stores, receipt["run_id"])
    assert stop is not None and stop.reason == f"accepted:{promotion['checkpoint_step']}"
    # The early stop took effect: the learner stopped on the request, before its budget.
    budget = Experiments().resolve("CartPole-v1/ppo").recipe.train.timesteps
    assert receipt["learner"]["stop_reason"] == "stop_requested", receipt["learner"]
    assert promotion["checkpoint_step"] <= receipt["final_step"] < budget
    # The stored result is over the goal's 100 episodes and its mean is the mean of its rows.
    record = next(rec for _, rec in rules.list_evaluations(stores, receipt["run_id"])
                  if rec and rec.checkpoint_step == promotion["checkpoint_step"])
    result = record.result
    assert result["planned"] == result["completed"] == 100
    returns = [row["return"] for row in result["episodes"]]
    assert result["aggregates"]["eval/episode/return/mean"] == pytest.approx(sum(returns) / 100)
    # A survival goal (`timeout_is: success`): balancing to the 500-step limit is a success, a fall a failure.
    rows = result["episodes"]
    assert all((r["outcome"], r["reason"]) == ("success", "native_time_limit") for r in rows if r["length"] == 500)
    assert all((r["outcome"], r["reason"]) == ("failure", "native_terminated") for r in rows if r["length"] < 500)
    rate = result["aggregates"]["eval/outcome/success/rate"]
    assert rate == sum(r["length"] == 500 for r in rows) / 100
    if result["aggregates"]["eval/episode/return/mean"] == 500:
        assert rate == 1.0
    # `gradlab eval RUN_ID` evaluates the promoted checkpoint again and gets the same result exactly.
    again = run_gradlab(["eval", receipt["run_id"], "--json"], env, timeout_s=300)
    assert again.returncode == 0, again.stderr[-3000:]
    replay = json.loads(again.stdout)
    assert replay["checkpoint_sha256"] == promotion["sha256"]
    assert replay["episodes"] == result["episodes"]
    assert replay["aggregates"] == result["aggregates"]
    assert replay["verdict"] == "accepted"
