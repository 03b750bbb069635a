"""Checkpoint bundles: atomic layout, manifest, verification, weights-only policies, trust."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from gradlab.checkpoints import (
    file_sha256,
    latest_checkpoint,
    list_checkpoints,
    load_policy,
    load_sb3_model,
    verify_checkpoint,
    write_checkpoint,
)
from gradlab.errors import IntegrityError, NotFound, TrustError
from gradlab.learn.learner import run_learner
from tests.learn.conftest import BANDIT, make_spec


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PPO run on the bandit with observation normalisation (2 checkpoints)."""
    run_dir = tmp_path_factory.mktemp("ckpt") / "run"
    spec = make_spec(BANDIT, {"id": "sb3.ppo", "config": {"n_steps": 32, "batch_size": 64, "n_epochs": 2, "gamma": 0.0}},
                     timesteps=512, checkpoint_freq=256, policy_model={"net_arch": [16]},
                     normalize={"observation": True})
    run_learner(spec, run_dir)
    return run_dir


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run" / "checkpoints" / src.name
    shutil.copytree(src, dst)
    return dst


def test_layout_and_manifest(trained: Path) -> None:
    ckpts = list_checkpoints(trained)
    assert [p.name[:12] for p in ckpts] == ["000000000256", "000000000512"]
    path = ckpts[-1]
    m = verify_checkpoint(path)
    assert path.name == f"{512:012d}-{m.sha256[:16]}"
    assert m.sha256 == file_sha256(path / "policy.zip")
    assert (m.step, m.purpose, m.backend_id) == (512, "final", "sb3.ppo")
    assert set(m.files) == {"policy.zip", "policy.safetensors", "policy_spec.json", "resume/state.json",
                            "resume/optimizer.pt", "resume/vecnormalize.json", "resume/lanes.json",
                            "resume/lanes.npz", "resume/last_obs.npy", "resume/early_stop.json"}
    for name, entry in m.files.items():
        assert entry.size_bytes == (path / name).stat().st_size
        assert entry.sha256 == file_sha256(path / name)
    assert {"gradlab", "python", "torch", "stable-baselines3", "gymnasium", "provider:gradlab"} <= set(m.versions)
    state = json.loads((path / "resume" / "state.json").read_text())
    assert state["num_timesteps"] == 512 and state["env_state"] == "lanes"
    assert latest_checkpoint(trained) == path
    assert not list((trained / "checkpoints").glob(".partial-*"))


@pytest.mark.parametrize("name", ["policy.zip", "policy.safetensors", "policy_spec.json", "resume/state.json",
                                  "resume/optimizer.pt"])
def test_flipped_byte_names_the_file(trained: Path, tmp_path: Path, name: str) -> None:
    path = _copy(list_checkpoints(trained)[-1], tmp_path)
    target = path / name
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=rf"{path}/{name}: sha256 expected [0-9a-f]{{64}}, found [0-9a-f]{{64}}"):
        verify_checkpoint(path)
    with pytest.raises(IntegrityError, match=name):
        load_policy(path)


def test_missing_extra_and_truncated_files(trained: Path, tmp_path: Path) -> None:
    path = _copy(list_checkpoints(trained)[-1], tmp_path)
    (path / "notes.txt").write_text("x")
    with pytest.raises(IntegrityError, match="notes.txt: file not listed in the manifest"):
        verify_checkpoint(path)
    (path / "notes.txt").unlink()
    (path / "resume" / "optimizer.pt").write_bytes(b"")
    with pytest.raises(IntegrityError, match=r"resume/optimizer.pt: size expected \d+ bytes, found 0"):
        verify_checkpoint(path)
    (path / "resume" / "optimizer.pt").unlink()
    with pytest.raises(IntegrityError, match="optimizer.pt: listed in the manifest but missing"):
        verify_checkpoint(path)
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(IntegrityError, match="manifest.json: not a valid checkpoint manifest"):
        verify_checkpoint(path)
    with pytest.raises(NotFound):
        verify_checkpoint(tmp_path / "nowhere")


