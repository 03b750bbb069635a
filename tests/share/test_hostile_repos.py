"""Hostile shared repositories: crafted snapshots in the local hub cache the publish tests read from.

The repository is built by gradlab's own ``build_repo_folder`` from an untrained bandit checkpoint and
its real evaluation, then altered as an attacker would (and re-hashed wherever the attack needs the
hashes to agree, so the check under test is the one that refuses it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from gradlab.errors import ContractViolation, IntegrityError
from gradlab.share.hub import verify_repo_folder
from tests.share.conftest import gradlab, place_in_hub_cache

RUN_ID = "gradlab-20260101T000000-00ba0bab"
REPO_ID = "mallory/bandit"


@pytest.fixture(scope="module")
def repo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A genuine repository folder (no replay video) of an untrained gradlab__bandit/ppo checkpoint."""
    from gradlab.benchmarks.play import write_untrained_run
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.evaluation import EvalRequest, run_evaluation
    from gradlab.share.hub import build_repo_folder

    root = tmp_path_factory.mktemp("hostile")
    run_dir, ckpt = write_untrained_run(root / "runs", "gradlab__bandit/ppo", RUN_ID)
    spec = RunSpec.model_validate_json((run_dir / "spec.json").read_bytes())
    manifest = json.loads((ckpt / "manifest.json").read_text())
    result = run_evaluation(EvalRequest(checkpoint_dir=str(ckpt), checkpoint_sha256=manifest["sha256"],
                                        checkpoint_step=manifest["step"], spec=spec.to_json()))
    build_repo_folder(ckpt, spec, result, root / "repo", accepted=False, video=False)
    return root / "repo"


@pytest.fixture
def snapshot(repo_folder: Path, tmp_path: Path) -> Path:
    return place_in_hub_cache(repo_folder, tmp_path / "hub", REPO_ID)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rehash(snapshot: Path, *changed: str) -> None:
    """Make the manifest and gradlab.json agree with changed checkpoint files (an attacker can)."""
    manifest_path = snapshot / "checkpoint" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for rel in changed:
        path = snapshot / "checkpoint" / rel
        manifest["files"][rel] = {"sha256": _sha(path), "size_bytes": path.stat().st_size}
    manifest_path.write_text(json.dumps(manifest))
    index = json.loads((snapshot / "gradlab.json").read_text())
    for rel in ("manifest.json", *changed):
        index["files"][f"checkpoint/{rel}"] = _sha(snapshot / "checkpoint" / rel)
    (snapshot / "gradlab.json").write_text(json.dumps(index))


