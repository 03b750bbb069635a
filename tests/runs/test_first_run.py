"""The README's first command from a fresh GRADLAB_HOME with no server up: the background server
starts, the user sees what is starting and for how long, and the learner is supervised from its
first step, as on the warm run of the same seed that follows."""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

import pytest

from tests.cli.test_cheap_commands import imported_by, synthesized_home
from tests.runs.conftest import last_json_line, run_gradlab


def _learner_events(run_dir: Path) -> tuple[list[tuple], str | None]:
    with sqlite3.connect(run_dir / "outbox.sqlite") as db:
        events = db.execute("SELECT kind, attempt, epoch, created_at FROM events WHERE kind != 'supervisor_metrics' "
                            "ORDER BY event_seq").fetchall()
        row = db.execute("SELECT updated_at FROM control WHERE key = 'supervised'").fetchone()
    return events, row[0] if row else None


@pytest.mark.slow
def test_cold_and_warm_first_runs_are_supervised_from_the_first_step(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "GRADLAB_"))}
    env.update(GRADLAB_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", WANDB_MODE="offline",
               WANDB_SILENT="true")
    args = ["train", "gradlab__bandit/ppo", "--seed", "3", "--json"]
    try:
        cold = run_gradlab(args, env, timeout_s=900)
        warm = run_gradlab(args, env, timeout_s=600)
    finally:
        run_gradlab(["server", "stop"], env, timeout_s=120)
    assert cold.returncode == 0, cold.stderr[-3000:]
    assert warm.returncode == 0, warm.stderr[-3000:]
    # While the server started, the user saw what was starting and for how long: the warm flow and
    # learner importing beside it, then the server when the warm flow was ready before it.
    assert "starting: the warm flow and the warm learner" in cold.stderr, cold.stderr[-3000:]
    assert re.search(r"the warm flow was ready after [\d.]+ s", cold.stderr), cold.stderr[-3000:]
    receipts = [last_json_line(cold.stdout), last_json_line(warm.stdout)]
    for receipt in receipts:
        assert receipt["outcome"] == "succeeded", receipt["reason"]
        events, supervised_at = _learner_events(home / "runs" / receipt["run_id"])
        # Every learner event, its start first, carries the opened attempt's fence, and was
        # written after the driver's loop was watching: no step of this run went unsupervised.
        assert events[0][0] == "learner_started"
        assert {(attempt, epoch) for _, attempt, epoch, _ in events} == {(receipt["attempt_id"], 1)}
        assert supervised_at is not None and events[0][3] >= supervised_at
    # The same seed trains the same checkpoints cold and warm, and promotes the same bytes.
    assert receipts[0]["promotion"]["sha256"] == receipts[1]["promotion"]["sha256"]
    # ... and stops at the same step (the stop on acceptance takes effect at a checkpoint boundary).
    assert receipts[0]["final_step"] == receipts[1]["final_step"] < 16384


@pytest.mark.slow
def test_experiment_status_imports_prefect_but_not_torch(tmp_path_factory: pytest.TempPathFactory,
                                                         prefect_api: str) -> None:
    home, ids = synthesized_home(tmp_path_factory)
    code, modules, stderr = imported_by(["experiment", "status", "--run", ids[0]], home, PREFECT_API_URL=prefect_api)
    assert "prefect" in modules, stderr[-2000:]  # it asked the server
    assert not modules & {"torch", "stable_baselines3", "wandb"}, stderr[-2000:]


@pytest.mark.slow
def test_launch_to_a_missing_deployment_names_the_server_it_asked(prefect_api: str, gradlab_home: Path) -> None:
    from tests.runs.conftest import gradlab_env

    out = run_gradlab(["experiment", "launch", "gradlab__bandit/ppo", "--deployment", "training-run/nowhere"],
                      gradlab_env(prefect_api), timeout_s=300)
    assert out.returncode == 1, out.stderr[-2000:]
    server = prefect_api.rstrip("/")
    assert f"no deployment 'training-run/nowhere' on the Prefect server at {server}" in out.stderr, out.stderr[-2000:]
    assert "prefect deploy --all" in out.stderr
