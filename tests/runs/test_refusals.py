"""`gradlab runs retry` and `runs reconcile` refuse what would break a run, and reconcile closes a
dead attempt, through the CLI over real file stores (no Prefect: every refusal comes before it)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradlab import receipts as rules
from gradlab.cli.app import app
from gradlab.contracts.run_spec import new_run_id
from gradlab.receipts.lease import acquire_lease, read_lease
from gradlab.receipts.models import utcnow
from gradlab.runs import operations
from gradlab.settings import load_settings
from gradlab.stores import open_stores

REPO = Path(__file__).resolve().parents[2]

#: Opens a run's first attempt (writer lease + attempt.json) in another process, which then stays
#: alive (the lease's owner still runs) until its standard input is closed.
_OPEN_IN_ANOTHER_PROCESS = """
import sys
from gradlab import receipts as rules
from gradlab.stores import open_stores
rules.begin_attempt(open_stores(), sys.argv[1], mode="fresh")
print("opened", flush=True)
sys.stdin.read()
"""


def _opened_run(stores) -> str:
    """A run opened in the stores (run.json, spec.json), no attempt yet."""
    spec, _paths = operations.prepare_spec(load_settings(), recipe="gradlab__bandit/ppo", run_id=new_run_id())
    rules.open_run(stores, spec)
    return spec.run_id


def _gradlab(*args: str):
    return CliRunner().invoke(app, list(args))


def test_retry_and_reconcile_refuse_while_the_owner_runs_here_even_with_an_expired_lease(gradlab_home: Path) -> None:
    stores = open_stores()
    run_id = _opened_run(stores)
    # This process is the attempt's owner; its lease expired long ago (a suspended or swapping host).
    rules.begin_attempt(stores, run_id, mode="fresh", ttl_s=1, now=utcnow() - timedelta(minutes=10))
    for command in ("retry", "reconcile"):
        out = _gradlab("runs", command, run_id)
        assert out.exit_code == 1, out.output
        assert "attempt attempt-001 is still running here" in out.output and "lease expired" in out.output
    assert rules.read_terminal(stores, run_id, "attempt-001") is None  # nothing was sealed


def test_retry_refuses_a_live_lease_and_reconcile_closes_the_attempt_once_it_expires(gradlab_home: Path) -> None:
    stores = open_stores()
    run_id = _opened_run(stores)
    owner = subprocess.Popen([sys.executable, "-c", _OPEN_IN_ANOTHER_PROCESS, run_id], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert owner.stdout.readline().strip() == "opened", owner.stderr.read()  # blocks until it opened
        out = _gradlab("runs", "retry", run_id)
        assert out.exit_code == 1, out.output
        assert "attempt attempt-001 is still running here" in out.output and "its lease is live" in out.output
        live = _gradlab("runs", "reconcile", run_id, "--json")
        assert live.exit_code == 1 and "is still running here" in live.output  # a live attempt is not a dead one
        assert rules.read_terminal(stores, run_id, "attempt-001") is None
    finally:
        owner.stdin.close()
        owner.wait(timeout=120)

    # The owner is gone and its lease expired (as after a SIGKILL): reconcile seals it `failed`, once.
    held = read_lease(stores.control, run_id)
    acquire_lease(stores.control, run_id, held.lease.holder, ttl_s=1, owner=held.lease.owner,
                        now=utcnow() - timedelta(minutes=10))
    sealed = _gradlab("runs", "reconcile", run_id, "--json")
    assert sealed.exit_code == 0, sealed.output
    [receipt] = json.loads(sealed.stdout)
    assert (receipt["attempt_id"], receipt["outcome"]) == ("attempt-001", "failed")
    assert receipt["reason"].startswith("reconciled: attempt ended without sealing its receipt (lease expired at ")
    assert receipt["checkpoints"] == [] and receipt["promotion"] is None  # it published nothing
    assert rules.read_terminal(stores, run_id, "attempt-001").outcome == "failed"
    again = _gradlab("runs", "reconcile", run_id)
    assert again.exit_code == 0 and "nothing to reconcile" in again.output


def test_reconcile_and_retry_of_an_unknown_run_say_where_they_looked(gradlab_home: Path) -> None:
    missing = new_run_id()
    for command in ("retry", "reconcile"):
        out = _gradlab("runs", command, missing)
        assert out.exit_code == 1
        assert f"no run {missing} in {open_stores().control.base_url}" in out.output


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps error lines at the terminal width otherwise


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("GRADLAB_STOP_WAIT_S", "abc", "expected a finite number of seconds > 0, found 'abc'"),
    ("GRADLAB_STOP_WAIT_S", "inf", "expected a finite number of seconds > 0, found 'inf'"),
    ("GRADLAB_LEASE_TTL_S", "1", "expected seconds >= 3, found '1'"),
    ("WANDB_INIT_TIMEOUT", "-3", "expected a finite number of seconds > 0, found '-3'"),  # left W&B's service running
    ("WANDB_INIT_TIMEOUT", "0", "expected a finite number of seconds > 0, found '0'"),
    ("WANDB_INIT_TIMEOUT", "abc", "expected a finite number of seconds > 0, found 'abc'"),  # W&B refuses it too
])
def test_train_refuses_a_bad_run_setting_before_anything_is_created(gradlab_home: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     name: str, value: str, expected: str) -> None:
    monkeypatch.setenv(name, value)
    result = CliRunner().invoke(app, ["train", "gradlab__bandit/ppo"])
    assert result.exit_code == 1, result.output
    assert f"{name}: {expected}" in result.output
    assert not (gradlab_home / "runs").exists() or not any((gradlab_home / "runs").iterdir())


@pytest.mark.parametrize(("name", "value"), [("GRADLAB_STOP_WAIT_S", "abc"), ("GRADLAB_LEASE_TTL_S", "soon"),
                                             ("WANDB_INIT_TIMEOUT", "-1")])
def test_retry_refuses_a_bad_run_setting_before_an_attempt_is_opened(gradlab_home: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     name: str, value: str) -> None:
    stores = open_stores()
    run_id = _opened_run(stores)
    monkeypatch.setenv(name, value)
    out = _gradlab("runs", "retry", run_id)
    assert out.exit_code == 1, out.output
    assert f"{name}: expected" in out.output and "Traceback" not in out.output
    assert rules.list_attempts(stores, run_id) == []  # no attempt spent on it


def test_train_refuses_a_minibatch_larger_than_the_rollout_before_anything_is_created(gradlab_home: Path) -> None:
    out = _gradlab("train", "gradlab__keydoor/ppo", "--set", "train.environment.n_envs=1")
    assert out.exit_code == 1, out.output
    assert "train.backend.config.batch_size: expected at most n_steps * n_envs = 128, found 256" in out.output
    assert not (gradlab_home / "runs").exists() or not any((gradlab_home / "runs").iterdir())
