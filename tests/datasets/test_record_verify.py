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
    assert recorded.determinism == "deterministic"
    assert sorted(recorded.files) == [f"episodes/chunk-{c:05d}.npz" for c in range(3)]  # one shard per chunk of 4
    chunk = recorded.episodes[4:8]
    assert {e.steps_file for e in chunk} == {"episodes/chunk-00001.npz"}
    # The chunk's episodes tile its shard: steps end to end, each with one observation more.
    spans = sorted((e.step_offset, e.observation_offset, e.length) for e in chunk)
    assert [s for s, _, _ in spans] == [sum(n for _, _, n in spans[:i]) for i in range(4)]
    assert [o for _, o, _ in spans] == [sum(n + 1 for _, _, n in spans[:i]) for i in range(4)]

    report = verify_dataset(cartpole_dataset.store, "cartpole-tiny", cache=cartpole_dataset.cache)
    assert report.ok, report
    assert (report.files_checked, report.episodes_replayed, report.divergences) == (3, 10, [])


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


def test_a_manifest_row_changed_by_hand_fails_verify_naming_its_key_path(cartpole_dataset, tmp_path, monkeypatch):
    """The files still match their hashes; the manifest's own row of episode 0 no longer matches them."""
    _, folder = _copy_store(cartpole_dataset, tmp_path)
    path = folder / keys.dataset_manifest("cartpole-tiny")
    doc = json.loads(path.read_text())
    doc["episodes"][0]["return"] = doc["episodes"][0]["return"] + 100.0
    path.chmod(0o600)
    path.write_text(json.dumps(doc))
    out = _cli("dataset", "verify", "cartpole-tiny", "--json", store_dir=folder, monkeypatch=monkeypatch)
    assert out.exit_code == 1
    report = json.loads(out.stdout)
    assert report["ok"] is False
    assert any("episodes[0].return:" in line and "rewards sum to" in line for line in report["file_problems"])


def test_a_copied_dataset_folder_is_refused_and_one_bad_manifest_does_not_hide_the_others(
        cartpole_dataset, tmp_path, monkeypatch):
    _, folder = _copy_store(cartpole_dataset, tmp_path)
    datasets = folder / "datasets"
    shutil.copytree(datasets / "cartpole-tiny", datasets / "copy")
    out = _cli("dataset", "verify", "copy", store_dir=folder, monkeypatch=monkeypatch)
    assert out.exit_code == 1 and "name: expected 'copy' (the dataset's folder), found 'cartpole-tiny'" in out.output
    listed = _cli("dataset", "list", "--json", store_dir=folder, monkeypatch=monkeypatch)
    assert listed.exit_code == 1
    assert [d["name"] for d in json.loads(listed.stdout)] == ["cartpole-tiny"]
    assert "copy/manifest.json: name: expected 'copy'" in listed.output


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
    arrays["actions"][episode.step_offset + step] = 1 - arrays["actions"][episode.step_offset + step]
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


def test_minari_and_hf_exports_load_with_their_own_packages(cartpole_dataset, tmp_path, monkeypatch):
    import datasets
    import minari

    folder = Path(cartpole_dataset.store.base_url.removeprefix("file://"))
    manifest = cartpole_dataset.manifest
    out = _cli("dataset", "export", "cartpole-tiny", "--format", "minari", "--out", str(tmp_path / "minari"),
               store_dir=folder, monkeypatch=monkeypatch)
    assert out.exit_code == 0, out.output
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    loaded = minari.load_dataset("gradlab/cartpole-tiny-v0")
    assert loaded.total_episodes == 10 and loaded.total_steps == sum(e.length for e in manifest.episodes)
    assert loaded.observation_space.shape == (4,) and loaded.action_space.n == 2
    episodes = list(loaded.iterate_episodes())
    assert [float(np.sum(e.rewards)) for e in episodes] == [e.return_ for e in manifest.episodes]
    assert [len(e.observations) for e in episodes] == [e.length + 1 for e in manifest.episodes]
    assert loaded.storage.metadata["algorithm_name"] == "gradlab:checkpoint"
    assert manifest.sha256 in loaded.storage.metadata["description"]
    # minari's own recover_environment(): the registered CartPole-v1 with the goal's 500-step cap, which
    # replays an episode from its seed and actions to the recorded observations, rewards and end.
    env = loaded.recover_environment()
    try:
        assert env.spec.id == "CartPole-v1" and env.spec.max_episode_steps == 500
        first = episodes[0]
        obs, _ = env.reset(seed=manifest.episodes[0].seed)
        assert np.array_equal(obs, first.observations[0])
        for t, action in enumerate(first.actions):
            obs, reward, terminated, truncated, _ = env.step(int(action))
            assert np.array_equal(obs, first.observations[t + 1]) and reward == first.rewards[t]
        assert (terminated, truncated) == (bool(first.terminations[-1]), bool(first.truncations[-1]))
    finally:
        env.close()

    out = _cli("dataset", "export", "cartpole-tiny", "--format", "hf", "--out", str(tmp_path / "hf"),
               store_dir=folder, monkeypatch=monkeypatch)
    assert out.exit_code == 0, out.output
    ds = datasets.load_dataset(str(tmp_path / "hf"), split="train")
    assert ds.num_rows == sum(e.length for e in manifest.episodes)
    assert len(set(ds["episode_id"])) == 10
    by_episode: dict[int, float] = {}
    for index, reward in zip(ds["episode_index"], ds["rewards"], strict=True):
        by_episode[index] = by_episode.get(index, 0.0) + reward
    assert [by_episode[e.index] for e in manifest.episodes] == pytest.approx([e.return_ for e in manifest.episodes])
    assert {"observations", "actions", "terminations", "truncations", "seed", "infos", "collector"} <= set(ds.column_names)


