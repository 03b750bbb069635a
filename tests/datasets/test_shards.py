"""Step shards: one ``.npz`` per chunk whose bytes are a function of the episodes alone, so the same
episodes recorded twice give the same files and the same dataset sha256, however the recorder's
memory was gathered or spilled on the way."""

from __future__ import annotations

import numpy as np
import pytest

from gradlab.datasets import shard
from gradlab.datasets.plan import plan_recording
from gradlab.datasets.record import record_chunk
from gradlab.datasets.store import fetch_dataset, load_steps, publish_dataset
from gradlab.datasets.verify import verify_dataset
from gradlab.stores import open_store

pytestmark = pytest.mark.slow  # three CartPole recordings in this process (seconds on a loaded machine)


def _record(tmp_path, tag: str, created_at: str):
    store = open_store((tmp_path / f"store-{tag}").as_uri())
    plan = plan_recording("cartpole-random", goal_id="CartPole-v1", policy="random", episodes=12, chunk_episodes=5,
                          frames=False)
    plan = plan.model_copy(update={"staging_dir": str(tmp_path / f"staging-{tag}")})
    manifest = publish_dataset(store, plan, [record_chunk(plan, i) for i in range(len(plan.chunks))],
                               created_at=created_at)
    return store, manifest


def test_the_same_episodes_give_the_same_shards_and_dataset_sha256_however_memory_was_spilled(tmp_path, monkeypatch):
    store, first = _record(tmp_path, "a", "2026-01-01T00:00:00+00:00")
    _, second = _record(tmp_path, "b", "2026-06-01T12:00:00+00:00")
    monkeypatch.setattr(shard, "GATHER_BYTES", 0)  # gather after every episode
    monkeypatch.setattr(shard, "SPILL_BYTES", 0)  # and spill every gathered row to a temporary file
    _, spilled = _record(tmp_path, "c", "2026-06-02T12:00:00+00:00")

    assert sorted(first.files) == [f"episodes/chunk-{c:05d}.npz" for c in range(3)]
    assert first.recording_id != second.recording_id != spilled.recording_id
    assert first.files == second.files == spilled.files  # same bytes (sha256 and size), file by file
    assert first.episodes == second.episodes == spilled.episodes  # same offsets too
    assert first.sha256 == second.sha256 == spilled.sha256  # the identity leaves out recording id and time
    assert first.as_json() != second.as_json()

    folder = fetch_dataset(store, first, tmp_path / "cache")
    steps = [load_steps(folder, e) for e in first.episodes]
    assert [len(s["actions"]) for s in steps] == [e.length for e in first.episodes]
    assert [len(s["observations"]) for s in steps] == [e.length + 1 for e in first.episodes]
    assert all(s["terminated"][-1] or s["truncated"][-1] for s in steps)
    assert all(not (s["terminated"][:-1] | s["truncated"][:-1]).any() for s in steps)  # one episode each
    assert [float(np.sum(s["rewards"], dtype=np.float64)) for s in steps] == [e.return_ for e in first.episodes]
    with pytest.raises(ValueError, match="read-only"):
        steps[0]["actions"][0] = 1  # views of the cached shard: they cannot be written through
    report = verify_dataset(store, "cartpole-random", cache=tmp_path / "cache")
    assert report.ok and report.episodes_replayed == 12 and report.files_checked == 3
