"""The ``dataset-record`` flow through the real Prefect engine: 200 bandit episodes on 2 workers, one
task per chunk, every episode exactly once; a recording killed halfway leaves no dataset and a retry
records it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradlab.datasets.store import list_datasets, read_dataset
from gradlab.errors import NotFound
from gradlab.stores import open_dataset_store
from tests.runs.conftest import prefect_api, prefect_server  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.fixture
def prefect_harness(prefect_api: str):  # noqa: F811 - the session fixture imported above
    """The flows of these tests run in this process against the session's Prefect server."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_api}):
        yield


def test_200_bandit_episodes_on_2_workers_one_task_per_chunk_each_episode_once(prefect_harness):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.dataset_record import dataset_record
    from gradlab.datasets.plan import plan_recording

    plan = plan_recording("bandit-200", goal_id="gradlab__bandit", policy="random", episodes=200, chunk_episodes=50,
                          frames=False)
    state = dataset_record(plan=plan.model_dump(mode="json"), workers=2, return_state=True)
    assert state.is_completed(), state.message
    manifest = read_dataset(open_dataset_store(), "bandit-200")
    assert [e.index for e in manifest.episodes] == list(range(200))
    assert [e.seed for e in manifest.episodes] == [e.seed for e in plan.episodes]
    assert sorted({e.steps_file for e in manifest.episodes}) == sorted(manifest.files) == [
        f"episodes/chunk-{c:05d}.npz" for c in range(4)]  # one step shard per chunk
    assert all(e.length == 1 for e in manifest.episodes)  # the bandit: one step per episode
    assert not Path(plan.staging_dir).exists()

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    chunks = sorted((r for r in runs if r.name.startswith("record-bandit-200-chunk-")), key=lambda r: r.start_time)
    assert sorted(r.name for r in chunks) == [f"record-bandit-200-chunk-{i}" for i in range(4)]
    assert all(r.state.is_completed() for r in chunks)
    assert [r.name for r in runs if r.name.startswith("publish-dataset")] == ["publish-dataset-bandit-200"]
    # Two workers: never more than two chunks in flight, and the first two overlap.
    spans = [(r.start_time, r.end_time) for r in chunks]
    for start, _ in spans:
        assert sum(s <= start < e for s, e in spans) <= 2
    assert spans[1][0] < spans[0][1]


def test_two_recordings_of_one_name_the_later_publisher_fails_cleanly_and_removes_its_staging(prefect_harness):
    """Both planned before either published (two commands started together): the first to publish stores
    the dataset; the second ends Failed naming the taken name, stores nothing and keeps no staging."""
    from flows.dataset_record import dataset_record
    from gradlab.datasets.plan import plan_recording

    first, second = (plan_recording("same-name", goal_id="gradlab__bandit", policy=agent, episodes=6, chunk_episodes=3,
                                    frames=False) for agent in ("noop", "random"))
    assert first.recording_id != second.recording_id
    assert dataset_record(plan=first.model_dump(mode="json"), return_state=True).is_completed()
    state = dataset_record(plan=second.model_dump(mode="json"), return_state=True)
    assert state.is_failed()
    assert state.message.endswith("dataset 'same-name' exists already (datasets are immutable: record under "
                                  "another name)")
    manifest = read_dataset(open_dataset_store(), "same-name")
    assert manifest.recording_id == first.recording_id and manifest.agent.kind == "noop"
    assert not Path(second.staging_dir).exists() and not Path(first.staging_dir).exists()


