"""run_evaluation over real checkpoints (weights-only load) and the local backend."""

from __future__ import annotations

import json
import shutil

import pytest

from gradlab.contracts.hashing import canonical_json
from gradlab.errors import ContractViolation, IntegrityError
from gradlab.evaluation import EvalRequest, run_evaluation, validate_result
from gradlab.evaluation.backends import LocalBackend, evaluate_with


def _request(run_dir, ckpt, **kw) -> EvalRequest:
    manifest = json.loads((ckpt / "manifest.json").read_text())
    return EvalRequest(checkpoint_dir=str(ckpt), checkpoint_sha256=manifest["sha256"], checkpoint_step=manifest["step"],
                       spec=json.loads((run_dir / "spec.json").read_text()), **kw)


def test_same_checkpoint_twice_gives_byte_identical_rows(bandit_run):
    run_dir, (ckpt, _) = bandit_run
    a = run_evaluation(_request(run_dir, ckpt))
    b = run_evaluation(_request(run_dir, ckpt).as_json())
    assert canonical_json([r.as_json() for r in a.episodes]) == canonical_json([r.as_json() for r in b.episodes])
    assert a.hashes == b.hashes and a.aggregates == b.aggregates
    assert (a.planned, a.completed, a.checkpoint_step) == (100, 100, 64)
    assert a.verdict == "rejected"  # an untrained policy picks the right arm far below 95% of the time
    assert a.aggregates["eval/outcome/success/rate"] < 0.95
    spec = json.loads((run_dir / "spec.json").read_text())
    from gradlab.contracts.goal import Goal

    goal = Goal.model_validate(spec["goal"])
    validate_result(a.as_json(), goal=goal, expected={
        "checkpoint_sha256": a.checkpoint_sha256, "goal_contract_sha256": spec["goal_contract_sha256"],
        "recipe_sha256": spec["recipe_sha256"], "environment_sha256": spec["environment_sha256"]})


def test_stochastic_override_is_reproducible_and_differs_from_deterministic(bandit_run):
    run_dir, (ckpt, _) = bandit_run
    det = run_evaluation(_request(run_dir, ckpt, episodes=3))
    sto1 = run_evaluation(_request(run_dir, ckpt, episodes=3, policy="stochastic"))
    sto2 = run_evaluation(_request(run_dir, ckpt, episodes=3, policy="stochastic"))
    assert sto1.policy == "stochastic" and det.policy == "deterministic"
    assert [r.as_json() for r in sto1.episodes] == [r.as_json() for r in sto2.episodes]
    assert det.planned == 3 and len(det.episodes) == 3


def test_tampered_checkpoint_and_wrong_hash_are_refused(bandit_run, tmp_path):
    run_dir, (ckpt, _) = bandit_run
    with pytest.raises(IntegrityError, match="sha256 expected"):
        run_evaluation(_request(run_dir, ckpt).model_copy(update={"checkpoint_sha256": "0" * 64}))
    copy = tmp_path / ckpt.name
    shutil.copytree(ckpt, copy)
    with (copy / "policy.safetensors").open("ab") as f:
        f.write(b"\0")
    with pytest.raises(IntegrityError, match="policy.safetensors"):
        run_evaluation(_request(run_dir, copy))
    spec = json.loads((run_dir / "spec.json").read_text())
    spec["environment_sha256"] = "1" * 64
    with pytest.raises(ContractViolation, match="environment_sha256"):
        run_evaluation(_request(run_dir, ckpt).model_copy(update={"spec": spec}))


@pytest.mark.slow
def test_local_backend_runs_two_evaluations_and_cancels(bandit_run):
    run_dir, (c1, c2) = bandit_run
    backend = LocalBackend(max_workers=2)
    try:
        h1 = backend.submit(_request(run_dir, c1))
        h2 = backend.submit(_request(run_dir, c2))
        h3 = backend.submit(_request(run_dir, c2))
        assert backend.cancel(h3) is True  # still queued: both workers are busy
        results = {}
        import time

        deadline = time.monotonic() + 120
        while len(results) < 2 and time.monotonic() < deadline:
            for h in (h1, h2):
                if h.id not in results:
                    r = backend.poll(h)
                    if r is not None:
                        results[h.id] = r
            time.sleep(0.1)
        assert results[h1.id].checkpoint_step == 64 and results[h2.id].checkpoint_step == 1024
        trained = results[h2.id]
        assert trained.verdict == "accepted" and trained.aggregates["eval/outcome/success/rate"] == 1.0
        assert trained.aggregates["eval/episode/return/mean"] == 1.0 and trained.aggregates["eval/episode/length/mean"] == 1.0
        in_process = run_evaluation(_request(run_dir, c1))
        assert [r.as_json() for r in results[h1.id].episodes] == [r.as_json() for r in in_process.episodes]
        with pytest.raises(IntegrityError, match="sha256 expected"):
            evaluate_with(backend, _request(run_dir, c1).model_copy(update={"checkpoint_sha256": "0" * 64}))
    finally:
        backend.close()


@pytest.mark.slow
def test_a_local_evaluation_is_collected_when_its_worker_answers_not_at_the_next_poll(bandit_run):
    """``evaluate_with`` waits on the local worker's pipe (``LocalBackend.wait``): with a poll interval
    far longer than the evaluation, the result still comes as soon as the worker sends it."""
    import time

    run_dir, (_, c2) = bandit_run
    backend = LocalBackend(max_workers=1)
    try:
        started = time.monotonic()
        result = evaluate_with(backend, _request(run_dir, c2), poll_interval_s=300.0)
        elapsed = time.monotonic() - started
    finally:
        backend.close()
    assert result.checkpoint_step == 1024 and result.verdict == "accepted"
    assert elapsed < 120.0  # a spawned worker imports torch (seconds); the next poll would be at 300 s
