"""Resume, evaluation and promotion trust only what the publication receipt proves (issue: run integrity).

Every test runs against the file store and moto's S3 server (the ``stores`` fixture). A trained
bandit run (two checkpoints, stopped before its budget) is published once per test, then an
attacker with write access to the model store, or to the run directory, changes bytes.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest

from gradlab import receipts as rules
from gradlab.checkpoints import file_sha256, list_checkpoints
from gradlab.errors import ContractViolation, IntegrityError
from gradlab.receipts import read_index
from gradlab.receipts.lease import read_lease, release_lease
from gradlab.runs import operations
from gradlab.runs.paths import RunPaths
from gradlab.stores import Stores, keys

RUN = "gradlab-20260102T030405-0123abcd"


class _Forged:
    """A pickle that creates ``marker`` when unpickled (what an attacker would put in a store)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


@functools.cache
def _spec():
    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec

    resolved = Experiments().resolve("gradlab__bandit/ppo-sb3", ["train.timesteps=8192"])
    return RunSpec.from_resolved(resolved, seed=0, run_id=RUN)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bandit run directory with checkpoints at 2048 and 4096, stopped before its 8192 budget."""
    from gradlab.learn.learner import run_learner

    run_dir = tmp_path_factory.mktemp("trained") / RUN
    result = run_learner(_spec(), run_dir, stop_at_step=4096, watch_parent=False)
    assert (result.final_step, result.stop_reason) == (4096, "stop_requested")
    return run_dir


def _published(stores: Stores, trained: Path, tmp_path: Path) -> tuple[RunPaths, list]:
    """The trained run copied to this home's run directory, published by attempt-001 (lease released)."""
    from gradlab.settings import load_settings

    run_dir = load_settings().run_dir(RUN)
    shutil.copytree(trained, run_dir)
    paths = RunPaths(run_dir)
    spec = _spec()
    operations.write_local_spec(paths, spec)
    rules.open_run(stores, spec)
    _, held = rules.begin_attempt(stores, RUN, mode="fresh")
    pubs = [rules.publish_checkpoint(stores, run_id=RUN, attempt_id="attempt-001", checkpoint_dir=c)
            for c in list_checkpoints(run_dir)]
    release_lease(stores.control, held)
    return paths, pubs


