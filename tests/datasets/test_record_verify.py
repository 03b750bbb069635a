"""Datasets: a CartPole recording equals its evaluation and re-simulates bit-exactly; a flipped byte or
a changed action fails ``verify`` naming the file or the first diverging step; ``list``/``show``."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gradlab.cli.app import app
from gradlab.datasets.verify import verify_dataset
from gradlab.stores import keys, open_store

pytestmark = pytest.mark.slow  # the module's recording trains a tiny PPO policy first (seconds)


def _copy_store(recorded, tmp_path: Path):
    src = Path(recorded.store.base_url.removeprefix("file://"))
    dst = tmp_path / "store-copy"
    shutil.copytree(src, dst)
    return open_store(dst.as_uri()), dst


def _cli(*args: str, store_dir: Path, monkeypatch):
    monkeypatch.setenv("GRADLAB_DATASET_STORE_URL", store_dir.as_uri())
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_cartpole_recording_equals_the_evaluation_rows_and_replays_bit_exactly(cartpole_dataset):
    from gradlab.checkpoints import read_manifest
    from gradlab.evaluation import EvalRequest, run_evaluation

    ckpt = cartpole_dataset.checkpoint
    spec = json.loads((ckpt.parent.parent / "spec.json").read_text())
    cm = read_manifest(ckpt)
    result = run_evaluation(EvalRequest(checkpoint_dir=str(ckpt), checkpoint_sha256=cm.sha256, checkpoint_step=cm.step,
                                        spec=spec, episodes=10))
    recorded = cartpole_dataset.manifest
    assert [e.index for e in recorded.episodes] == list(range(10))
    assert [(e.seed, e.return_, e.raw_return, e.length, e.outcome) for e in recorded.episodes] == \
        [(r.seed, r.return_, r.raw_return, r.length, r.outcome) for r in result.episodes]
    assert recorded.agent.kind == "checkpoint" and recorded.agent.checkpoint_sha256 == cm.sha256
    assert recorded.determinism == "deterministic" and len(recorded.files) == 10

    report = verify_dataset(cartpole_dataset.store, "cartpole-tiny", cache=cartpole_dataset.cache)
    assert report.ok, report
    assert (report.files_checked, report.episodes_replayed, report.divergences) == (10, 10, [])


def test_a_flipped_byte_fails_verify_naming_the_file(cartpole_dataset, tmp_path, monkeypatch):
    store, folder = _copy_store(cartpole_dataset, tmp_path)
    rel = cartpole_dataset.manifest.episodes[3].steps_file
    path = folder / keys.dataset_file("cartpole-tiny", cartpole_dataset.manifest.recording_id, rel)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    out = _cli("dataset", "verify", "cartpole-tiny", "--json", store_dir=folder, monkeypatch=monkeypatch)
    assert out.exit_code == 1
    doc = json.loads(out.stdout)
    assert doc["ok"] is False and len(doc["file_problems"]) == 1
    assert doc["file_problems"][0].startswith(store.url(keys.dataset_file(
        "cartpole-tiny", cartpole_dataset.manifest.recording_id, rel)) + f": sha256 expected {cartpole_dataset.manifest.files[rel].sha256}")
    assert doc["unchecked"] == ["re-simulation: skipped, the files do not match the manifest"]


def test_one_changed_action_names_the_first_diverging_step(cartpole_dataset, tmp_path):
    """Someone rewrites an episode's actions and its manifest hashes consistently: only re-simulation catches it."""
    from gradlab.stores.base import sha256_hex

    store, folder = _copy_store(cartpole_dataset, tmp_path)
    manifest = cartpole_dataset.manifest
    episode = manifest.episodes[2]
    path = folder / keys.dataset_file(manifest.name, manifest.recording_id, episode.steps_file)
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    step = min(3, episode.length - 1)
    arrays["actions"][step] = 1 - arrays["actions"][step]
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    path.write_bytes(buf.getvalue())
    doc = manifest.as_json()
    doc["files"][episode.steps_file] = {"sha256": sha256_hex(buf.getvalue()), "size_bytes": len(buf.getvalue())}
    (folder / keys.dataset_manifest(manifest.name)).write_text(json.dumps(doc))

    report = verify_dataset(store, manifest.name, cache=tmp_path / "cache")
    assert not report.ok and report.file_problems == []
    assert len(report.divergences) == 1
    assert report.divergences[0].startswith(f"episode 2 (seed {episode.seed}): first diverging step {step}: ")


def test_list_and_show_give_counts_return_intervals_and_provenance(cartpole_dataset, monkeypatch):
    folder = Path(cartpole_dataset.store.base_url.removeprefix("file://"))
    shown = _cli("dataset", "show", "cartpole-tiny", "--json", store_dir=folder, monkeypatch=monkeypatch)
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    returns = [e.return_ for e in cartpole_dataset.manifest.episodes]
    assert doc["episodes"] == 10 and doc["steps"] == sum(e.length for e in cartpole_dataset.manifest.episodes)
    assert doc["return"]["mean"] == np.mean(returns)
    assert doc["return"]["mean_low"] <= doc["return"]["mean"] <= doc["return"]["mean_high"]
    assert doc["provenance"]["checkpoint_sha256"] == cartpole_dataset.manifest.agent.checkpoint_sha256
    assert doc["sha256"] == cartpole_dataset.manifest.sha256
    listed = _cli("dataset", "list", "--json", store_dir=folder, monkeypatch=monkeypatch)
    assert [d["name"] for d in json.loads(listed.stdout)] == ["cartpole-tiny"]
    missing = _cli("dataset", "show", "nope", store_dir=folder, monkeypatch=monkeypatch)
    assert missing.exit_code == 1 and "dataset 'nope': no " in missing.output