def test_interrupted_write_leaves_no_checkpoint(tmp_path: Path) -> None:
    def boom(folder: Path) -> None:
        (folder / "policy.zip").write_bytes(b"half")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        write_checkpoint(tmp_path / "checkpoints", step=5, write_files=boom, manifest_fields={})
    assert list((tmp_path / "checkpoints").iterdir()) == []
    # A leftover .partial folder (as after SIGKILL) is invisible to readers.
    (tmp_path / "checkpoints" / ".partial-000000000005-abcd").mkdir()
    assert list_checkpoints(tmp_path) == [] and latest_checkpoint(tmp_path) is None


def test_weights_only_policy_matches_sb3(trained: Path) -> None:
    path = list_checkpoints(trained)[-1]
    policy = load_policy(path)  # no unpickling: safetensors + JSON only
    model = load_sb3_model(path, algorithm="ppo", own_roots=[trained])  # the run's own directory: trusted
    obs = np.eye(4, dtype=np.float32)[np.arange(16) % 4]
    # SB3's own path: VecNormalize's statistics, then the policy's distribution.
    vn = json.loads((path / "resume" / "vecnormalize.json").read_text())
    mean, var = np.asarray(vn["obs_rms"]["mean"]), np.asarray(vn["obs_rms"]["var"])
    norm = np.clip((obs - mean) / np.sqrt(var + vn["epsilon"]), -vn["clip_obs"], vn["clip_obs"]).astype(np.float32)
    with torch.no_grad():
        dist = model.policy.get_distribution(torch.as_tensor(norm))
        sb3_probs = dist.distribution.probs.numpy()
        sb3_values = model.policy.predict_values(torch.as_tensor(norm)).numpy().ravel()
    probs = policy.action_probs(obs)
    assert probs.shape == (16, 4)
    assert np.abs(probs - sb3_probs).max() <= 1e-6
    assert np.abs(policy.value(obs) - sb3_values).max() <= 1e-6
    assert (policy.act(obs, deterministic=True) == sb3_probs.argmax(axis=1)).all()
    a1 = policy.act(obs, deterministic=False, rng=np.random.default_rng(7))
    a2 = policy.act(obs, deterministic=False, rng=np.random.default_rng(7))
    assert (a1 == a2).all() and a1.dtype == np.int64 and set(a1.tolist()) <= {0, 1, 2, 3}


def test_trust_rules_for_the_sb3_zip(trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outside = tmp_path / "downloads" / "ckpt"
    shutil.copytree(list_checkpoints(trained)[-1], outside)
    with pytest.raises(TrustError, match=r"downloads/ckpt/policy.zip: refusing to unpickle.*trust_model=True"):
        load_sb3_model(outside, algorithm="ppo")
    assert load_sb3_model(outside, algorithm="ppo", trust_model=True).num_timesteps == 512
    assert load_sb3_model(outside, algorithm="ppo", own_roots=[tmp_path / "downloads"]).num_timesteps == 512
    monkeypatch.setenv("GRADLAB_TRUSTED_MODEL_SOURCES", f"/elsewhere/*, {tmp_path}/downloads/*")
    assert load_sb3_model(outside, algorithm="ppo").num_timesteps == 512
    monkeypatch.setenv("GRADLAB_TRUSTED_MODEL_SOURCES", "/elsewhere/*")
    with pytest.raises(TrustError):
        load_sb3_model(outside, algorithm="ppo")
    # The weights-only path needs no trust.
    assert load_policy(outside).action_probs(np.eye(4, dtype=np.float32)).shape == (4, 4)


def test_infinite_box_bounds_round_trip_through_the_policy_spec() -> None:
    """CartPole's velocity bounds are infinite; the weights-only spec must keep them."""
    import json

    import gymnasium as gym

    from gradlab.checkpoints.policy import SpaceSpec, space_to_spec, spec_to_space

    space = gym.make("CartPole-v1").observation_space
    text = json.dumps({"observation_space": space_to_spec(space).model_dump(mode="json")}, allow_nan=False)
    rebuilt = spec_to_space(SpaceSpec.model_validate(json.loads(text)["observation_space"]))
    assert rebuilt == space
    assert np.isinf(rebuilt.high[1]) and rebuilt.high[1] > 0
