"""Fencing across hosts and PID namespaces (issue 21 items 1-3).

Liveness is judged only where it can be known (the owner's boot and PID namespace); opening an
attempt is one decision (the lease, then the predecessor sealed ``superseded``, or nothing written);
every write for a superseded epoch is refused, and a hook closes only its own attempt.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from gradlab import receipts as rules
from gradlab.receipts.io import dump_model
from gradlab.receipts.lease import LeaseHeld, LeaseLost, read_lease
from gradlab.receipts.models import LearnerExit, TerminalMetrics, utcnow
from gradlab.receipts.owner import boot_id, pid_namespace, process_start
from gradlab.runs import operations
from gradlab.runs.paths import RunPaths
from gradlab.stores import Stores, keys, open_store
from tests.receipts.test_receipts import RUN, _spec

REPO = Path(__file__).resolve().parents[2]


def _snapshot(stores: Stores) -> dict[str, bytes]:
    """Every object of the three stores, by store and key."""
    return {f"{name}:{k}": store.get(k) for name in ("control", "eval", "model")
            for store in [getattr(stores, name)] for k in store.list("")}


def _rewrite_owner(stores: Stores, *, expired: bool, **owner) -> None:
    """The run's lease as if another process (``owner`` fields) held it, live or 2 min expired."""
    held = read_lease(stores.control, RUN)
    at = utcnow() - (timedelta(seconds=120) if expired else timedelta(0))
    lease = held.lease.model_copy(update={"heartbeat_at": at, "expires_at": at + timedelta(seconds=60), **owner})
    stores.control.put_if_match(keys.lease(RUN), dump_model(lease), held.etag)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


