"""The Modal backend: real JSON payloads through the real function body; the SDK replaced at the boundary.

Modal cannot be reached from here: ``FakeModal`` stands in for the SDK client and runs the deployed
function's own code (``evaluate.local``) on the JSON-round-tripped payload.
"""

from __future__ import annotations

import importlib.util
import json
import time
import warnings
from pathlib import Path

import pytest

from gradlab.errors import ConfigError, ContractViolation, IntegrityError, NotFound
from gradlab.evaluation import EvalRequest, run_evaluation
from gradlab.evaluation.backends import BackendUnavailable, EvaluationFailed, evaluate_with, get_backend
from gradlab.evaluation.modal import ModalBackend, SdkModalClient, build_modal_payload

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def modal_app():
    spec = importlib.util.spec_from_file_location("gradlab_modal_app", REPO / "deployments/modal/app.py")
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec.loader.exec_module(module)
    return module


def _request(run_dir, ckpt, **kw) -> EvalRequest:
    manifest = json.loads((ckpt / "manifest.json").read_text())
    return EvalRequest(checkpoint_dir=str(ckpt), checkpoint_sha256=manifest["sha256"], checkpoint_step=manifest["step"],
                       spec=json.loads((run_dir / "spec.json").read_text()), **kw)


class FakeModal:
    """A ModalClient that runs the app's function body locally; answers after ``polls_until_done`` gets."""

    def __init__(self, app_module, *, polls_until_done: int = 1, mutate=None, fail_with: BaseException | None = None):
        self.app = app_module
        self.calls: dict[str, dict] = {}
        self.polls: dict[str, int] = {}
        self.polls_until_done = polls_until_done
        self.mutate = mutate
        self.fail_with = fail_with
        self.cancelled: list[str] = []

    def spawn(self, payload):
        if self.fail_with is not None:
            raise self.fail_with
        wire = json.loads(json.dumps(payload))  # what crosses the network is JSON
        call_id = f"fc-{len(self.calls) + 1}"
        self.calls[call_id] = wire
        self.polls[call_id] = 0
        return call_id

    def get(self, call_id):
        self.polls[call_id] += 1
        if self.polls[call_id] < self.polls_until_done:
            raise TimeoutError
        result = json.loads(json.dumps(self.app.evaluate.local(self.calls[call_id])))
        return self.mutate(result) if self.mutate else result

    def cancel(self, call_id):
        self.cancelled.append(call_id)


def test_payload_is_json_with_weights_only_files_and_no_credentials(bandit_run, monkeypatch):
    run_dir, (ckpt, _) = bandit_run
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "not-to-be-sent")
    payload = build_modal_payload(_request(run_dir, ckpt))
    assert payload["format"] == "gradlab.eval-payload/1"
    assert sorted(payload["files"]) == ["manifest.json", "policy.safetensors", "policy_spec.json"]
    assert payload["request"]["verify"] == "weights_only" and payload["request"]["checkpoint_dir"] == ckpt.name
    text = json.dumps(payload)
    assert "not-to-be-sent" not in text and "policy.zip\"" not in json.dumps(sorted(payload["files"]))


def test_modal_round_trip_equals_local_result(bandit_run, modal_app):
    run_dir, (_, ckpt) = bandit_run
    fake = FakeModal(modal_app, polls_until_done=3)
    backend = ModalBackend(client=fake)
    handle = backend.submit(_request(run_dir, ckpt))
    assert handle.backend == "modal" and handle.id == "fc-1"
    assert backend.poll(handle) is None and backend.poll(handle) is None
    remote = backend.poll(handle)
    local = run_evaluation(_request(run_dir, ckpt))
    assert [r.as_json() for r in remote.episodes] == [r.as_json() for r in local.episodes]
    assert remote.aggregates == local.aggregates and remote.hashes == local.hashes
    assert remote.verdict == "accepted" and remote.checkpoint_step == 1024


def test_modal_malformed_or_foreign_result_is_refused(bandit_run, modal_app):
    run_dir, (ckpt, _) = bandit_run

    def drop_verdict(result):
        del result["verdict"]
        return result

    with pytest.raises(ContractViolation, match="malformed result: verdict"):
        evaluate_with(ModalBackend(client=FakeModal(modal_app, mutate=drop_verdict)), _request(run_dir, ckpt))
    with pytest.raises(ContractViolation, match="expected a JSON object, found str"):
        evaluate_with(ModalBackend(client=FakeModal(modal_app, mutate=lambda r: "oops")), _request(run_dir, ckpt))

    def other_checkpoint(result):
        result["checkpoint_sha256"] = "f" * 64
        return result

    with pytest.raises(ContractViolation, match="requested"):
        evaluate_with(ModalBackend(client=FakeModal(modal_app, mutate=other_checkpoint)), _request(run_dir, ckpt))


def test_modal_remote_errors_surface(bandit_run, modal_app):
    run_dir, (ckpt, _) = bandit_run
    bad = _request(run_dir, ckpt).model_copy(update={"checkpoint_sha256": "0" * 64})
    with pytest.raises(IntegrityError, match="sha256 expected 0000"):
        evaluate_with(ModalBackend(client=FakeModal(modal_app)), bad)
    with pytest.raises(BackendUnavailable, match="spawn failed: ConnectionError"):
        ModalBackend(client=FakeModal(modal_app, fail_with=ConnectionError("no route"))).submit(_request(run_dir, ckpt))
    with pytest.raises(EvaluationFailed, match="RuntimeError: boom"):
        ModalBackend(client=FakeModal(modal_app, fail_with=RuntimeError("boom"))).submit(_request(run_dir, ckpt))
    with pytest.raises(NotFound, match="missing/manifest.json"):
        ModalBackend(client=FakeModal(modal_app)).submit(
            _request(run_dir, ckpt).model_copy(update={"checkpoint_dir": str(ckpt.parent / "missing")}))


def test_modal_hanging_client_times_out(bandit_run, modal_app):
    run_dir, (ckpt, _) = bandit_run

    class Hanging(FakeModal):
        def spawn(self, payload):
            time.sleep(2)
            return "late"

    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="did not answer within 0.2 s"):
        ModalBackend(client=Hanging(modal_app), timeout_s=0.2).submit(_request(run_dir, ckpt))
    assert time.monotonic() - started < 1.5


def test_real_sdk_without_token_says_how_to_authenticate(bandit_run, monkeypatch, tmp_path):
    run_dir, (ckpt, _) = bandit_run
    for var in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "MODAL_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MODAL_CONFIG_PATH", str(tmp_path / "modal.toml"))
    backend = get_backend("modal", client=SdkModalClient(), timeout_s=20)
    with pytest.raises(ConfigError, match="MODAL_TOKEN_ID"):
        backend.submit(_request(run_dir, ckpt))


def test_modal_cancel_and_unknown_backend(bandit_run, modal_app):
    run_dir, (ckpt, _) = bandit_run
    fake = FakeModal(modal_app)
    backend = ModalBackend(client=fake)
    handle = backend.submit(_request(run_dir, ckpt))
    assert backend.cancel(handle) is True and fake.cancelled == ["fc-1"]
    with pytest.raises(ConfigError, match="'local' or 'modal'"):
        get_backend("lambda")


def test_modal_payload_refuses_unexpected_files(modal_app):
    with pytest.raises(ContractViolation, match="unexpected file 'policy.zip'"):
        modal_app.evaluate.local({"format": "gradlab.eval-payload/1", "checkpoint_name": "c",
                                  "files": {"policy.zip": ""}, "request": {}})
