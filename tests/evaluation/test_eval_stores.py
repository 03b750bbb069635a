"""``gradlab eval RUN_ID[:STEP]`` reads the run from the receipt stores (file:// stores under GRADLAB_HOME).

The stores are populated by the real receipt rules (``open_run``, ``begin_attempt``,
``publish_checkpoint``, ``write_promotion``) over real learner-written bandit checkpoints at steps 64
and 1024 (``tests/evaluation/conftest.py``).
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gradlab.checkpoints import verify_checkpoint
from gradlab.checkpoints.resolve import resolve_checkpoint
from gradlab.contracts.run_spec import RunSpec
from gradlab.errors import IntegrityError, NotFound
from gradlab.evaluation import build_manifest
from gradlab.receipts import (
    CheckpointPublication,
    Promotion,
    begin_attempt,
    evaluation_intent_key,
    open_run,
    publish_checkpoint,
    write_promotion,
)
from gradlab.stores import Stores, keys, open_stores
from tests.evaluation.conftest import RUN_ID
from tests.evaluation.test_eval_cli import gradlab

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.fixture
def home_run(bandit_run, gradlab_home: Path) -> Path:
    run_dir, _ = bandit_run
    dst = gradlab_home / "runs" / RUN_ID
    shutil.copytree(run_dir, dst)
    return dst


def _record(run_dir: Path, *, publish: tuple[int, ...], promote: int | None = None) -> tuple[Stores, dict[int, CheckpointPublication]]:
    """Record the run in $GRADLAB_HOME's stores as the supervisor would: open, attempt, publish, promote."""
    stores = open_stores()
    spec = RunSpec.model_validate_json((run_dir / "spec.json").read_bytes())
    open_run(stores, spec, now=T0)
    attempt, _ = begin_attempt(stores, RUN_ID, mode="fresh", now=T0)
    pubs = {}
    for folder in sorted((run_dir / "checkpoints").iterdir()):
        step = int(folder.name.split("-")[0])
        if step in publish:
            pubs[step] = publish_checkpoint(stores, run_id=RUN_ID, attempt_id=attempt.attempt_id, checkpoint_dir=folder, now=T0)
    if promote is not None:
        _promote(stores, spec, attempt.attempt_id, step=promote, sha256=pubs[promote].sha256, uri=pubs[promote].uri)
    return stores, pubs


def _promote(stores: Stores, spec: RunSpec, attempt_id: str, *, step: int, sha256: str, uri: str) -> Promotion:
    key = evaluation_intent_key(RUN_ID, sha256, spec.goal_contract_sha256, build_manifest(spec.goal).sha256)
    return write_promotion(stores, Promotion(
        run_id=RUN_ID, attempt_id=attempt_id, checkpoint_step=step, checkpoint_sha256=sha256, uri=uri,
        evaluation_key=key, result_uri=stores.eval.url(keys.evaluation_result(RUN_ID, key)), return_mean=1.0,
        promoted_at=T0))


def test_run_id_picks_promoted_then_newest_published_then_newest_local(home_run: Path) -> None:
    local = {int(p.name.split("-")[0]): p for p in (home_run / "checkpoints").iterdir()}
    # Not in the stores at all: the newest local checkpoint, the spec from the run directory.
    r = resolve_checkpoint(RUN_ID)
    assert (r.path, r.origin, r.spec_source) == (local[1024], "local", str(home_run / "spec.json"))
    assert resolve_checkpoint(f"{RUN_ID}:64").path == local[64]

    # Only step 64 published: the newest *published* wins over the newer local 1024; its local copy is used.
    stores, pubs = _record(home_run, publish=(64,))
    r = resolve_checkpoint(RUN_ID)
    assert (r.path, r.origin) == (local[64], "local")
    assert r.spec_source == stores.control.url(f"runs/{RUN_ID}/spec.json")
    assert r.spec == json.loads((home_run / "spec.json").read_text())
    assert resolve_checkpoint(f"{RUN_ID}:1024").path == local[1024]  # an unpublished step: the local copy

    # 1024 published too: newest published is 1024; then promoting 64 makes 64 the default.
    attempt, _ = begin_attempt(stores, RUN_ID, mode="resume", now=T0.replace(hour=5))
    pubs[1024] = publish_checkpoint(stores, run_id=RUN_ID, attempt_id=attempt.attempt_id, checkpoint_dir=local[1024])
    assert resolve_checkpoint(RUN_ID).path == local[1024]
    spec = RunSpec.model_validate(r.spec)
    _promote(stores, spec, attempt.attempt_id, step=64, sha256=pubs[64].sha256, uri=pubs[64].uri)
    r = resolve_checkpoint(RUN_ID)
    assert (r.path, r.origin) == (local[64], "local")
    assert verify_checkpoint(r.path).sha256 == pubs[64].sha256
    assert resolve_checkpoint(f"{RUN_ID}:1024").path == local[1024]


