"""An unreachable W&B in ``online`` mode costs a whole command at most the sink's budget (30 s).

The server here accepts connections and never answers (a black-holed route; a refused port, an
HTTP 500 or a reset connection cost the same budget, as W&B retries them). The same bandit command runs offline, then online against it, with the
flow in the command's own process; what W&B costs is the time from the learner's end to the
command's exit, online less offline. It includes W&B's service teardown at interpreter exit.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradlab.metrics.wandb_sink import TEARDOWN_S, WandbSink
from tests.runs.conftest import gradlab_env, last_json_line, start_gradlab

BUDGET_S = 30.0  # the sink's default budget (WANDB_INIT_TIMEOUT unset)
LOAD_SLACK_S = 5.0  # a loaded machine's spread in the learner-to-exit time of the same command
# (before the budget, W&B cost the same command ~36 s, ~13 s of it after the receipt)


@pytest.fixture
def silent_server() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a listener that accepts every connection and never replies."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def test_the_sink_blocks_its_caller_at_most_its_budget_less_the_exit_reserve(
        tmp_path: Path, silent_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A background start that hangs: :meth:`WandbSink.wait_ready` and :meth:`~WandbSink.finish`
    together block for the budget less the exit's reserve (half of an 8 s budget), then W&B is given
    up: pending, and nothing more is waited for."""
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", silent_server)
    sink = WandbSink("gradlab-budget", "online", tmp_path, "p", init_timeout_s=8, background=True)
    started = time.monotonic()
    assert sink.wait_ready(600) is False
    waited = time.monotonic() - started
    sink.finish()
    assert 3.5 <= waited and time.monotonic() - started < 4 + LOAD_SLACK_S
    assert sink.status == "pending" and "8 s budget" in sink.error
    assert sink.log(1, {"train/global_step": 1}) is False and sink.high_water == 0


def _timed_train(env: dict[str, str], mode: str) -> dict:
    """Run ``gradlab train gradlab__bandit/ppo --wandb MODE --json``; the receipt and, in monotonic
    seconds, when the learner's end was reported, when the receipt was printed, and the exit."""
    proc = start_gradlab(["train", "gradlab__bandit/ppo", "--wandb", mode, "--json"], env)
    learner_done: list[float] = []
    stderr: list[str] = []

    def read_stderr() -> None:
        for line in proc.stderr:
            stderr.append(line)
            if "learner done" in line and not learner_done:
                learner_done.append(time.monotonic())

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    stdout, receipt_at = [], None
    for line in proc.stdout:
        stdout.append(line)
        if line.startswith("{"):
            receipt_at = time.monotonic()
    try:
        rc = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    exited_at = time.monotonic()
    reader.join()
    assert rc == 0, "".join(stderr)[-3000:]
    assert learner_done and receipt_at is not None, "".join(stderr)[-3000:]
    return {"receipt": last_json_line("".join(stdout)), "learner_done": learner_done[0], "receipt_at": receipt_at,
            "exited_at": exited_at, "stderr": "".join(stderr)}


@pytest.mark.slow
def test_an_unreachable_wandb_costs_a_command_at_most_its_budget(prefect_api: str, gradlab_home: Path,
                                                                 silent_server: str) -> None:
    base = {"GRADLAB_HOME": str(gradlab_home)}
    offline = _timed_train(gradlab_env(prefect_api, **base), "offline")
    assert offline["receipt"]["outcome"] == "succeeded" and offline["receipt"]["metrics"]["pending"] == []

    env = gradlab_env(prefect_api, **base, WANDB_MODE="online", WANDB_API_KEY="0" * 40, WANDB_BASE_URL=silent_server)
    env.pop("WANDB_INIT_TIMEOUT", None)
    online = _timed_train(env, "online")
    receipt = online["receipt"]
    assert receipt["outcome"] == "succeeded", online["stderr"][-3000:]
    assert receipt["metrics"]["pending"] == ["wandb"] and receipt["metrics"]["sinks"]["wandb"] == 0
    assert receipt["metrics"]["sinks"]["journal"] == receipt["metrics"]["local_high_water"] > 0

    cost = (online["exited_at"] - online["learner_done"]) - (offline["exited_at"] - offline["learner_done"])
    parts = {side: (run["receipt_at"] - run["learner_done"], run["exited_at"] - run["receipt_at"])
             for side, run in (("online", online), ("offline", offline))}
    said = online["stderr"][-2000:]
    assert cost <= BUDGET_S + LOAD_SLACK_S, f"W&B cost the command {cost:.1f} s (learner end to receipt, receipt to exit: {parts}); {said}"
    # after the receipt only W&B's service teardown is left, bounded by the budget's reserve
    assert online["exited_at"] - online["receipt_at"] <= TEARDOWN_S + LOAD_SLACK_S, f"{parts}; {said}"


@pytest.mark.slow
def test_ctrl_c_while_the_seal_waits_on_wandb_seals_at_once(prefect_api: str, gradlab_home: Path,
                                                            silent_server: str) -> None:
    """A Ctrl-C after the learner's end (the flow waiting on an unreachable W&B at the seal) stops
    that wait: the run's own receipt is sealed at once, still ``succeeded``, W&B pending."""
    import os
    import signal

    env = gradlab_env(prefect_api, GRADLAB_HOME=str(gradlab_home), WANDB_MODE="online", WANDB_API_KEY="0" * 40,
                      WANDB_BASE_URL=silent_server)
    env.pop("WANDB_INIT_TIMEOUT", None)
    proc = start_gradlab(["train", "gradlab__bandit/ppo", "--wandb", "online", "--json"], env, own_group=True)
    stderr: list[str] = []
    waiting = threading.Event()

    def read_stderr() -> None:
        for line in proc.stderr:
            stderr.append(line)
            if "the seal waits up to" in line:
                waiting.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert waiting.wait(240), "".join(stderr)[-3000:]  # the seal is waiting on W&B (its budget is 30 s)
        interrupted_at = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        stdout, receipt_at = [], None
        for line in proc.stdout:
            stdout.append(line)
            if line.startswith("{"):
                receipt_at = time.monotonic()
        rc = proc.wait(timeout=120)
        exited_at = time.monotonic()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join()
    said = "".join(stderr)[-3000:]
    assert rc == 0 and receipt_at is not None, said
    receipt = last_json_line("".join(stdout))
    assert receipt["outcome"] == "succeeded" and receipt["metrics"]["pending"] == ["wandb"], said
    assert "sealing the receipt now: the wait on W&B stops" in said
    assert receipt_at - interrupted_at <= LOAD_SLACK_S, (receipt_at - interrupted_at, said)
    assert exited_at - receipt_at <= TEARDOWN_S + LOAD_SLACK_S, (exited_at - receipt_at, said)