def test_a_minari_export_of_a_goal_gymnasium_cannot_make_says_why_it_has_no_env_spec(tmp_path, monkeypatch):
    import minari

    from gradlab.datasets.plan import plan_recording
    from gradlab.datasets.record import record_chunk
    from gradlab.datasets.store import publish_dataset

    store_dir = tmp_path / "store"
    plan = plan_recording("bandit-minari", goal_id="gradlab__bandit", policy="noop", episodes=4, chunk_episodes=4,
                          frames=False)
    publish_dataset(open_store(store_dir.as_uri()), plan, [record_chunk(plan, 0)], created_at="now")
    out = _cli("dataset", "export", "bandit-minari", "--format", "minari", "--out", str(tmp_path / "minari"),
               store_dir=store_dir, monkeypatch=monkeypatch)
    assert out.exit_code == 0, out.output
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    loaded = minari.load_dataset("gradlab/bandit-minari-v0")
    assert loaded.total_episodes == 4 and loaded.env_spec is None
    assert "No env_spec: provider 'gradlab': Bandit-v0 is made by gradlab's gradlab provider, not registered in " \
        "gymnasium" in loaded.storage.metadata["description"]


def test_upload_sends_the_dataset_and_its_card_to_the_hub(cartpole_dataset, tmp_path, monkeypatch, hub_stand_in):
    import base64

    from huggingface_hub import DatasetCard

    endpoint, requests = hub_stand_in
    folder = Path(cartpole_dataset.store.base_url.removeprefix("file://"))
    for key, value in {"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1",
                       "HF_TOKEN": "hf_test_token", "HF_ENDPOINT": endpoint}.items():
        monkeypatch.setenv(key, value)
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "ENDPOINT", endpoint)
    out = _cli("dataset", "upload", "cartpole-tiny", "alice/cartpole-tiny", "--out", str(tmp_path / "repo"),
               store_dir=folder, monkeypatch=monkeypatch)
    assert out.exit_code == 0, out.output
    created = [(auth, json.loads(body)) for path, auth, body in requests if path == "/api/repos/create"]
    assert len(created) == 1 and created[0][0] == "Bearer hf_test_token"
    assert created[0][1]["type"] == "dataset" and created[0][1]["name"] == "cartpole-tiny"
    commit = [body for path, _, body in requests if path.startswith("/api/datasets/alice/cartpole-tiny/commit/main")]
    assert len(commit) == 1
    lines = [json.loads(line) for line in commit[0].decode().splitlines() if line.strip()]
    sent = {line["value"]["path"]: base64.b64decode(line["value"]["content"]) for line in lines[1:]}
    assert set(sent) == {"README.md", "gradlab_manifest.json", "data/train-00000-of-00001.parquet"}
    card = DatasetCard.load(tmp_path / "repo" / "README.md")
    assert {"gradlab", "reinforcement-learning", "CartPole-v1"} <= set(card.data.tags)
    assert cartpole_dataset.manifest.agent.checkpoint_sha256 in card.text
    assert cartpole_dataset.manifest.sha256 in card.text


def test_upload_without_a_token_fails_uploads_nothing_and_keeps_the_folder(cartpole_dataset, tmp_path, monkeypatch):
    folder = Path(cartpole_dataset.store.base_url.removeprefix("file://"))
    for key, value in {"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": ""}.items():
        monkeypatch.setenv(key, value)
    out = _cli("dataset", "upload", "cartpole-tiny", "alice/cartpole-tiny", "--out", str(tmp_path / "repo"),
               store_dir=folder, monkeypatch=monkeypatch)
    assert out.exit_code == 1
    assert "no Hugging Face token (set HF_TOKEN, [hub] token_ref" in out.output and "nothing uploaded" in out.output
    assert (tmp_path / "repo" / "README.md").is_file()


def test_frames_are_one_mp4_per_episode_with_one_frame_per_step(tmp_path):
    from gradlab.datasets.plan import plan_recording
    from gradlab.datasets.record import record_chunk
    from gradlab.datasets.store import fetch_dataset, publish_dataset
    from gradlab.video import count_frames

    store = open_store((tmp_path / "store").as_uri())
    plan = plan_recording("cartpole-frames", goal_id="CartPole-v1", policy="random", episodes=3, chunk_episodes=3)
    assert plan.frames and plan.n_lanes == 3
    manifest = publish_dataset(store, plan, [record_chunk(plan, 0)], created_at="now")
    folder = fetch_dataset(store, manifest, tmp_path / "cache")
    assert [count_frames(folder / e.frames_file) for e in manifest.episodes] == [e.length for e in manifest.episodes]
    report = verify_dataset(store, "cartpole-frames", cache=tmp_path / "cache")
    assert report.ok and report.episodes_replayed == 3
    assert report.unchecked == ["frames: checked against their sha256 only (MP4 is lossy; not re-rendered)"]
