"""The warm flow's requester side (``gradlab.cli.warm_flow.hand_off``) and the command line it hands over.

The warm path end to end (a real daemon, its warm flow running ``gradlab train``, Ctrl-C relayed,
the fallback once it is gone) is in ``tests/cli/test_daemon.py``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import typer

from gradlab.cli import train_cmds
from gradlab.cli import warm_handoff as warm_flow
from gradlab.cli.app import app
from gradlab.learn import zygote


def _parsed(argv: list[str]) -> dict:
    command = typer.main.get_command(app)
    with command.make_context("gradlab", list(argv)) as root:
        name, sub, args = command.resolve_command(root, list(argv))
        with sub.make_context(name, args, parent=root) as ctx:
            params = dict(ctx.params)
    params["overrides"] = list(params["overrides"] or ()) or None  # click's tuple, as typer hands it over
    return params


@pytest.mark.parametrize("call", [
    dict(ref="CartPole-v1/ppo", seed=0, overrides=None, wandb=None, eval_backend="local", no_eval=False,
         json_out=False, init_from=None, init_optimizer=False),
    dict(ref="gradlab__bandit/ppo", seed=7, overrides=["train.timesteps=4096", "train.torch_threads=1"],
         wandb="disabled", eval_backend="modal", no_eval=True, json_out=True, init_from="run-x:2048",
         init_optimizer=True),
])
def test_the_handed_over_command_line_parses_back_to_the_same_train_call(call: dict) -> None:
    argv = train_cmds._command_line(**call)
    assert argv[0] == "train"
    assert _parsed(argv) == call


def test_no_warm_flow_means_the_command_runs_the_flow_itself(gradlab_home: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    assert warm_flow.hand_off(["train", "x/y"]) is None  # GRADLAB_DAEMON=0 (tests/conftest.py)
    monkeypatch.setenv("GRADLAB_DAEMON", "1")
    assert warm_flow.hand_off(["train", "x/y"]) is None  # no warm flow folder
    zygote.flow_zygote_dir(gradlab_home).mkdir(parents=True)
    stale = zygote.ZygoteInfo(pid=os.getpid(), address="\0nobody", fingerprint="0" * 64, import_env={},
                              keeper_pid=None, ready_at=time.time())
    (zygote.flow_zygote_dir(gradlab_home) / f"{os.getpid()}.json").write_text(stale.model_dump_json())
    assert warm_flow.hand_off(["train", "x/y"]) is None  # its pid is no warm flow: the file is removed
    assert not list(zygote.flow_zygote_dir(gradlab_home).glob("*.json"))
    monkeypatch.setenv(warm_flow.CHILD_ENV, "1")
    assert warm_flow.hand_off(["train", "x/y"]) is None  # the warm flow's own child never hands off


def test_a_warm_flow_that_dies_while_waited_for_is_said_and_the_command_runs_the_flow_itself(
        gradlab_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    monkeypatch.setenv("GRADLAB_DAEMON", "1")
    directory = zygote.flow_zygote_dir(gradlab_home)
    directory.mkdir(parents=True)
    # A process whose command line names the warm flow's module and folder, as a starting one's does,
    # and that exits without ever becoming ready (its imports failed, or it was killed).
    dying = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)", zygote.FLOW_MODULE,
                              str(directory.absolute())])
    (directory / f"{dying.pid}.pending").write_text(str(time.time()))
    said: list[str] = []
    try:
        assert warm_flow.hand_off(["train", "x/y"], say=said.append) is None
    finally:
        dying.kill()
        dying.wait()
    assert said[0].startswith("starting: the warm flow and the warm learner"), said
    assert said[-1] == (f"the warm flow did not start (its log: {directory / 'zygote.log'}); this command runs "
                        "the flow itself")
    assert not list(directory.glob("*.pending"))


@pytest.mark.slow
def test_a_warm_flow_with_other_code_is_retired_not_used(gradlab_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A zygote in the warm flow's folder whose fingerprint is not this checkout's flow fingerprint
    (here a learner zygote, which covers only gradlab's sources) is retired, and the command runs
    the flow itself."""
    monkeypatch.setenv("GRADLAB_DAEMON", "1")
    directory = zygote.flow_zygote_dir(gradlab_home)
    pid = zygote.start_zygote(directory, keeper_pid=os.getpid())
    try:
        deadline = time.monotonic() + 180
        while not zygote.ready_zygotes(directory):
            assert time.monotonic() < deadline, "zygote not ready within 180 s"
            time.sleep(0.2)
        assert zygote.ready_zygotes(directory)[0].fingerprint != zygote.kind_fingerprint(zygote.FLOW_MODULE)
        assert warm_flow.hand_off(["train", "x/y"]) is None
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and zygote._is_zygote(pid, directory):
            assert time.monotonic() < deadline, "stale zygote not retired within 30 s"
            time.sleep(0.1)
    finally:
        zygote._terminate(pid)
