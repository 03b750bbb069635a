"""``gradlab train --init-from``: a supervised run starts from a parent checkpoint and records its lineage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradlab.checkpoints import list_checkpoints, read_manifest
from tests.runs.conftest import gradlab_env, last_json_line, run_gradlab
from tests.share.conftest import train_run


@pytest.mark.slow
def test_warm_started_run_records_the_parent_sha256(prefect_server: tuple[str, Path, int], tmp_path: Path) -> None:
    api, home, _ = prefect_server
    parent_dir = train_run(tmp_path, "gradlab__bandit/ppo", run_id="gradlab-20260101T000000-0000beef",
                           overrides=("train.timesteps=2048",))
    parent = list_checkpoints(parent_dir)[-1]
    parent_sha = read_manifest(parent).sha256
    env = gradlab_env(api, GRADLAB_HOME=str(home))
    out = run_gradlab(["train", "gradlab__bandit/ppo", "--init-from", str(parent), "--json"], env)
    assert out.returncode == 0, out.stderr[-3000:]
    receipt = last_json_line(out.stdout)
    first = receipt["checkpoints"][0]
    published = Path(first["uri"].removeprefix("file://"))
    assert json.loads((published / "manifest.json").read_text())["init_from_sha256"] == parent_sha
    spec = json.loads((home / "stores" / "control" / "runs" / receipt["run_id"] / "spec.json").read_text())
    assert spec["init_from"]["checkpoint_sha256"] == parent_sha and spec["init_from"]["source"] == str(parent)
    shown = run_gradlab(["runs", "show", receipt["run_id"]], env)
    assert shown.returncode == 0, shown.stderr
    assert f"warm start from {parent}" in shown.stdout.replace("\n", "") and parent_sha in shown.stdout
