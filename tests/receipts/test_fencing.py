"""Fencing: one learner lineage per run (issue: run integrity).

A learner paused past its lease (SIGSTOP, a frozen VM) while a new attempt opens is fenced out:
its events are refused by the new supervisor, it stops at its next safe boundary, and a store
write made for its attempt's epoch is refused.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradlab import receipts as rules
from gradlab.outbox import Outbox
from gradlab.receipts.lease import LeaseLost, release_lease
from gradlab.runs import operations
from gradlab.runs.paths import RunPaths
from gradlab.runs.supervisor import Supervisor
from gradlab.stores import Stores
from tests.runs.conftest import stop_outside_a_write

RUN = "gradlab-20260102T030405-0fe1ce00"


@functools.cache
def _spec():
    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec

    resolved = Experiments().resolve("gradlab__bandit/ppo", ["train.timesteps=10000000"])
    return RunSpec.from_resolved(resolved, seed=0, run_id=RUN, evaluate=False)


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class _Never:
    def done(self) -> bool:
        return False

    def result(self):  # pragma: no cover - never done
        raise AssertionError


@pytest.mark.slow
def test_a_paused_learner_is_fenced_out_when_a_new_attempt_opens(stores: Stores, tmp_path: Path) -> None:
    spec = _spec()
    paths = RunPaths(tmp_path / RUN).ensure()
    operations.write_local_spec(paths, spec)
    first = operations.open_attempt(stores, spec, paths)  # attempt-001, epoch 1, fence written
    proc = subprocess.Popen([sys.executable, "-m", "gradlab.learn", "--spec", str(paths.spec), "--run-dir",
                             str(paths.root), "--log-level", "WARNING"], stderr=subprocess.PIPE, text=True)
    try:
        ob = Outbox(paths.outbox)
        _wait(lambda: ob.count("metrics") >= 1, 120, "the learner's first update")
        stop_outside_a_write([proc.pid], paths.outbox)  # paused: its heartbeat stops, the lease expires
        stale = [e for e in ob.read(0, 10_000) if e.kind != "supervisor_metrics"]
        assert {e.fence for e in stale} == {first.fence}  # every event stamped with attempt and epoch
        started = ob.last("learner_started")
        assert (started.payload["attempt"], started.payload["epoch"]) == first.fence  # said in its payload too
        release_lease(stores.control, first.lease)  # (as if it had expired)
        second = operations.open_attempt(stores, spec, paths)
        assert second.fence == ("attempt-002", 2)
        sup = Supervisor(spec=spec, attempt_id="attempt-002", outbox=ob, submit_publish=lambda t: _Never(),
                         submit_evaluate=lambda t: _Never(), sinks=[], evaluate=False, fence=second.fence,
                         opened_seq=second.opened_seq, after_seq=second.opened_seq - 1)
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    finished = ob.last("learner_finished")
    assert finished.payload["stop_reason"] == "fenced" and finished.fence == first.fence
    assert "superseded by attempt-002 epoch 2" in ob.last("stop_observed").payload["reason"]
    sup.poll_outbox()
    assert sup.refused_events >= 2  # its last metrics, stop_observed, learner_finished
    assert sup.learner_finished is None and sup.tracks == {} and sup._pending_metrics == []


@pytest.mark.parametrize("what", ["publication", "promotion"])
def test_a_store_write_for_a_superseded_epoch_is_refused(stores: Stores, tmp_path: Path, what: str) -> None:
    from gradlab.checkpoints import write_checkpoint

    spec = _spec()
    paths = RunPaths(tmp_path / RUN).ensure()
    operations.write_local_spec(paths, spec)
    first = operations.open_attempt(stores, spec, paths)

    def files(folder: Path) -> None:
        (folder / "policy.zip").write_bytes(b"zip")

    folder, _ = write_checkpoint(paths.checkpoints, step=256, write_files=files, manifest_fields={
        "run_id": RUN, "purpose": "periodic", **spec.hashes, "backend_id": "sb3.ppo",
        "backend_config_sha256": "b" * 64, "versions": {}})
    pub = operations.publish(stores, RUN, "attempt-001", folder, epoch=1)
    assert pub.epoch == 1
    release_lease(stores.control, first.lease)
    operations.open_attempt(stores, spec, paths)  # attempt-002 holds epoch 2
    with pytest.raises(LeaseLost, match="write for attempt-001 epoch 1 refused: the lease is attempt-002 epoch 2"):
        if what == "publication":
            operations.publish(stores, RUN, "attempt-001", folder, epoch=1)
        else:
            from gradlab.receipts.models import EvaluationIntent

            intent, _ = rules.register_evaluation(stores, EvaluationIntent.create(
                run_id=RUN, checkpoint=pub.ref, goal_contract_sha256=spec.goal_contract_sha256,
                episode_manifest_sha256="m" * 64, backend="local"))
            record = rules.record_evaluation(stores, rules.make_evaluation_record(intent, status="accepted",
                                                                                  result={"ok": 1}))
            operations.promote(stores, RUN, "attempt-001", record, pub, epoch=1)
    assert rules.read_promotion(stores, RUN) is None
    assert json.loads(paths.outbox.with_name("spec.json").read_text())["run_id"] == RUN
