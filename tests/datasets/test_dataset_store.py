"""The dataset store on ``file://`` and on moto's S3 server: publish writes the files, then the
manifest, create-only; a second recording of the same name is refused; files are checked on read."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradlab.datasets.plan import plan_recording
from gradlab.datasets.record import record_chunk
from gradlab.datasets.store import check_files, list_datasets, publish_dataset, read_dataset
from gradlab.datasets.verify import verify_dataset
from gradlab.errors import Conflict
from gradlab.stores import keys, open_store
from tests.s3server import s3_bucket, shared_s3_server  # noqa: F401 (pytest fixtures)

pytestmark = pytest.mark.slow  # each test steps the bandit env in this process (seconds on a loaded machine)


@pytest.fixture(params=["file", "s3"])
def dataset_store(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "file":
        return open_store((tmp_path / "dataset").as_uri())
    return open_store(request.getfixturevalue("s3_bucket").url("dataset"))


def test_publish_read_verify_and_refuse_a_second_recording(dataset_store, tmp_path):
    plan = plan_recording("bandit-noop", goal_id="gradlab__bandit", policy="noop", episodes=12, chunk_episodes=5,
                          frames=False)
    results = [record_chunk(plan, i) for i in range(len(plan.chunks))]
    manifest = publish_dataset(dataset_store, plan, results, created_at="now")
    assert list_datasets(dataset_store) == ["bandit-noop"]
    assert read_dataset(dataset_store, "bandit-noop") == manifest
    assert check_files(dataset_store, manifest) == []
    assert sorted(dataset_store.list(keys.dataset_prefix("bandit-noop"))) == sorted(
        [keys.dataset_manifest("bandit-noop")] + [keys.dataset_file("bandit-noop", plan.recording_id, f) for f in manifest.files])
    report = verify_dataset(dataset_store, "bandit-noop", cache=tmp_path / "cache")
    assert report.ok and report.episodes_replayed == 12

    again = plan_recording("bandit-noop", goal_id="gradlab__bandit", policy="noop", episodes=12, chunk_episodes=5,
                           frames=False)
    with pytest.raises(Conflict, match="dataset 'bandit-noop' exists already"):
        publish_dataset(dataset_store, again, [record_chunk(again, i) for i in range(len(again.chunks))], created_at="now")


def test_a_chunk_missing_an_episode_is_refused_and_stores_nothing(tmp_path):
    store = open_store((tmp_path / "dataset").as_uri())
    plan = plan_recording("short", goal_id="gradlab__bandit", policy="noop", episodes=6, chunk_episodes=3, frames=False)
    results = [record_chunk(plan, 0)]  # chunk 1 never ran
    from gradlab.errors import ContractViolation

    with pytest.raises(ContractViolation, match="3 planned episodes were not recorded"):
        publish_dataset(store, plan, results, created_at="now")
    assert store.list("datasets/") == []
