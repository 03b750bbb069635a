"""`gradlab server stop` refuses while a run is training; `server start` says when one was already up,
what it waits for, and serves a UI that asks its own API on any port.

Runs are made with the real receipt rules on the default file stores of the test's GRADLAB_HOME
(no training): a run whose attempt holds a live lease and has no terminal receipt is training.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gradlab.receipts import (
    LearnerExit,
    TerminalMetrics,
    TerminalReceipt,
    begin_attempt,
    open_run,
    release_lease,
    seal_terminal,
)
from gradlab.runs.view import live_attempts
from gradlab.stores import Stores, open_stores

REPO = Path(__file__).resolve().parents[2]
RUN_A = "gradlab-20260102T030405-0000000a"
RUN_B = "gradlab-20260102T030406-0000000b"
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def gradlab(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradlab.cli.app", *args], capture_output=True, text=True,
                          cwd=REPO, env=dict(os.environ), timeout=timeout)


def _open(stores: Stores, run_id: str) -> None:
    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec

    open_run(stores, RunSpec.from_resolved(Experiments().resolve("gradlab__bandit/ppo"), seed=0, run_id=run_id))


def _seal(stores: Stores, run_id: str, attempt_id: str) -> None:
    seal_terminal(stores, TerminalReceipt(
        run_id=run_id, attempt_id=attempt_id, goal_id="gradlab__bandit", recipe_id="ppo", seed=0, outcome="succeeded",
        reason="budget", final_step=None, checkpoints=[], evaluations=[], promotion=None,
        metrics=TerminalMetrics(local_high_water=0, sinks={}), drained=True,
        learner=LearnerExit(exit_code=0, stop_reason="budget"), sealed_at=T0 + timedelta(seconds=30)))


def test_live_attempts_follow_lease_and_terminal_receipt(gradlab_home: Path) -> None:
    stores = open_stores()
    assert stores.control.base_url.startswith((gradlab_home / "stores").as_uri())
    _open(stores, RUN_A)
    _open(stores, RUN_B)
    assert live_attempts(stores, now=T0) == []  # opened, no attempt: nothing trains
    _, held_a = begin_attempt(stores, RUN_A, mode="fresh", ttl_s=60.0, now=T0)
    begin_attempt(stores, RUN_B, mode="fresh", ttl_s=60.0, now=T0)
    # Leases taken at T0 with a 60 s ttl expire at T0 + 60 s exactly (live while now < expires_at).
    assert live_attempts(stores, now=T0 + timedelta(seconds=59)) == [(RUN_A, "attempt-001"), (RUN_B, "attempt-001")]
    assert live_attempts(stores, now=T0 + timedelta(seconds=60)) == []  # both expired: crashed, not training
    # A sealed attempt is over even before its lease is released; a released lease is over too.
    _seal(stores, RUN_B, "attempt-001")
    assert live_attempts(stores, now=T0 + timedelta(seconds=59)) == [(RUN_A, "attempt-001")]
    release_lease(stores.control, held_a, now=T0 + timedelta(seconds=40))
    assert live_attempts(stores, now=T0 + timedelta(seconds=41)) == []


def test_server_stop_without_a_server_is_not_refused(gradlab_home: Path) -> None:
    """With no server up no run depends on one: stopping (the warm learner, if any) is not refused."""
    stores = open_stores()
    _open(stores, RUN_A)
    begin_attempt(stores, RUN_A, mode="fresh", ttl_s=600.0)  # live for 10 minutes from now
    out = gradlab("server", "stop")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("no server was running (GRADLAB_HOME ")


@pytest.mark.slow
def test_server_lifecycle_with_a_live_run(gradlab_home: Path) -> None:
    """A real Prefect server (~15 s) on a port that is not Prefect's 4200: start (saying what it
    waits for, for as long as --wait says), the UI's settings naming this server's own API, start
    again ("already up"), refused stop, a move to another port refused while a run trains and made
    once none does, forced stop."""
    import json
    import urllib.request

    from gradlab.runs.server import free_port, running_server, stop_server
    from gradlab.settings import load_settings

    settings = load_settings()
    port = free_port()
    assert port != 4200
    try:
        out = gradlab("server", "start", "--port", str(port), "--wait", "5m", timeout=360)
        assert out.returncode == 0, out.stderr
        state = running_server(settings)
        assert state is not None and state.url == f"http://127.0.0.1:{port}"
        assert out.stdout.strip() == f"Prefect server up at {state.url} (pid {state.pid}); UI: {state.url}"
        assert out.stderr.startswith(f"waiting up to 300 s for the Prefect server at {state.url} to answer GET "
                                     "/api/health"), out.stderr
        assert str(settings.home / "prefect" / "server.log") in out.stderr
        # The UI's settings endpoint: the page's API calls go to this server, not 127.0.0.1:4200.
        with urllib.request.urlopen(f"{state.url}/ui-settings", timeout=10) as r:
            assert json.loads(r.read())["api_url"] == f"http://127.0.0.1:{port}/api"
        out = gradlab("server", "start", timeout=180)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"Prefect server already up at {state.url} (pid {state.pid}); UI: {state.url}"

        stores = open_stores(settings)
        _open(stores, RUN_A)
        begin_attempt(stores, RUN_A, mode="fresh", ttl_s=600.0)
        out = gradlab("server", "stop")
        assert out.returncode == 1 and f"{RUN_A} (attempt-001)" in out.stderr and "--force" in out.stderr
        assert running_server(settings) == state  # still up, same process

        # Asked for another port and no idle timeout while a run trains on it: refused, saying what to do.
        moved_to = free_port()
        out = gradlab("server", "start", "--port", str(moved_to), "--idle-timeout", "0", timeout=180)
        assert out.returncode == 1 and f"{RUN_A} (attempt-001)" in out.stderr, out.stderr
        assert f"gradlab server start --port {moved_to} --idle-timeout 0" in out.stderr
        assert running_server(settings) == state
        # Once nothing runs on it, the server moves to what was asked.
        _seal(stores, RUN_A, "attempt-001")
        out = gradlab("server", "start", "--port", str(moved_to), "--idle-timeout", "0", timeout=360)
        assert out.returncode == 0, out.stderr
        moved = running_server(settings)
        assert moved is not None and moved.url == f"http://127.0.0.1:{moved_to}" and moved.idle_s == 0
        assert "no run trains on it: restarting it" in out.stderr
        assert out.stdout.strip() == f"Prefect server up at {moved.url} (pid {moved.pid}); UI: {moved.url}"

        _open(stores, RUN_B)
        begin_attempt(stores, RUN_B, mode="fresh", ttl_s=600.0)
        out = gradlab("server", "stop", "--force")
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "stopped"
        assert running_server(settings) is None
    finally:
        stop_server(settings)