def _edit_index(snapshot: Path, edit) -> None:
    index = json.loads((snapshot / "gradlab.json").read_text())
    edit(index)
    (snapshot / "gradlab.json").write_text(json.dumps(index))


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every file the loader hashes or reads, in order."""
    import gradlab.share.hub as hub

    seen: list[Path] = []
    real_sha, real_read = hub.file_sha256, Path.read_bytes

    def sha(path):
        seen.append(Path(path))
        return real_sha(path)

    def read_bytes(self):
        seen.append(self)
        return real_read(self)

    monkeypatch.setattr(hub, "file_sha256", sha)
    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    return seen


def test_the_genuine_repository_verifies(snapshot: Path) -> None:
    model = verify_repo_folder(snapshot)
    assert model.index["run_id"] == RUN_ID and model.checkpoint == snapshot / "checkpoint"


@pytest.mark.parametrize("name", ["../../../outside.json", "/etc/hostname", "checkpoint/../../outside.json",
                                  "./run_spec.json", "a\\..\\b"])
def test_a_name_leaving_the_snapshot_is_refused_by_name_and_never_read(snapshot: Path, reads: list[Path],
                                                                     name: str) -> None:
    outside = snapshot.parents[2] / "outside.json"
    outside.write_text("{}")
    _edit_index(snapshot, lambda index: index["files"].update({name: "0" * 64}))
    with pytest.raises(IntegrityError) as refused:
        verify_repo_folder(snapshot)
    assert repr(name) in str(refused.value) and "not read" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert outside not in reads and Path("/etc/hostname") not in reads
    assert not [p for p in reads if p.name != "gradlab.json"]  # refused before any file was hashed


def test_a_symlink_leaving_the_snapshot_is_refused_and_never_read(snapshot: Path, reads: list[Path]) -> None:
    secret = snapshot.parents[3] / "secret.json"
    secret.write_text('{"token": "hf_secret"}')
    target = snapshot / "evaluation.json"
    target.unlink()
    os.symlink(secret, target)
    with pytest.raises(IntegrityError) as refused:
        verify_repo_folder(snapshot)
    assert str(target) in str(refused.value) and "leaving the repository snapshot" in str(refused.value)
    assert secret not in reads and target not in reads


def test_links_into_the_caches_own_blobs_are_followed(snapshot: Path) -> None:
    """huggingface_hub's snapshots are links into the repository's ``blobs/``: those are inside."""
    blobs = snapshot.parents[1] / "blobs"
    blobs.mkdir()
    for path in sorted(p for p in snapshot.rglob("*") if p.is_file()):
        blob = blobs / _sha(path)
        shutil.move(path, blob)
        os.symlink(os.path.relpath(blob, path.parent), path)
    assert verify_repo_folder(snapshot).index["run_id"] == RUN_ID


@pytest.mark.parametrize(("break_it", "expected"), [
    (lambda s: (s / "gradlab.json").write_text('{"format": "gradlab.hf-repo/1", "files": {'),
     "gradlab.json: not valid JSON"),
    (lambda s: _edit_index(s, lambda i: i.pop("files")), "gradlab.json: files: Field required"),
    (lambda s: _edit_index(s, lambda i: i.update(files=["run_spec.json"])), "gradlab.json: files: Input should be a valid dictionary"),
    (lambda s: _edit_index(s, lambda i: i["files"].pop("run_spec.json")),
     "gradlab.json: files: run_spec.json is not listed"),
    (lambda s: _edit_index(s, lambda i: i.pop("checkpoint_sha256")), "gradlab.json: checkpoint_sha256: Field required"),
], ids=["not-json", "no-files", "files-not-a-mapping", "unlisted-spec", "no-checkpoint-sha"])
def test_a_malformed_index_is_one_line_naming_the_file_and_key(snapshot: Path, break_it, expected: str) -> None:
    break_it(snapshot)
    with pytest.raises(IntegrityError) as refused:
        verify_repo_folder(snapshot)
    message = str(refused.value)
    assert expected in message and "\n" not in message, message


def test_a_run_spec_without_its_goal_is_one_line(snapshot: Path) -> None:
    spec = json.loads((snapshot / "run_spec.json").read_text())
    del spec["goal"]
    (snapshot / "run_spec.json").write_text(json.dumps(spec))
    _edit_index(snapshot, lambda i: i["files"].update({"run_spec.json": _sha(snapshot / "run_spec.json")}))
    with pytest.raises(IntegrityError, match=r"run_spec.json: <root>: Input should be a valid dictionary"):
        verify_repo_folder(snapshot)


def test_a_broken_safetensors_header_is_one_line(snapshot: Path) -> None:
    weights = snapshot / "checkpoint" / "policy.safetensors"
    data = weights.read_bytes()
    weights.write_bytes((10**12).to_bytes(8, "little") + data[8:])  # a header length past the file
    _rehash(snapshot, "policy.safetensors")
    with pytest.raises(IntegrityError) as refused:
        verify_repo_folder(snapshot)
    assert f"{weights}: not a readable safetensors file" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_spec_over_its_limits_is_refused_before_any_network_exists(snapshot: Path) -> None:
    spec_file = snapshot / "checkpoint" / "policy_spec.json"
    spec = json.loads(spec_file.read_text())
    spec["net_arch"] = [16384] * 16  # 4 Gi parameters if it were built
    spec_file.write_text(json.dumps(spec))
    _rehash(snapshot, "policy_spec.json")
    with pytest.raises(ContractViolation, match=r"describes a network of [\d,]+ parameters, more than the 134,217,728"):
        verify_repo_folder(snapshot)
    spec["net_arch"] = [10**9]
    spec_file.write_text(json.dumps(spec))
    _rehash(snapshot, "policy_spec.json")
    with pytest.raises(ContractViolation, match=r"policy_spec.json: net_arch: Value error, expected at most 16 layers "
                                                r"of 1..16384 units, found \[1000000000\]"):
        verify_repo_folder(snapshot)
    spec["net_arch"], spec["observation_space"]["shape"] = [32], [1 << 30]
    spec_file.write_text(json.dumps(spec))
    _rehash(snapshot, "policy_spec.json")
    with pytest.raises(ContractViolation, match=r"observation_space.shape: Value error, expected at most 8 dimensions"):
        verify_repo_folder(snapshot)


def test_tensor_shapes_are_checked_against_the_spec(snapshot: Path) -> None:
    spec_file = snapshot / "checkpoint" / "policy_spec.json"
    spec = json.loads(spec_file.read_text())
    spec["net_arch"] = [64]  # the weights are of [32]
    spec_file.write_text(json.dumps(spec))
    _rehash(snapshot, "policy_spec.json")
    with pytest.raises(ContractViolation, match=r"policy.safetensors: tensor mlp_extractor.policy_net.0.weight: "
                                                r"shape expected \(64, 4\) \(policy_spec.json\), found \(32, 4\)"):
        verify_repo_folder(snapshot)


@pytest.mark.slow
def test_eval_play_and_init_from_answer_one_line(snapshot: Path, tmp_path: Path, gradlab_home: Path) -> None:
    """The commands a user points at a repository: exit 1 with one error line, nothing started."""
    env = {"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_CACHE": str(snapshot.parents[2]), "HF_HUB_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": ""}

    def one_line(args: list[str], expected: str) -> None:
        out = gradlab(*args, env=env)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1 and len(lines) == 1, (args, out.stderr)
        assert lines[0].startswith("error:") and expected in lines[0], (args, out.stderr)

    weights = snapshot / "checkpoint" / "policy.safetensors"
    weights.write_bytes(b"\xff" * 8 + weights.read_bytes()[8:])
    _rehash(snapshot, "policy.safetensors")
    one_line(["play", f"hf://{REPO_ID}", "--record", str(tmp_path / "x.mp4")], "not a readable safetensors file")
    one_line(["train", "gradlab__bandit/ppo", "--init-from", f"hf://{REPO_ID}"], "not a readable safetensors file")
    _edit_index(snapshot, lambda i: i["files"].update({"../../../../etc/passwd": "0" * 64}))
    one_line(["eval", f"hf://{REPO_ID}"], "'../../../../etc/passwd', outside the repository snapshot; not read")
    assert not (tmp_path / "x.mp4").exists() and not list((gradlab_home / "runs").glob("gradlab-*"))
