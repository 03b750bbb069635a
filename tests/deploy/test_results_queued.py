"""Results on queued runs: `gradlab sweep --deployment` fans a cohort out through `run_deployment` to real
process workers, and the scheduled `reports-sync` deployment is registered and run once by a worker.

Reuses the queued-runs module's fixture (a real Prefect server, the pools, `prefect deploy --all`,
a worker); one test, so the server is started once.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from gradlab import receipts as rules
from tests.deploy.test_queued_runs import UUID_RE, Queue, _final_flow_run, queue, stores_of  # noqa: F401  (fixtures)
from tests.runs.conftest import last_json_line, wait_for

pytestmark = pytest.mark.slow


def test_sweep_on_a_deployment_and_the_scheduled_reports_sync(queue: Queue, stores_of, tmp_path: Path) -> None:  # noqa: F811
    queue.start_worker("results-worker-2")
    wait_for(lambda: queue.online_workers() >= 2, 60, "results-worker-2 online")
    out = queue.gradlab("sweep", "gradlab__bandit/ppo", "--seeds", "3", "--set", "train.timesteps=4096",
                        "--deployment", "training-run/local", "--json", timeout_s=500)
    assert out.returncode == 0, out.stderr[-3000:]
    cohort = last_json_line(out.stdout)["cohort"]
    assert cohort["deployment"] == "training-run/local" and [r["seed"] for r in cohort["runs"]] == [0, 1, 2]
    with queue.client() as client:
        deployment = client.read_deployment_by_name("training-run/local")
        for run in cohort["runs"]:
            flow_run = client.read_flow_run(uuid.UUID(run["flow_run_id"]))
            # Queued on the pool, started by a worker, and a child of the sweep.
            assert flow_run.deployment_id == deployment.id and flow_run.parent_task_run_id is not None
            assert flow_run.parameters["cohort_id"] == cohort["cohort_id"]
            assert rules.read_terminal(stores_of, run["run_id"], "attempt-001").outcome == run["outcome"] == "succeeded"
    leaders = queue.gradlab("leaders", "runs", "--goal", "gradlab__bandit", "--min-seeds", "3", "--json")
    assert leaders.returncode == 0, leaders.stderr
    (leader,) = json.loads(leaders.stdout)
    assert leader["recipe_id"] == "ppo" and leader["overrides"] == ["train.timesteps=4096"] and leader["n_scored"] == 3

    with queue.client() as client:
        reports = client.read_deployment_by_name("reports-sync/reports-sync")
    assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in reports.schedules] == [("0 3 * * *", "UTC", True)]
    store = tmp_path / "reports-store"
    queued = queue.prefect("deployment", "run", "reports-sync/reports-sync", "-p", f"store_url={store.as_uri()}")
    assert queued.returncode == 0, queued.stdout + queued.stderr
    flow_run = _final_flow_run(queue, UUID_RE.search(queued.stdout).group(0), 240)
    assert flow_run.state.type.value == "COMPLETED", flow_run.state.message
    index = json.loads((store / "reports" / "index.json").read_text())
    page = (store / "reports" / "builds" / index["latest"] / "smoke" / "gradlab__bandit.html").read_text()
    assert all(run["run_id"] in page for run in cohort["runs"]) and "<table id='leaders'>" in page
