"""`gradlab train` end to end: the real flow, a real Prefect server, real stores, real learner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradlab.outbox import Outbox
from tests.runs.conftest import gradlab_env, last_json_line, only_run_dir, run_gradlab
from tests.s3server import free_port, s3_server  # noqa: F401  (fixture)

RECEIPT_KEYS = {"run_id", "attempt_id", "goal_id", "recipe_id", "seed", "outcome", "reason", "final_step", "checkpoints",
                "evaluations", "promotion", "metrics", "drained", "learner", "sealed_at",
                "epoch", "superseded_by"}  # the attempt's lease epoch; who superseded it (None here)


def _check_succeeded_bandit(receipt: dict, home: Path, env: dict) -> None:
    assert set(receipt) == RECEIPT_KEYS and receipt["superseded_by"] is None and receipt["epoch"] >= 1
    assert receipt["outcome"] == "succeeded", receipt["reason"]
    assert receipt["drained"] is True
    assert receipt["learner"]["exit_code"] == 0
    steps = [c["step"] for c in receipt["checkpoints"]]
    assert steps == sorted(steps) and steps, steps
    assert [e["checkpoint_step"] for e in receipt["evaluations"]] == steps  # every checkpoint has an entry
    accepted = [e["checkpoint_step"] for e in receipt["evaluations"] if e["status"] == "accepted"]
    assert accepted, receipt["evaluations"]
    assert receipt["promotion"]["checkpoint_step"] == min(accepted)  # the lowest accepted step
    promoted = next(c for c in receipt["checkpoints"] if c["step"] == min(accepted))
    assert receipt["promotion"]["sha256"] == promoted["sha256"]
    # Metrics: every outbox event up to the end went to the journal.
    run_dir = only_run_dir(home)
    outbox = Outbox(run_dir / "outbox.sqlite", readonly=True)
    assert receipt["metrics"]["local_high_water"] == outbox.high_water("journal") > 0
    journal = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    metric_events = [e.event_seq for e in outbox.read(0, 100000) if e.kind in ("metrics", "supervisor_metrics")]
    assert [j["event_seq"] for j in journal] == metric_events
    # The receipt printed is the one sealed in the store, and `runs show` includes it.
    shown = run_gradlab(["runs", "show", receipt["run_id"], "--json"], env)
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert view["receipt"] == receipt
    assert view["promotion"]["checkpoint_step"] == receipt["promotion"]["checkpoint_step"]


@pytest.mark.slow
def test_bandit_trains_and_is_promoted_with_file_stores(prefect_api: str, gradlab_home: Path) -> None:
    env = gradlab_env(prefect_api)
    out = run_gradlab(["train", "gradlab__bandit/ppo", "--json"], env)
    assert out.returncode == 0, out.stderr[-3000:]
    receipt = last_json_line(out.stdout)
    _check_succeeded_bandit(receipt, gradlab_home, env)
    assert receipt["checkpoints"][0]["uri"].startswith((gradlab_home / "stores" / "model").as_uri())
    # The summary says where the receipt is kept.
    kept = gradlab_home / "stores" / "control" / "runs" / receipt["run_id"] / "attempts" / receipt["attempt_id"] / "terminal.json"
    assert json.loads(kept.read_text()) == receipt
    assert kept.as_uri() in "".join(out.stderr.split()), out.stderr[-2000:]  # (rich may wrap it)
    # Every published file is in the model store with the manifest's hashes.
    first = receipt["checkpoints"][0]
    folder = Path(first["uri"].removeprefix("file://"))
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["sha256"] == first["sha256"]
    # A succeeded run is not retried, and there is nothing to reconcile.
    retry = run_gradlab(["runs", "retry", receipt["run_id"]], env)
    assert retry.returncode == 1
    assert f"run {receipt['run_id']} already succeeded ({receipt['attempt_id']}): nothing to retry" in retry.stderr
    reconcile = run_gradlab(["runs", "reconcile", receipt["run_id"], "--json"], env)
    assert reconcile.returncode == 0 and json.loads(reconcile.stdout) == []


@pytest.mark.slow
def test_bandit_trains_and_is_promoted_with_s3_stores_while_wandb_is_down(prefect_api: str, gradlab_home: Path,
                                                                          s3_server) -> None:  # noqa: F811
    """S3 stores, and ``--wandb online`` against an address that does not answer: the run still
    succeeds, complete locally, and its receipt says W&B is pending."""
    env = gradlab_env(prefect_api, GRADLAB_CONTROL_STORE_URL=s3_server.url("control"),
                      GRADLAB_EVAL_STORE_URL=s3_server.url("eval"), GRADLAB_MODEL_STORE_URL=s3_server.url("model"),
                      WANDB_MODE="online", WANDB_API_KEY="0" * 40, WANDB_BASE_URL=f"http://127.0.0.1:{free_port()}",
                      WANDB_INIT_TIMEOUT="5")
    out = run_gradlab(["train", "gradlab__bandit/ppo", "--wandb", "online", "--json"], env)
    assert out.returncode == 0, out.stderr[-3000:]
    receipt = last_json_line(out.stdout)
    _check_succeeded_bandit(receipt, gradlab_home, env)
    assert receipt["metrics"]["pending"] == ["wandb"] and receipt["metrics"]["sinks"]["wandb"] == 0
    assert receipt["metrics"]["sinks"]["journal"] == receipt["metrics"]["local_high_water"] > 0
    assert receipt["promotion"]["uri"].startswith("s3://")
    assert not (gradlab_home / "stores").exists()  # nothing went to the default file stores