def test_missing_local_copy_is_downloaded_into_the_cache_and_reused(home_run: Path, gradlab_home: Path) -> None:
    originals = {int(p.name.split("-")[0]): p for p in (home_run / "checkpoints").iterdir()}
    saved = gradlab_home.parent / f"{gradlab_home.name}-originals"
    shutil.copytree(home_run / "checkpoints", saved)
    _, pubs = _record(home_run, publish=(64, 1024), promote=64)
    shutil.rmtree(home_run)  # no local run directory at all: spec and checkpoint come from the stores

    r = resolve_checkpoint(RUN_ID)
    cache = gradlab_home / "cache" / "checkpoints" / RUN_ID
    assert (r.path, r.origin) == (cache / originals[64].name, "downloaded")
    manifest = verify_checkpoint(r.path)
    assert (manifest.step, manifest.sha256) == (64, pubs[64].sha256)
    for rel in manifest.files:  # byte-identical to what the learner wrote
        assert (r.path / rel).read_bytes() == (saved / originals[64].name / rel).read_bytes(), rel
    assert RunSpec.model_validate(r.spec).run_id == RUN_ID
    # A second call reuses the verified cached copy.
    assert (resolve_checkpoint(RUN_ID).path, resolve_checkpoint(RUN_ID).origin) == (r.path, "cache")
    r = resolve_checkpoint(f"{RUN_ID}:1024")
    assert (r.path, r.origin) == (cache / originals[1024].name, "downloaded")

    # A cached copy that no longer verifies is replaced by a fresh download.
    (cache / originals[64].name / "policy.safetensors").write_bytes(b"corrupt")
    r = resolve_checkpoint(RUN_ID)
    assert r.origin == "downloaded" and verify_checkpoint(r.path).sha256 == pubs[64].sha256


def test_corrupt_local_copy_falls_back_to_the_published_one(home_run: Path, gradlab_home: Path) -> None:
    local = {int(p.name.split("-")[0]): p for p in (home_run / "checkpoints").iterdir()}
    _, pubs = _record(home_run, publish=(64,), promote=64)
    (local[64] / "policy_spec.json").write_text("{}")
    (local[1024] / "policy_spec.json").write_text("{}")
    r = resolve_checkpoint(RUN_ID)
    assert (r.path, r.origin) == (gradlab_home / "cache" / "checkpoints" / RUN_ID / local[64].name, "downloaded")
    assert verify_checkpoint(r.path).sha256 == pubs[64].sha256
    # Unpublished and corrupt: nothing to fall back on, the error names the file.
    with pytest.raises(IntegrityError, match=r"policy_spec.json: size expected"):
        resolve_checkpoint(f"{RUN_ID}:1024")


def test_a_store_copy_that_fails_verification_is_said_even_when_the_local_copy_verifies(home_run: Path) -> None:
    """``gradlab eval RUN:STEP`` evaluates the verified local copy and says that the model store's copy,
    which evaluations and promotion read, no longer matches its publication receipt."""
    stores, pubs = _record(home_run, publish=(64,))
    key = keys.checkpoint_file(RUN_ID, 64, pubs[64].sha256, "policy_spec.json")
    target = Path(stores.model.url(key).removeprefix("file://"))
    target.chmod(0o600)
    target.write_text("{}")
    notes: list[str] = []
    r = resolve_checkpoint(f"{RUN_ID}:64", warn=notes.append, check_store=True)
    assert r.origin == "local" and verify_checkpoint(r.path).sha256 == pubs[64].sha256
    assert len(notes) == 1 and "published copy of step 64 fails verification" in notes[0]
    assert "policy_spec.json" in notes[0]
    assert resolve_checkpoint(f"{RUN_ID}:64", warn=notes.append).origin == "local" and len(notes) == 1


def test_unknown_run_step_and_unpublished_promotion_are_refused(home_run: Path) -> None:
    with pytest.raises(NotFound, match=r"gradlab-nope: neither a checkpoint directory nor a run \(no file://.*"
                                       r"runs/gradlab-nope/spec.json in the control store"):
        resolve_checkpoint("gradlab-nope")
    stores, pubs = _record(home_run, publish=(64,))
    with pytest.raises(NotFound, match=r"no checkpoint at step 999 \(steps: 64, 1024\)"):
        resolve_checkpoint(f"{RUN_ID}:999")
    with pytest.raises(NotFound, match="STEP must be a non-negative integer, found 'x'"):
        resolve_checkpoint(f"{RUN_ID}:x")
    # A promotion naming a checkpoint that is neither published nor local.
    spec = RunSpec.model_validate_json((home_run / "spec.json").read_bytes())
    _promote(stores, spec, "attempt-001", step=2048, sha256="ab" * 32, uri="file:///nowhere/")
    with pytest.raises(NotFound, match=r"the promoted checkpoint \(step 2048, sha256 abababababababab\) is neither "
                                       r"published"):
        resolve_checkpoint(RUN_ID)


@pytest.mark.slow
def test_eval_cli_evaluates_the_promoted_checkpoint_from_the_stores(home_run: Path, gradlab_home: Path) -> None:
    _, pubs = _record(home_run, publish=(64, 1024), promote=64)
    name = next(p.name for p in (home_run / "checkpoints").iterdir() if p.name.startswith("000000000064-"))
    shutil.rmtree(home_run)
    out = gradlab("eval", RUN_ID, "--json", "--episodes", "4")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert (result["checkpoint_step"], result["checkpoint_sha256"], result["planned"]) == (64, pubs[64].sha256, 4)
    assert verify_checkpoint(gradlab_home / "cache" / "checkpoints" / RUN_ID / name).sha256 == pubs[64].sha256
    out = gradlab("eval", f"{RUN_ID}:1024", "--episodes", "4")
    assert out.returncode == 0, out.stderr
    assert "(downloaded, inline)" in out.stderr and "checkpoint step 1024" in out.stdout
