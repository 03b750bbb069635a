"""Real learner runs for the sharing tests: a run directory (``spec.json`` + checkpoints) per recipe.

Runs are trained by gradlab's own learner (``run_learner``) with the checked-in recipes and a small
budget, so their checkpoints are exactly what ``gradlab train`` writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hub_stand_in import HubStandIn, hf_env, hub_stand_in, serve_hub_stand_in  # noqa: F401 - re-exported for tests/share

REPO = Path(__file__).resolve().parents[2]


def train_run(root: Path, ref: str, *, run_id: str, seed: int = 0, overrides: tuple[str, ...] = ()) -> Path:
    """Train ``ref`` (GOAL/RECIPE with ``--set`` overrides) into ``root/<run_id>``; returns the run directory."""
    import torch

    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.learn.learner import run_learner

    spec = RunSpec.from_resolved(Experiments().resolve(ref, list(overrides)), seed=seed, run_id=run_id)
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(spec.to_json()))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_learner(spec, run_dir, watch_parent=False)
    finally:
        torch.set_num_threads(threads)
    return run_dir


CARTPOLE_RUN_ID = "gradlab-20260101T000000-00c0ffee"
CARTPOLE_OVERRIDES = ("train.timesteps=4096", "train.checkpoint_freq=2048")


@pytest.fixture(scope="session")
def cartpole_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CartPole-v1/ppo run of 4096 steps (checkpoints at 2048 and 4096)."""
    return train_run(tmp_path_factory.mktemp("share_runs"), "CartPole-v1/ppo", run_id=CARTPOLE_RUN_ID,
                     overrides=CARTPOLE_OVERRIDES)


def gradlab(*args: str, env: dict[str, str] | None = None, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """``gradlab ARGS`` as a user runs it (a subprocess with this test's environment)."""
    return subprocess.run([sys.executable, "-m", "gradlab.cli.app", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}, timeout=timeout_s)


def place_in_hub_cache(folder: Path, cache: Path, repo: str) -> Path:
    """Place a repository folder in huggingface_hub's cache layout (what snapshot_download leaves);
    returns the snapshot folder (``<cache>/models--OWNER--NAME/snapshots/<commit>``)."""
    import shutil

    owner, name = repo.split("/")
    root = cache / f"models--{owner}--{name}"
    snapshot = root / "snapshots" / ("a" * 40)
    shutil.copytree(folder, snapshot)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text("a" * 40)
    return snapshot