def _flip(stores: Stores, pub, name: str) -> str:
    """Flip one byte of a published object in the model store; returns its key."""
    data = bytearray(stores.model.get(keys.checkpoint_file(RUN, pub.step, pub.sha256, name)))
    data[len(data) // 2] ^= 0xFF
    return _overwrite(stores, pub, name, bytes(data))


def _rewrite_local(folder: Path, name: str) -> tuple[str, str]:
    """Change a local checkpoint file and rewrite its manifest entry to agree; (old, new) sha256."""
    target = folder / name
    old = file_sha256(target)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": file_sha256(target), "size_bytes": len(data)}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return old, file_sha256(target)


def _overwrite(stores: Stores, pub, name: str, data: bytes) -> str:
    """Replace a published object in the model store (an attacker's write); returns its key."""
    key = keys.checkpoint_file(RUN, pub.step, pub.sha256, name)
    _, etag = stores.model.get_with_etag(key)
    stores.model.put_if_match(key, data, etag)
    return key


def test_forged_pickle_in_the_store_never_executes_and_the_retry_is_refused(stores: Stores, trained: Path,
                                                                          tmp_path: Path) -> None:
    paths, pubs = _published(stores, trained, tmp_path)
    marker = tmp_path / "pwned"
    forged = pickle.dumps(_Forged(marker))
    for pub in pubs:  # every published checkpoint's resume state replaced by a code-running pickle
        _overwrite(stores, pub, "resume/optimizer.pt", forged)
    shutil.rmtree(paths.checkpoints)  # another machine: the checkpoints come from the store
    with pytest.raises(IntegrityError) as caught:
        operations.open_attempt(stores, _spec(), paths)
    message = str(caught.value)
    assert "no published checkpoint verifies" in message
    for pub in pubs:
        key = keys.checkpoint_file(RUN, pub.step, pub.sha256, "resume/optimizer.pt")
        assert f"{stores.model.url(key)}: sha256 expected {pub.files['resume/optimizer.pt'].sha256}" in message
    assert not marker.exists()
    # Refused before an attempt was opened: nothing is left unsealed, the lease stays free.
    assert [a.attempt_id for a in rules.list_attempts(stores, RUN)] == ["attempt-001"]
    assert read_lease(stores.control, RUN).lease.released


def test_corrupt_newest_checkpoint_falls_back_to_the_newest_that_verifies(stores: Stores, trained: Path,
                                                                          tmp_path: Path) -> None:
    paths, pubs = _published(stores, trained, tmp_path)
    newest = pubs[-1]
    key = _flip(stores, newest, "policy.safetensors")
    shutil.rmtree(paths.checkpoints)
    plan = operations.open_attempt(stores, _spec(), paths)
    assert plan.attempt.mode == "resume"
    assert (plan.attempt.resume_from.step, plan.attempt.resume_from.sha256) == (pubs[0].step, pubs[0].sha256)
    assert plan.resume_dir.name.startswith(f"{pubs[0].step:012d}-")
    [note] = plan.attempt.skipped_checkpoints
    assert note.startswith(f"step {newest.step}: {stores.model.url(key)}: sha256 expected")
    stored = [a for a in rules.list_attempts(stores, RUN) if a.attempt_id == plan.attempt.attempt_id]
    assert stored[0].skipped_checkpoints == [note]  # said in the attempt receipt itself
    from gradlab.runs.view import run_view

    assert run_view(stores, RUN)["attempts"][-1]["skipped_checkpoints"] == [note]  # and by `gradlab runs show`


def test_a_rewritten_local_copy_is_replaced_by_the_published_one(stores: Stores, trained: Path,
                                                                 tmp_path: Path) -> None:
    """A run-directory copy whose manifest was rewritten to match changed bytes is not trusted."""
    paths, pubs = _published(stores, trained, tmp_path)
    local = list_checkpoints(paths.root)[-1]
    lanes = local / "resume" / "lanes.json"
    body = json.loads(lanes.read_text())
    body["tamper"] = True
    lanes.write_text(json.dumps(body))
    manifest = json.loads((local / "manifest.json").read_text())
    manifest["files"]["resume/lanes.json"] = {"sha256": file_sha256(lanes), "size_bytes": lanes.stat().st_size}
    (local / "manifest.json").write_text(json.dumps(manifest))
    plan = operations.open_attempt(stores, _spec(), paths)
    assert plan.resume_dir == local and plan.attempt.skipped_checkpoints == []
    assert file_sha256(plan.resume_dir / "resume" / "lanes.json") == pubs[-1].files["resume/lanes.json"].sha256
    assert list(paths.checkpoints.glob(f"{local.name}.corrupt-*"))  # the bad copy kept aside


def test_a_store_copy_changed_after_publication_fails_its_evaluation(stores: Stores, trained: Path,
                                                                   tmp_path: Path) -> None:
    paths, pubs = _published(stores, trained, tmp_path)
    pub = pubs[-1]
    local = operations.local_checkpoint_dir(stores, paths, pub)  # the local copy is intact
    key = _flip(stores, pub, "policy.zip")
    record = operations.evaluate(stores, _spec(), pub, local)
    assert record.status == "failed"
    assert f"{stores.model.url(key)}: sha256 expected {pub.files['policy.zip'].sha256} (publication), found" \
        in record.error
    with pytest.raises(ContractViolation):  # a failed evaluation is never promoted
        operations.promote(stores, RUN, "attempt-002", record, pub)
    assert rules.read_promotion(stores, RUN) is None


def test_promotion_rereads_the_published_objects(stores: Stores, trained: Path, tmp_path: Path) -> None:
    """An accepted checkpoint whose store copy changed between evaluation and promotion is not promoted."""
    from gradlab.receipts.models import EvaluationIntent

    _, pubs = _published(stores, trained, tmp_path)
    pub = pubs[0]
    intent = EvaluationIntent.create(run_id=RUN, checkpoint=pub.ref, goal_contract_sha256=_spec().goal_contract_sha256,
                                     episode_manifest_sha256="m" * 64, backend="local")
    intent, _ = rules.register_evaluation(stores, intent)
    record = rules.record_evaluation(stores, rules.make_evaluation_record(intent, status="accepted", result={"ok": 1}))
    key = _flip(stores, pub, "policy.safetensors")
    with pytest.raises(IntegrityError, match=re.escape(f"{stores.model.url(key)}: sha256 expected "
                                                       f"{pub.files['policy.safetensors'].sha256} (publication)")):
        operations.promote(stores, RUN, "attempt-001", record, pub)
    assert rules.read_promotion(stores, RUN) is None
    assert read_index(stores.model, RUN).promotion is None


def test_eval_of_a_run_refuses_a_local_copy_that_differs_from_the_publication(stores: Stores, trained: Path,
                                                                              tmp_path: Path) -> None:
    from gradlab.checkpoints.resolve import resolve_checkpoint
    from gradlab.settings import load_settings

    paths, pubs = _published(stores, trained, tmp_path)
    local = list_checkpoints(paths.root)[-1]
    old, new = _rewrite_local(local, "policy.safetensors")
    assert old == pubs[-1].files["policy.safetensors"].sha256
    with pytest.raises(IntegrityError, match=re.escape(f"{local / 'policy.safetensors'}: sha256 expected {old} "
                                                       f"(publication), found {new}")):
        resolve_checkpoint(f"{RUN}:{pubs[-1].step}", settings=load_settings(), stores=stores)
    with pytest.raises(IntegrityError, match=re.escape(f"{local / 'policy.safetensors'}: sha256 expected {old} "
                                                       f"(publication), found {new}")):
        resolve_checkpoint(str(local), settings=load_settings(), stores=stores)  # named by its folder
    assert resolve_checkpoint(f"{RUN}:{pubs[0].step}", settings=load_settings(), stores=stores).origin == "local"


class _Pending:
    """A future that never finishes (the evaluation in flight)."""

    def done(self) -> bool:
        return False

    def result(self):
        raise AssertionError("never collected")


def test_a_checkpoint_that_fails_verification_when_its_evaluation_starts_is_passed_over(
        stores: Stores, trained: Path, tmp_path: Path) -> None:
    """Both copies of the newest checkpoint corrupted after the attempt opened: the supervisor finds
    no verified copy to evaluate, marks it not usable (never evaluated, never promoted) and goes on."""
    from gradlab.outbox import Outbox
    from gradlab.runs.supervisor import Supervisor

    paths, pubs = _published(stores, trained, tmp_path)
    newest = pubs[-1]
    key = _flip(stores, newest, "policy.safetensors")
    local = paths.checkpoints / keys.checkpoint_name(newest.step, newest.sha256) / "policy.safetensors"
    local.write_bytes(local.read_bytes()[:-1])
    submitted = []

    def submit_evaluate(track):
        operations.local_checkpoint_dir(stores, paths, track.publication)  # what the flow does first
        submitted.append(track.step)
        return _Pending()

    sup = Supervisor(spec=_spec(), attempt_id="attempt-002", outbox=Outbox(paths.outbox),
                     submit_publish=lambda t: _Pending(), submit_evaluate=submit_evaluate, sinks=[],
                     max_parallel_evals=2,
                     on_unusable=lambda t, why: operations.record_unusable(stores, _spec(), t.publication, why))
    sup.adopt_published(pubs, {})
    sup.advance()  # does not raise
    assert submitted == [pubs[0].step]
    track = sup.tracks[newest.step]
    assert track.unusable.startswith(f"step {newest.step}: {stores.model.url(key)}: sha256 expected")
    assert track.evaluation_done and not track.accepted and sup.promotion_candidate() is None
    # Recorded as a failed evaluation that never ran: the receipt's inventory names it.
    [(_, record)] = [(i, r) for i, r in rules.list_evaluations(stores, RUN) if i.checkpoint_sha256 == newest.sha256]
    assert record.status == "failed" and track.evaluation == record
    assert record.error.startswith("IntegrityError: not evaluated: the checkpoint fails verification")
    assert {e.checkpoint_step: e.status for e in operations.inventory(stores, RUN)[1]}[newest.step] == "failed"
    assert list(paths.checkpoints.glob("*.corrupt-*"))  # the bad local copy kept aside as evidence
    assert stores.model.exists(key)