def test_a_killed_recording_leaves_no_dataset_and_can_be_retried(tmp_path, gradlab_home):
    """SIGKILL the command once its first chunk is staged: no manifest, so no dataset; the retry records it."""
    env = {**os.environ, "GRADLAB_DAEMON": "0"}
    env.pop("PREFECT_API_URL", None)
    args = [sys.executable, "-m", "gradlab.cli.app", "dataset", "record", "killed", "--goal", "gradlab__bandit",
            "--policy", "noop", "--episodes", "40", "--chunk", "10", "--no-frames"]
    proc = subprocess.Popen(args, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    staging = gradlab_home / "datasets" / "staging"
    try:
        deadline = time.monotonic() + 600
        while not list(staging.glob("*/chunk-*/chunk.json")):
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "no chunk staged within 600 s"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    store = open_dataset_store()
    assert list_datasets(store) == []
    with pytest.raises(NotFound, match="dataset 'killed': no "):
        read_dataset(store, "killed")

    from gradlab.datasets.plan import plan_recording
    from gradlab.datasets.record import record_chunk
    from gradlab.datasets.store import publish_dataset

    plan = plan_recording("killed", goal_id="gradlab__bandit", policy="noop", episodes=40, chunk_episodes=10,
                          frames=False)
    publish_dataset(store, plan, [record_chunk(plan, i) for i in range(len(plan.chunks))], created_at="now")
    assert [e.index for e in read_dataset(store, "killed").episodes] == list(range(40))


def test_a_retry_after_a_sigkill_removes_the_killed_recordings_staging_but_not_a_live_ones(tmp_path, gradlab_home):
    """SIGKILL ``dataset record`` once a chunk is staged; the retry (the same command) publishes the dataset and
    leaves no staging behind: not the killed recording's, not its own. A live recording of the same name (its
    lock held by this process) and an ended one of another name keep their folders."""
    from gradlab.datasets.staging import CLAIM_FILE, claim_staging

    env = {**os.environ, "GRADLAB_DAEMON": "0"}
    env.pop("PREFECT_API_URL", None)
    args = [sys.executable, "-m", "gradlab.cli.app", "dataset", "record", "again", "--goal", "gradlab__bandit",
            "--policy", "noop", "--episodes", "40", "--chunk", "10", "--no-frames", "--json"]
    staging = gradlab_home / "datasets" / "staging"
    proc = subprocess.Popen(args, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while not list(staging.glob("*/chunk-*/chunk.json")):
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "no chunk staged within 600 s"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed = [p.parent for p in staging.glob(f"*/{CLAIM_FILE}")]
    assert len(killed) == 1 and list(killed[0].glob("chunk-*/episodes/*.npz"))  # what the kill left
    live = claim_staging(staging / "rec-live", name="again", recording_id="rec-live")  # held until released
    other = claim_staging(staging / "rec-other", name="other", recording_id="rec-other")
    other.release()  # ended, but of another dataset
    try:
        retry = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
        assert retry.returncode == 0, retry.stderr
        assert [e.index for e in read_dataset(open_dataset_store(), "again").episodes] == list(range(40))
        assert sorted(p.name for p in staging.iterdir() if p.is_dir()) == ["rec-live", "rec-other"]
    finally:
        live.release()


def test_eval_record_dataset_keeps_the_evaluations_episodes(prefect_harness, monkeypatch):
    """A stochastic policy (the random baseline): the dataset's episodes are still the evaluation's rows,
    since its one chunk is the evaluation's manifest (same lanes, seeds and sampling generator)."""
    import json

    from prefect.settings import PREFECT_API_URL
    from typer.testing import CliRunner

    from gradlab.cli.app import app

    monkeypatch.setenv("PREFECT_API_URL", PREFECT_API_URL.value())
    out = CliRunner().invoke(app, ["eval", "--baseline", "random", "gradlab__bandit", "--episodes", "24", "--json",
                                   "--record-dataset", "bandit-eval"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    manifest = read_dataset(open_dataset_store(), "bandit-eval")
    assert manifest.agent.kind == "random"
    assert [(e.index, e.seed, e.return_, e.outcome) for e in manifest.episodes] == \
        [(r["index"], r["seed"], r["return"], r["outcome"]) for r in result["episodes"]]
    assert "returns, lengths and outcomes equal the evaluation's rows" in out.stderr
