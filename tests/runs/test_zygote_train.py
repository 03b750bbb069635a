"""``gradlab server start`` keeps a warm learner zygote; ``gradlab train`` has it fork the learner."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradlab.learn.zygote import ready_zygotes, starting_zygotes, zygote_dir
from gradlab.outbox import Outbox
from tests.runs.conftest import gradlab_env, last_json_line, run_gradlab, wait_for

pytestmark = pytest.mark.slow  # a Prefect server, its warm learner and a real training run


def test_train_forks_its_learner_from_the_servers_zygote(prefect_server: tuple[str, Path, int]) -> None:
    api, home, server_pid = prefect_server
    directory = zygote_dir(home)
    infos = wait_for(lambda: ready_zygotes(directory), 180, "the server's zygote ready")
    assert len(infos) == 1 and infos[0].keeper_pid == server_pid
    zygote_pid = infos[0].pid

    out = run_gradlab(["train", "gradlab__bandit/ppo", "--json"], gradlab_env(api, GRADLAB_HOME=str(home)))
    assert out.returncode == 0, out.stderr[-3000:]
    receipt = last_json_line(out.stdout)
    assert receipt["outcome"] == "succeeded" and receipt["promotion"]["checkpoint_step"] == 2048

    run_dir = home / "runs" / receipt["run_id"]
    outbox = Outbox(run_dir / "outbox.sqlite")
    learner_pid = outbox.last("learner_started").payload["pid"]
    outbox.close()
    log = (directory / "zygote.log").read_text()
    assert f"zygote[{zygote_pid}] INFO: forked learner {learner_pid} (--spec {run_dir}/spec.json" in log
    assert f"learner pid {learner_pid}" in out.stderr
    # The zygote is not used up: the same one serves the next run, and no second one was started.
    assert [i.pid for i in ready_zygotes(directory)] == [zygote_pid] and starting_zygotes(directory) == []
