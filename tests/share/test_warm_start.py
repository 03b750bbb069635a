"""Warm starts: the learner starts from a parent checkpoint's weights and records its sha256."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from gradlab.checkpoints import list_checkpoints, read_manifest
from gradlab.contracts import Experiments
from gradlab.contracts.run_spec import InitFrom, RunSpec
from gradlab.errors import ContractViolation
from gradlab.learn.learner import run_learner
from tests.share.conftest import gradlab


def _init(ckpt: Path, *, optimizer: bool = False) -> InitFrom:
    m = read_manifest(ckpt)
    return InitFrom(source=str(ckpt), checkpoint_sha256=m.sha256, checkpoint_step=m.step, run_id=m.run_id,
                    path=str(ckpt), optimizer=optimizer)


def _spec(overrides: tuple[str, ...], init: InitFrom, run_id: str) -> RunSpec:
    resolved = Experiments().resolve("CartPole-v1/ppo", list(overrides))
    return RunSpec.from_resolved(resolved, seed=1, run_id=run_id, init_from=init)


def test_warm_start_begins_at_the_parents_weights_and_records_its_sha256(cartpole_run: Path, tmp_path: Path) -> None:
    parent = list_checkpoints(cartpole_run)[-1]
    # learning_rate 0: the update changes nothing, so the child's weights are exactly the parent's.
    spec = _spec(("train.timesteps=512", "train.checkpoint_freq=256", "train.backend.config.learning_rate=0.0"),
                 _init(parent, optimizer=True), "gradlab-20260101T000000-000c41d0")
    run_learner(spec, tmp_path / "child", watch_parent=False)
    children = list_checkpoints(tmp_path / "child")
    assert [read_manifest(c).step for c in children] == [256, 512]
    parent_sha = read_manifest(parent).sha256
    assert {read_manifest(c).init_from_sha256 for c in children} == {parent_sha}
    ours, theirs = load_file(str(children[0] / "policy.safetensors")), load_file(str(parent / "policy.safetensors"))
    assert set(ours) == set(theirs) and all(ours[k].equal(theirs[k]) for k in ours)


def test_incompatible_architecture_is_refused_naming_the_first_tensor(cartpole_run: Path, tmp_path: Path) -> None:
    parent = list_checkpoints(cartpole_run)[-1]
    spec = _spec(("train.timesteps=512", "train.policy_model.net_arch=[32, 32]"), _init(parent),
                 "gradlab-20260101T000000-000c41d1")
    with pytest.raises(ContractViolation, match=r"tensor mlp_extractor\.policy_net\.0\.weight: shape expected "
                                                r"\(32, 4\) \(this recipe's policy\), found \(64, 4\)"):
        run_learner(spec, tmp_path / "bad", watch_parent=False)
    assert list_checkpoints(tmp_path / "bad") == []


def test_train_refuses_a_parent_of_another_observation_space_before_training(cartpole_run: Path, gradlab_home: Path) -> None:
    parent = list_checkpoints(cartpole_run)[-1]
    out = gradlab("train", "Acrobot-v1/ppo", "--init-from", str(parent))
    assert out.returncode == 1
    assert "observation space of Acrobot-v1 is Box(6,) float32, the parent checkpoint was trained on Box(4,) float32" \
        in out.stderr
    assert not list((gradlab_home / "runs").glob("gradlab-*"))  # nothing started
    assert gradlab("train", "CartPole-v1/ppo", "--init-optimizer").returncode == 1
