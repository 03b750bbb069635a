"""Receipt rules over both store backends: leases, promotion, evaluation intents, terminal receipts."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gradlab.errors import Conflict, ContractViolation, IntegrityError
from gradlab.receipts import (
    CheckpointRef,
    EvaluationIntent,
    IndexEntry,
    LearnerExit,
    LeaseHeld,
    LeaseLost,
    Promotion,
    StopRequest,
    TerminalMetrics,
    TerminalReceipt,
    acquire_lease,
    begin_attempt,
    download_checkpoint,
    evaluation_intent_key,
    list_attempts,
    list_runs,
    make_evaluation_record,
    open_run,
    publish_checkpoint,
    read_index,
    read_lease,
    read_promotion,
    read_run_spec,
    read_terminal,
    reconcile_run,
    record_evaluation,
    register_evaluation,
    release_lease,
    renew_lease,
    request_stop,
    run_inventory,
    seal_terminal,
    update_index,
    with_checkpoint,
    write_promotion,
)
from gradlab.stores import Stores, keys, open_store
from tests.concurrency import race
from tests.s3server import s3_server  # noqa: F401 (pytest fixture)

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
RUN = "gradlab-20260102T030405-0123abcd"


def _spec(seed: int = 0):
    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec

    return RunSpec.from_resolved(Experiments().resolve("gradlab__bandit/ppo"), seed=seed, run_id=RUN)


def _checkpoint_dir(root: Path, step: int, policy: bytes) -> Path:
    sha = hashlib.sha256(policy).hexdigest()
    folder = root / f"{step:012d}-{sha[:16]}"
    (folder / "resume").mkdir(parents=True)
    (folder / "policy.zip").write_bytes(policy)
    (folder / "resume" / "state.bin").write_bytes(b"state-%d" % step)
    files = {
        name: {"sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest(),
               "size_bytes": (folder / name).stat().st_size}
        for name in ("policy.zip", "resume/state.bin")
    }
    manifest = {"run_id": RUN, "step": step, "purpose": "periodic", "sha256": sha, "files": files}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_open_run_is_idempotent(stores: Stores) -> None:
    spec = _spec()
    first = open_run(stores, spec, now=T0)
    again = open_run(stores, spec, now=T0 + timedelta(hours=1))
    assert again == first and again.created_at == T0
    assert first.display_name == f"gradlab__bandit__ppo__s0__{RUN[-8:]}"
    assert read_run_spec(stores, RUN)["run_id"] == RUN
    assert list_runs(stores) == [RUN]
    with pytest.raises(Conflict):
        open_run(stores, _spec(seed=1))


def test_lease_refused_while_live_taken_after_expiry(stores: Stores) -> None:
    a = acquire_lease(stores.control, RUN, "attempt-001", ttl_s=30, now=T0)
    assert (a.lease.generation, a.lease.expires_at) == (1, T0 + timedelta(seconds=30))
    with pytest.raises(LeaseHeld, match="leased by attempt-001"):
        acquire_lease(stores.control, RUN, "attempt-002", ttl_s=30, now=T0 + timedelta(seconds=10))
    a = renew_lease(stores.control, a, now=T0 + timedelta(seconds=20))
    assert a.lease.expires_at == T0 + timedelta(seconds=50)
    with pytest.raises(LeaseHeld):
        acquire_lease(stores.control, RUN, "attempt-002", ttl_s=30, now=T0 + timedelta(seconds=49))
    b = acquire_lease(stores.control, RUN, "attempt-002", ttl_s=30, now=T0 + timedelta(seconds=51))
    assert (b.lease.holder, b.lease.generation) == ("attempt-002", 2)
    with pytest.raises(LeaseLost, match="found holder attempt-002 generation 2"):
        renew_lease(stores.control, a, now=T0 + timedelta(seconds=52))
    b = release_lease(stores.control, b, now=T0 + timedelta(seconds=53))
    assert b.lease.released and not b.lease.is_live(T0 + timedelta(seconds=53))
    c = acquire_lease(stores.control, RUN, "attempt-003", ttl_s=30, now=T0 + timedelta(seconds=54))
    assert c.lease.generation == 3
    assert read_lease(stores.control, RUN).lease == c.lease


def test_racing_acquirers_one_holder(stores: Stores) -> None:
    acquire_lease(stores.control, RUN, "attempt-001", ttl_s=1, now=T0)
    later = T0 + timedelta(seconds=5)
    results = race(6, lambda i: acquire_lease(stores.control, RUN, f"attempt-{i + 2:03d}", ttl_s=30, now=later))
    winners = [r for r in results if not isinstance(r, Exception)]
    assert len(winners) == 1
    assert all(isinstance(r, LeaseHeld) for r in results if isinstance(r, Exception))
    assert read_lease(stores.control, RUN).lease == winners[0].lease
    assert winners[0].lease.generation == 2


def test_begin_attempt_numbers_and_refuses_while_live(stores: Stores) -> None:
    open_run(stores, _spec(), now=T0)
    first, held = begin_attempt(stores, RUN, mode="fresh", ttl_s=30, now=T0)
    assert (first.attempt_id, first.number, held.lease.holder) == ("attempt-001", 1, "attempt-001")
    with pytest.raises(LeaseHeld):
        begin_attempt(stores, RUN, mode="resume", ttl_s=30, now=T0 + timedelta(seconds=5))
    ref = CheckpointRef(step=100, sha256="ab" * 32, uri="file:///x/")
    second, _ = begin_attempt(stores, RUN, mode="resume", resume_from=ref, ttl_s=30, now=T0 + timedelta(seconds=31))
    assert (second.attempt_id, second.previous_attempt_id, second.resume_from) == ("attempt-002", "attempt-001", ref)
    assert [a.attempt_id for a in list_attempts(stores, RUN)] == ["attempt-001", "attempt-002"]


def test_publish_checkpoint_verifies_uploads_and_indexes(stores: Stores, tmp_path: Path) -> None:
    folder = _checkpoint_dir(tmp_path, 100, b"policy-bytes-100")
    sha = hashlib.sha256(b"policy-bytes-100").hexdigest()
    pub = publish_checkpoint(stores, run_id=RUN, attempt_id="attempt-001", checkpoint_dir=folder, now=T0)
    prefix = f"runs/{RUN}/checkpoints/000000000100-{sha[:16]}/"
    assert stores.model.list(prefix) == [prefix + n for n in ("manifest.json", "policy.zip", "resume/state.bin")]
    assert stores.model.get(prefix + "policy.zip") == b"policy-bytes-100"
    assert pub.uri == stores.model.url(prefix.rstrip("/")) + "/"
    assert pub.files["resume/state.bin"].size_bytes == len(b"state-100")
    index = read_index(stores.model, RUN)
    assert (index.version, [(e.step, e.sha256) for e in index.checkpoints]) == (1, [(100, sha)])
    # A retried publication (another attempt, later) agrees with the first and changes nothing.
    again = publish_checkpoint(stores, run_id=RUN, attempt_id="attempt-002", checkpoint_dir=folder, now=T0 + timedelta(1))
    assert again == pub
    assert read_index(stores.model, RUN).version == 1
    # A corrupted file is refused before anything is uploaded, naming the file.
    bad = _checkpoint_dir(tmp_path / "bad", 200, b"policy-bytes-200")
    (bad / "resume" / "state.bin").write_bytes(b"flipped")
    with pytest.raises(IntegrityError, match="state.bin: sha256 expected"):
        publish_checkpoint(stores, run_id=RUN, attempt_id="attempt-001", checkpoint_dir=bad)
    with pytest.raises(ContractViolation, match="run_id: expected other-run"):
        publish_checkpoint(stores, run_id="other-run", attempt_id="attempt-001", checkpoint_dir=folder)
    # A manifest that is not one, or names another policy than the folder's, is refused by name.
    odd = _checkpoint_dir(tmp_path / "odd", 300, b"policy-bytes-300")
    manifest = json.loads((odd / "manifest.json").read_text())
    for text, match in ((b'{"run_id": "' + RUN.encode() + b'", "st', "not a checkpoint manifest \\(invalid JSON"),
                        (json.dumps({**manifest, "step": "300"}).encode(), "expected step \\(an integer >= 0\\)"),
                        (json.dumps({k: v for k, v in manifest.items() if k != "sha256"}).encode(), "found step 300, sha256 None"),
                        (json.dumps({**manifest, "sha256": "0" * 64}).encode(), "sha256 0000.* is not its policy.zip's")):
        (odd / "manifest.json").write_bytes(text)
        with pytest.raises(IntegrityError, match=match):
            publish_checkpoint(stores, run_id=RUN, attempt_id="attempt-001", checkpoint_dir=odd)
    assert not stores.model.list(f"runs/{RUN}/checkpoints/000000000300-")  # nothing uploaded



def test_the_lease_holder_replaces_an_unfinished_upload_of_the_same_checkpoint_but_never_a_published_one(
        stores: Stores, tmp_path: Path) -> None:
    open_run(stores, _spec(), now=T0)
    begin_attempt(stores, RUN, mode="fresh", ttl_s=30, now=T0)
    # Attempt 1 uploaded its manifest, then lost the lease before the rest and before its receipt.
    first = _checkpoint_dir(tmp_path / "a", 100, b"same-policy")
    prefix = f"runs/{RUN}/checkpoints/{first.name}/"
    stores.model.put_verified(prefix + "manifest.json", (first / "manifest.json").read_bytes())
    begin_attempt(stores, RUN, mode="fresh", ttl_s=30, now=T0 + timedelta(seconds=31))
    # Attempt 2 trains the same policy to the same step; its resume state (so its manifest) differs.
    second = _checkpoint_dir(tmp_path / "b", 100, b"same-policy")
    (second / "resume" / "state.bin").write_bytes(b"other-state")
    manifest = json.loads((second / "manifest.json").read_text())
    manifest["files"]["resume/state.bin"] = {"sha256": hashlib.sha256(b"other-state").hexdigest(), "size_bytes": 11}
    (second / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(Conflict, match="manifest.json: create-only write refused"):  # no epoch: no replacing
        publish_checkpoint(stores, run_id=RUN, attempt_id="attempt-002", checkpoint_dir=second)
    with pytest.raises(LeaseLost, match="write for attempt-001 epoch 1 refused"):
        publish_checkpoint(stores, run_id=RUN, attempt_id="attempt-001", checkpoint_dir=first, epoch=1)
    pub = publish_checkpoint(stores, run_id=RUN, attempt_id="attempt-002", checkpoint_dir=second, epoch=2)
    assert (pub.attempt_id, pub.epoch) == ("attempt-002", 2)
    for name in ("manifest.json", "policy.zip", "resume/state.bin"):
        assert stores.model.get(prefix + name) == (second / name).read_bytes(), name
        assert pub.files[name].sha256 == hashlib.sha256((second / name).read_bytes()).hexdigest()
    # Once a receipt names the objects they are immutable, even for the lease holder.
    with pytest.raises(Conflict, match="create-only write refused"):
        publish_checkpoint(stores, run_id=RUN, attempt_id="attempt-002", checkpoint_dir=first, epoch=2)
    assert stores.model.get(prefix + "manifest.json") == (second / "manifest.json").read_bytes()

def test_index_updates_racing_lose_nothing(stores: Stores) -> None:
    def add(i: int):
        entry = IndexEntry(step=100 * (i + 1), sha256=f"{i:064x}", uri=f"file:///c/{i}/", purpose="periodic")
        return update_index(stores.model, RUN, lambda index: with_checkpoint(index, entry))

    race(8, add)
    index = read_index(stores.model, RUN)
    assert [e.step for e in index.checkpoints] == [100, 200, 300, 400, 500, 600, 700, 800]
    assert index.version == 8


def test_evaluation_intent_key_is_content_hash() -> None:
    # Canonical JSON of the four identities, sorted keys, compact: hand-written here.
    text = '{"checkpoint_sha256":"c","episode_manifest_sha256":"m","goal_contract_sha256":"g","run_id":"r"}'
    assert evaluation_intent_key("r", "c", "g", "m") == hashlib.sha256(text.encode()).hexdigest()
    assert evaluation_intent_key("r", "c", "g", "m") != evaluation_intent_key("r", "c2", "g", "m")
    with pytest.raises(ValueError, match="content key"):
        EvaluationIntent(key="0" * 64, run_id="r", checkpoint_step=1, checkpoint_sha256="c", checkpoint_uri="u",
                         goal_contract_sha256="g", episode_manifest_sha256="m", backend="local", created_at=T0)


def test_retried_evaluation_never_evaluates_twice(stores: Stores) -> None:
    ref = CheckpointRef(step=100, sha256="ab" * 32, uri="file:///c/")
    intent = EvaluationIntent.create(run_id=RUN, checkpoint=ref, goal_contract_sha256="g" * 64,
                                     episode_manifest_sha256="m" * 64, backend="local", now=T0)
    stored, result = register_evaluation(stores, intent)
    assert (stored, result) == (intent, None)
    result_json = {"checkpoint_sha256": ref.sha256, "verdict": "accepted", "aggregates": {"eval/return_mean": 1.0}}
    record = record_evaluation(stores, make_evaluation_record(intent, status="accepted", result=result_json,
                                                              return_mean=1.0, now=T0))
    # The retry (a later intent object with a new timestamp) finds the same key and its result.
    retry = EvaluationIntent.create(run_id=RUN, checkpoint=ref, goal_contract_sha256="g" * 64,
                                    episode_manifest_sha256="m" * 64, backend="local", now=T0 + timedelta(1))
    stored2, found = register_evaluation(stores, retry)
    assert stored2 == intent and found == record
    again = record_evaluation(stores, make_evaluation_record(intent, status="accepted", result=result_json,
                                                             return_mean=1.0, now=T0 + timedelta(1)))
    assert again.recorded_at == T0
    with pytest.raises(Conflict):
        record_evaluation(stores, make_evaluation_record(intent, status="rejected", result={**result_json,
                                                                                           "verdict": "rejected"}))
    assert len(stores.eval.list(f"runs/{RUN}/evaluations/")) == 2


def _promotion(step: int, attempt: str = "attempt-001", at: datetime = T0) -> Promotion:
    return Promotion(run_id=RUN, attempt_id=attempt, checkpoint_step=step, checkpoint_sha256=f"{step:064x}",
                     uri=f"file:///c/{step}/", evaluation_key="k" * 64, result_uri="file:///r", return_mean=1.0,
                     promoted_at=at)


def test_two_promoters_racing_one_promotion(stores: Stores) -> None:
    results = race(2, lambda i: write_promotion(stores, _promotion(100 * (i + 1), attempt=f"attempt-00{i + 1}")))
    won = [r for r in results if isinstance(r, Promotion)]
    lost = [r for r in results if isinstance(r, Conflict)]
    assert len(won) == 1 and len(lost) == 1
    assert stores.control.list(f"runs/{RUN}/promotion") == [f"runs/{RUN}/promotion.json"]
    assert read_promotion(stores, RUN) == won[0]
    assert read_index(stores.model, RUN).promotion == won[0].ref
    # A second promoter that names the same checkpoint agrees and gets the first receipt back.
    same = write_promotion(stores, _promotion(won[0].checkpoint_step, attempt="attempt-009", at=T0 + timedelta(1)))
    assert same == won[0] and same.promoted_at == T0


def test_first_stop_request_wins(stores: Stores) -> None:
    first = request_stop(stores, StopRequest(run_id=RUN, reason="accepted:100", checkpoint_step=100, requested_at=T0))
    second = request_stop(stores, StopRequest(run_id=RUN, reason="user", requested_at=T0 + timedelta(1)))
    assert second == first and second.reason == "accepted:100"


def _receipt(outcome: str = "succeeded", at: datetime = T0) -> TerminalReceipt:
    return TerminalReceipt(
        run_id=RUN, attempt_id="attempt-001", goal_id="gradlab__bandit", recipe_id="ppo", seed=0, outcome=outcome,
        reason="accepted", final_step=200, checkpoints=[{"step": 100, "sha256": "a" * 64, "uri": "file:///c/"}],
        evaluations=[{"checkpoint_step": 100, "status": "accepted", "result_uri": "file:///r", "return_mean": 1.0}],
        promotion={"checkpoint_step": 100, "sha256": "a" * 64, "uri": "file:///c/"},
        metrics=TerminalMetrics(local_high_water=7, sinks={"journal": 7, "wandb": None}), drained=True,
        learner=LearnerExit(exit_code=0, stop_reason="stop_requested"), sealed_at=at,
    )


def test_terminal_receipt_shape_and_create_only(stores: Stores) -> None:
    receipt = seal_terminal(stores, _receipt())
    doc = json.loads(stores.control.get(keys.terminal(RUN, "attempt-001")))
    assert set(doc) == {"run_id", "attempt_id", "goal_id", "recipe_id", "seed", "outcome", "reason", "final_step",
                        "checkpoints", "evaluations", "promotion", "metrics", "drained", "learner", "epoch",
                        "superseded_by", "sealed_at"}
    assert doc["checkpoints"] == [{"step": 100, "sha256": "a" * 64, "uri": "file:///c/"}]
    assert doc["evaluations"][0] == {"checkpoint_step": 100, "status": "accepted", "result_uri": "file:///r",
                                     "return_mean": 1.0}
    assert doc["metrics"] == {"local_high_water": 7, "sinks": {"journal": 7, "wandb": None}, "pending": [], "objective": None}
    assert doc["learner"] == {"exit_code": 0, "stop_reason": "stop_requested"}
    assert doc["sealed_at"] == "2026-01-02T03:04:05Z"
    assert seal_terminal(stores, _receipt(at=T0 + timedelta(1))) == receipt  # a retried seal agrees
    with pytest.raises(Conflict) as conflict:
        seal_terminal(stores, _receipt(outcome="failed"))
    # Only what differs, in one readable line (sealed_at differs too; the inventories are not repeated).
    message = str(conflict.value)
    assert message.endswith('terminal receipt already exists and disagrees: outcome: "succeeded" → "failed"')
    assert read_terminal(stores, RUN, "attempt-001") == receipt


def test_reconcile_closes_attempts_whose_lease_expired(stores: Stores, tmp_path: Path) -> None:
    open_run(stores, _spec(), now=T0)
    begin_attempt(stores, RUN, mode="fresh", ttl_s=30, now=T0)
    publish_checkpoint(stores, run_id=RUN, attempt_id="attempt-001",
                       checkpoint_dir=_checkpoint_dir(tmp_path, 100, b"p100"), now=T0)
    assert reconcile_run(stores, RUN, now=T0 + timedelta(seconds=10)) == []  # lease still live
    [closed] = reconcile_run(stores, RUN, now=T0 + timedelta(seconds=31))
    assert (closed.outcome, closed.final_step, closed.drained) == ("failed", 100, False)
    assert closed.reason.startswith("reconciled: attempt ended without sealing")
    assert [c.step for c in closed.checkpoints] == [100]
    assert reconcile_run(stores, RUN, now=T0 + timedelta(seconds=40)) == []  # nothing left to close
    checkpoints, evaluations, promotion = run_inventory(stores, RUN)
    assert ([c.step for c in checkpoints], evaluations, promotion) == ([100], [], None)


def test_learner_checkpoint_publishes_and_downloads_verified(stores: Stores, tmp_path: Path) -> None:
    from gradlab.checkpoints import verify_checkpoint, write_checkpoint

    def files(folder: Path) -> None:
        (folder / "policy.zip").write_bytes(b"zip-bytes")
        (folder / "resume").mkdir()
        (folder / "resume" / "state.json").write_text('{"num_timesteps": 256}')

    folder, manifest = write_checkpoint(
        tmp_path / "run" / "checkpoints", step=256, write_files=files,
        manifest_fields={"run_id": RUN, "purpose": "final", "goal_contract_sha256": "g" * 64,
                         "recipe_sha256": "r" * 64, "environment_sha256": "e" * 64, "backend_id": "sb3.ppo",
                         "backend_config_sha256": "b" * 64, "versions": {}},
    )
    pub = publish_checkpoint(stores, run_id=RUN, attempt_id="attempt-001", checkpoint_dir=folder, now=T0)
    assert (pub.step, pub.sha256, pub.purpose) == (256, hashlib.sha256(b"zip-bytes").hexdigest(), "final")
    assert sorted(pub.files) == ["manifest.json", "policy.zip", "resume/state.json"]
    copy = download_checkpoint(stores, pub, tmp_path / "downloaded" / folder.name)
    assert verify_checkpoint(copy) == manifest
    with pytest.raises(Conflict, match="exists already"):
        download_checkpoint(stores, pub, copy)
    (folder / "stray.bin").write_bytes(b"x")
    with pytest.raises(IntegrityError, match="not listed in manifest.json: stray.bin"):
        publish_checkpoint(stores, run_id=RUN, attempt_id="attempt-001", checkpoint_dir=folder)


def test_an_s3_outage_in_renewal_promotion_and_sealing_is_transient_and_the_retry_agrees(s3_server, tmp_path: Path) -> None:  # noqa: F811
    """While the S3 endpoint is down, renewing the lease, promoting and sealing fail *transiently*
    (``StoreUnavailable``: what the tasks retry; never ``LeaseLost`` or ``Conflict``); once it is back
    the retried call succeeds, the lease is still this attempt's, and a retry after a write that
    landed agrees with it instead of writing twice. (How long the flow keeps retrying is the task
    policy's; an outage longer than that fails the attempt, and the next attempt reconciles.)"""
    from gradlab.errors import StoreUnavailable

    stores = Stores(*(open_store(s3_server.url(name)) for name in ("control", "eval", "model")))
    open_run(stores, _spec())
    attempt, held = begin_attempt(stores, RUN, mode="fresh")
    promotion, receipt = _promotion(100), _receipt()

    s3_server.stop()
    for call in (lambda: renew_lease(stores.control, held), lambda: write_promotion(stores, promotion),
                 lambda: seal_terminal(stores, receipt)):
        with pytest.raises(StoreUnavailable, match=f"cannot reach {s3_server.endpoint_url}"):
            call()
    s3_server.restart()

    renewed = renew_lease(stores.control, held)
    assert (renewed.lease.holder, renewed.lease.generation) == (attempt.attempt_id, held.lease.generation)
    assert renewed.lease.expires_at > held.lease.expires_at
    assert write_promotion(stores, promotion) == promotion
    assert write_promotion(stores, promotion) == promotion  # the retry of a write that landed agrees
    assert seal_terminal(stores, receipt) == receipt
    assert seal_terminal(stores, _receipt(at=T0 + timedelta(seconds=5))) == receipt
    assert read_terminal(stores, RUN, "attempt-001") == receipt and read_promotion(stores, RUN) == promotion
    assert release_lease(stores.control, renewed).lease.released