_OPEN_IN_A_NEW_PID_NAMESPACE = """
import sys
from pathlib import Path
from gradlab.receipts import begin_attempt
from gradlab.stores import Stores, open_store
stores = Stores(*(open_store((Path(sys.argv[1]) / n).as_uri()) for n in ("control", "eval", "model")))
_, held = begin_attempt(stores, sys.argv[2], mode="fresh")
print(held.lease.owner_pid, held.lease.owner_pid_namespace)
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare (and root)")
def test_an_owner_in_another_pid_namespace_is_waited_out_never_judged_dead(tmp_path: Path) -> None:
    """Another container on this kernel: same boot id, its pid (1) means another process here."""
    stores = Stores(*(open_store((tmp_path / n).as_uri()) for n in ("control", "eval", "model")))
    rules.open_run(stores, _spec())
    out = subprocess.run(["unshare", "--pid", "--fork", sys.executable, "-c", _OPEN_IN_A_NEW_PID_NAMESPACE,
                          str(tmp_path), RUN], capture_output=True, text=True, cwd=REPO, timeout=120)
    if out.returncode != 0 and "Operation not permitted" in out.stderr:
        pytest.skip("unshare --pid is not permitted here")
    assert out.returncode == 0, out.stderr
    pid, namespace = out.stdout.split()
    assert int(pid) == 1 and namespace != pid_namespace()  # pid 1 here is init, alive with another start time
    lease = read_lease(stores.control, RUN).lease
    assert lease.owner_boot_id == boot_id() and lease.owner_state() == "unknown"
    before = _snapshot(stores)
    with pytest.raises(LeaseHeld, match="is leased by attempt-001"):
        rules.begin_attempt(stores, RUN, mode="fresh")  # its process is gone, but nobody here can know
    assert _snapshot(stores) == before
    _rewrite_owner(stores, expired=True)  # only expiry frees it
    attempt, held = rules.begin_attempt(stores, RUN, mode="fresh")
    assert (attempt.attempt_id, held.lease.generation, attempt.epoch) == ("attempt-002", 2, 2)


def test_a_missing_pid_in_another_namespace_is_unknown_and_a_dead_one_here_is_dead(stores: Stores) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start(gone.pid)
    gone.wait()
    rules.open_run(stores, _spec())
    rules.begin_attempt(stores, RUN, mode="fresh")
    _rewrite_owner(stores, expired=False, owner_pid=gone.pid, owner_start=start, owner_pid_namespace="pid:[1]")
    assert read_lease(stores.control, RUN).lease.owner_state() == "unknown"
    with pytest.raises(LeaseHeld):
        rules.begin_attempt(stores, RUN, mode="fresh")
    _rewrite_owner(stores, expired=False, owner_pid=gone.pid, owner_start=start, owner_pid_namespace=pid_namespace())
    assert read_lease(stores.control, RUN).lease.owner_state() == "dead"
    attempt, _ = rules.begin_attempt(stores, RUN, mode="fresh")  # no 60 s wait
    assert attempt.attempt_id == "attempt-002"


def test_a_refused_open_writes_nothing(stores: Stores, tmp_path: Path, sleeper: subprocess.Popen) -> None:
    """A paused owner (alive here, its lease expired): the new attempt is refused and seals nothing."""
    spec = _spec()
    paths = RunPaths(tmp_path / "run").ensure()
    operations.open_attempt(stores, spec, paths)
    _rewrite_owner(stores, expired=True, owner_pid=sleeper.pid, owner_start=process_start(sleeper.pid))
    before = _snapshot(stores)
    with pytest.raises(LeaseHeld, match="still runs on this host"):
        operations.open_attempt(stores, spec, paths)
    assert _snapshot(stores) == before
    assert rules.read_terminal(stores, RUN, "attempt-001") is None


def _superseded_pair(stores: Stores, tmp_path: Path):
    """attempt-001 (flow run fr-a, epoch 1) expired unsealed, then attempt-002 (fr-b) took the run."""
    spec = _spec()
    paths = RunPaths(tmp_path / "run").ensure()
    first = operations.open_attempt(stores, spec, paths, flow_run_id="fr-a")
    _rewrite_owner(stores, expired=True, owner_pid_namespace="pid:[1]")  # it ran in another container
    second = operations.open_attempt(stores, spec, paths, flow_run_id="fr-b")
    return spec, paths, first, second


def test_opening_takes_the_lease_and_seals_the_predecessor_superseded(stores: Stores, tmp_path: Path) -> None:
    _, _, first, second = _superseded_pair(stores, tmp_path)
    assert (first.fence, second.fence) == (("attempt-001", 1), ("attempt-002", 2))
    assert second.reconciled == ("attempt-001",)
    sealed = rules.read_terminal(stores, RUN, "attempt-001")
    assert sealed.outcome == "superseded" and sealed.epoch == 2
    assert (sealed.superseded_by.attempt_id, sealed.superseded_by.epoch) == ("attempt-002", 2)
    assert sealed.superseded_by.lease_expired_at is not None
    assert sealed.reason.startswith("superseded by attempt-002 (epoch 2): its lease (epoch 1) expired at ")
    assert sealed.reason.endswith("; it had published nothing")
    assert [a.flow_run_id for a in rules.list_attempts(stores, RUN)] == ["fr-a", "fr-b"]


def test_every_write_for_the_superseded_epoch_is_refused(stores: Stores, tmp_path: Path) -> None:
    spec, paths, first, second = _superseded_pair(stores, tmp_path)
    stale = first.fence
    before = _snapshot(stores)
    refused = "write for attempt-001 epoch 1 refused: the lease is attempt-002 epoch 2"
    with pytest.raises(LeaseLost, match=refused):
        operations.record_stop(stores, RUN, "attempt-001", "accepted:256", epoch=1)
    with pytest.raises(LeaseLost, match=refused):
        operations.seal(stores, spec, "attempt-001", outcome="succeeded", reason="late", final_step=0,
                        metrics=TerminalMetrics(local_high_water=0, sinks={}), drained=True,
                        learner=LearnerExit(exit_code=0, stop_reason="budget"), epoch=1)
    publication = rules.CheckpointPublication(
        run_id=RUN, attempt_id="attempt-002", step=256, sha256="a" * 64, purpose="periodic",
        uri="file:///m/", files={}, epoch=2, published_at=utcnow())
    with pytest.raises(LeaseLost, match=refused):
        operations.evaluate(stores, spec, publication, tmp_path, fence=stale)
    with pytest.raises(LeaseLost, match=refused):
        operations.record_unusable(stores, spec, publication, "step 256: flipped", fence=stale)
    with pytest.raises(LeaseLost):
        rules.renew_lease(stores.control, first.lease)
    with pytest.raises(LeaseLost):
        rules.release_lease(stores.control, first.lease)
    assert _snapshot(stores) == before
    # The current attempt's own writes go through, and carry its epoch.
    record = operations.record_unusable(stores, spec, publication, "step 256: flipped", fence=second.fence)
    assert (record.attempt_id, record.epoch, record.status) == ("attempt-002", 2, "failed")
    operations.record_stop(stores, RUN, "attempt-002", "user", epoch=2)
    assert rules.read_stop_request(stores, RUN).epoch == 2


def test_a_hook_closes_only_its_own_attempt(stores: Stores, tmp_path: Path) -> None:
    """The superseded flow's failure hook must not seal or release the new attempt, whatever the
    new owner's pid looks like from the old flow's namespace."""
    _, paths, _, second = _superseded_pair(stores, tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start(gone.pid)
    gone.wait()  # attempt-002's owner, as seen from here: a pid that no longer exists
    _rewrite_owner(stores, expired=False, owner_pid=gone.pid, owner_start=start)
    lease_before = read_lease(stores.control, RUN)
    assert operations.close_abandoned_attempt(stores, paths, RUN, outcome="failed", reason="flow failed: late",
                                              flow_run_id="fr-a") is None
    assert rules.read_terminal(stores, RUN, "attempt-002") is None
    assert read_lease(stores.control, RUN) == lease_before
    # Its own hook closes it, by attempt id and epoch, and releases its lease.
    own = operations.close_abandoned_attempt(stores, paths, RUN, outcome="failed", reason="crashed: gone",
                                             flow_run_id="fr-b")
    assert (own.attempt_id, own.epoch, own.outcome) == ("attempt-002", second.fence[1], "failed")
    assert read_lease(stores.control, RUN).lease.released


def test_reconcile_fences_an_expired_lease_out_before_sealing(stores: Stores, tmp_path: Path) -> None:
    spec = _spec()
    paths = RunPaths(tmp_path / "run").ensure()
    first = operations.open_attempt(stores, spec, paths)
    _rewrite_owner(stores, expired=True, owner_pid_namespace="pid:[1]")
    [closed] = rules.reconcile_run(stores, RUN)
    assert closed.outcome == "failed" and "lease expired at" in closed.reason
    # The holder wakes up (SIGCONT): its renewal and every fenced write are refused.
    stale = read_lease(stores.control, RUN)
    assert stale.lease.released and stale.lease.holder == "attempt-001"
    with pytest.raises(LeaseLost):
        rules.renew_lease(stores.control, first.lease)
    with pytest.raises(LeaseLost):
        operations.record_stop(stores, RUN, "attempt-001", "user", epoch=1)


def test_a_superseded_driver_writes_nothing_more_and_returns_its_successors_receipt(stores: Stores,
                                                                                    tmp_path: Path) -> None:
    """Attempt 1 wakes up after attempt 2 took the run: its seal is refused, its lease is not
    released, and it hands back the receipt attempt 2 sealed for it."""
    from gradlab.runs.driver import AttemptDriver

    spec, paths, first, second = _superseded_pair(stores, tmp_path)
    lease_before = read_lease(stores.control, RUN)
    driver = AttemptDriver(
        spec=spec, paths=paths, stores=stores, plan=first, learner=None,  # drain: nothing left to train
        submit_publish=lambda t: pytest.fail("nothing to publish"), submit_evaluate=lambda t: pytest.fail("no eval"),
        record_stop=lambda reason: operations.record_stop(stores, RUN, "attempt-001", reason, epoch=1),
        promote=lambda t: pytest.fail("nothing to promote"),
        seal=lambda fields: operations.seal(stores, spec, "attempt-001", paths=paths, epoch=1, **fields),
        evaluate=False, grace_s=2.0,
    )
    receipt = driver.run()
    assert (receipt.attempt_id, receipt.outcome, receipt.superseded_by.attempt_id) == ("attempt-001", "superseded",
                                                                                       "attempt-002")
    assert rules.read_terminal(stores, RUN, "attempt-001") == receipt
    assert read_lease(stores.control, RUN) == lease_before  # attempt 2's lease, untouched
    assert not paths.attempt_receipt("attempt-001").exists()  # no local receipt of its own either
    assert second.fence == ("attempt-002", 2)


def test_the_lease_ttl_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from gradlab.errors import ContractViolation
    from gradlab.receipts.lease import lease_ttl_s

    monkeypatch.setenv("GRADLAB_LEASE_TTL_S", "8")
    assert lease_ttl_s() == 8.0
    monkeypatch.setenv("GRADLAB_LEASE_TTL_S", "soon")
    with pytest.raises(ContractViolation, match=r"GRADLAB_LEASE_TTL_S: expected seconds >= 3, found 'soon'"):
        lease_ttl_s()
