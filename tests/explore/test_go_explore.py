"""gradlab.go_explore on the built-in key-door maze, through the real learner and evaluation."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradlab.checkpoints import list_checkpoints, load_policy, verify_checkpoint
from gradlab.contracts.experiments import Experiments
from gradlab.contracts.run_spec import RunSpec
from gradlab.errors import IntegrityError
from gradlab.evaluation.runner import evaluate_policy
from gradlab.learn.go_explore import GoExploreBackend
from gradlab.learn.learner import run_learner
from gradlab.outbox import Outbox

GOAL = "gradlab__keydoor"
BUDGET = 8192
"""Env steps every search gets (8 lanes x 64 steps x 16 iterations)."""


def _spec(recipe: str, seed: int, overrides: list[str] = ()) -> RunSpec:
    resolved = Experiments().resolve(f"{GOAL}/{recipe}", [f"train.timesteps={BUDGET}", "train.checkpoint_freq=4096",
                                                          *overrides])
    return RunSpec.from_resolved(resolved, seed=seed)


def _evaluate(spec: RunSpec, checkpoint: Path):
    manifest = verify_checkpoint(checkpoint)
    return evaluate_policy(load_policy(checkpoint), goal=spec.goal, environment=spec.eval_environment,
                           hashes=spec.hashes, checkpoint_sha256=manifest.sha256, checkpoint_step=manifest.step,
                           run_id=spec.run_id, max_steps=10_000)


def _metrics(run_dir: Path) -> list[dict[str, float]]:
    return [e.payload["metrics"] for e in Outbox(run_dir / "outbox.sqlite").read(kind="metrics", limit=100_000)
            if "train/global_step" in e.payload["metrics"] and "train/throughput/loop_fps" in e.payload["metrics"]]


@pytest.fixture(scope="module")
def searches(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[RunSpec, Path]]:
    out = {}
    for seed in (0, 1, 2):
        spec = _spec("go-explore", seed)
        run_dir = tmp_path_factory.mktemp(f"go-explore-{seed}")
        run_learner(spec, run_dir, watch_parent=False)
        out[seed] = (spec, run_dir)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_go_explore_solves_the_maze_and_its_program_passes_evaluation(searches, seed):
    spec, run_dir = searches[seed]
    last = _metrics(run_dir)[-1]
    assert last["train/algorithm/go_explore/best/completed"] == 1.0
    assert last["train/algorithm/go_explore/archive/cell_count"] > 50
    assert 0 < last["train/algorithm/go_explore/best/program_steps"] <= 150
    result = _evaluate(spec, list_checkpoints(run_dir)[-1])
    assert result.verdict == "accepted"
    assert result.aggregates["eval/outcome/success/rate"] == 1.0


@pytest.mark.slow
def test_ppo_with_the_same_budget_does_not_solve_the_maze(tmp_path: Path):
    spec = _spec("ppo", 0, ["train.backend.config.n_steps=64", "train.backend.config.batch_size=128"])
    run_learner(spec, tmp_path, watch_parent=False)
    result = _evaluate(spec, list_checkpoints(tmp_path)[-1])
    assert result.aggregates["eval/outcome/success/rate"] == 0.0
    assert result.verdict != "accepted"


def _ready(run_dir: Path) -> list[dict]:
    if not (run_dir / "outbox.sqlite").exists():
        return []
    ob = Outbox(run_dir / "outbox.sqlite")
    try:
        return [e.payload for e in ob.read(kind="checkpoint_ready", limit=1000)]
    finally:
        ob.close()


def _learner(spec_path: Path, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gradlab.learn", "--spec", str(spec_path), "--run-dir", str(run_dir),
            "--log-level", "WARNING", *extra]


@pytest.mark.slow
def test_sigkill_then_resume_continues_the_same_archive_and_rng(searches, tmp_path: Path):
    """A learner killed after its first checkpoint and resumed from it ends where seed 0's uninterrupted run ends."""
    spec, straight = searches[0]
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec.to_json()))
    broken = tmp_path / "broken"
    proc = subprocess.Popen(_learner(spec_path, broken), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not _ready(broken) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    first = _ready(broken)[0]
    assert first["step"] == 4096
    for later in (broken / "checkpoints").iterdir():  # the crash came right after checkpoint 1
        if not later.name.startswith(".") and int(later.name.split("-")[0]) > 4096:
            shutil.rmtree(later)
    resumed = subprocess.run(_learner(spec_path, broken, "--resume-from", first["path"]), capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final_a, final_b = list_checkpoints(straight)[-1], list_checkpoints(broken)[-1]
    assert verify_checkpoint(final_a).sha256 == verify_checkpoint(final_b).sha256  # the same best program
    for name in ("archive.json", "search.json"):  # the same cells, counters, RNG state and lanes
        assert (final_a / "resume" / name).read_text() == (final_b / "resume" / name).read_text(), name
    blobs_a = sorted(p.name for p in (final_a / "resume" / "states").iterdir())
    assert blobs_a == sorted(p.name for p in (final_b / "resume" / "states").iterdir())
    assert not list(final_b.rglob("*.pkl")) and not list(final_b.rglob("*.pt"))


def test_a_corrupted_state_blob_is_refused_naming_it(searches, tmp_path: Path):
    spec, run_dir = searches[1]
    ckpt = tmp_path / "ckpt"
    shutil.copytree(list_checkpoints(run_dir)[-1], ckpt)
    blob = sorted((ckpt / "resume" / "states").iterdir())[0]
    blob.write_bytes(blob.read_bytes()[:-1] + b"\x00")
    with pytest.raises(IntegrityError, match=blob.name):
        verify_checkpoint(ckpt)  # the manifest covers every blob
    backend = GoExploreBackend("gradlab.go_explore")  # and the backend checks the address itself
    backend.setup(spec, GoExploreBackend.make_env(spec))
    try:
        with pytest.raises(IntegrityError, match=f"{blob.name}: provider state blob is corrupted"):
            backend.restore(ckpt)
    finally:
        backend.close()


def test_every_search_checkpoint_publishes_with_its_archive_and_state_blobs(searches, gradlab_home: Path,
                                                                            tmp_path: Path):
    """A search checkpoint's resume files (search.json, archive.json, resume/states/<sha256>.bin) are
    part of the bundle's schema: the model store takes them, and a name outside it is still refused."""
    from gradlab.checkpoints.bundle import check_bundle_files
    from gradlab.receipts import begin_attempt, open_run, publish_checkpoint
    from gradlab.settings import load_settings
    from gradlab.stores import open_stores

    spec, run_dir = searches[0]
    stores = open_stores(load_settings())
    open_run(stores, spec)
    attempt, _ = begin_attempt(stores, spec.run_id, mode="fresh")
    for checkpoint in list_checkpoints(run_dir):
        names = check_bundle_files(checkpoint)
        assert {"resume/search.json", "resume/archive.json"} <= set(names)
        assert any(n.startswith("resume/states/") and n.endswith(".bin") for n in names)
        publication = publish_checkpoint(stores, run_id=spec.run_id, attempt_id=attempt.attempt_id,
                                         checkpoint_dir=checkpoint)
        assert set(publication.files) >= set(names) - {"manifest.json"}
    planted = tmp_path / "planted"
    shutil.copytree(list_checkpoints(run_dir)[-1], planted)
    (planted / "resume" / "states" / "not-a-sha.bin").write_bytes(b"x")
    with pytest.raises(IntegrityError, match="not-a-sha.bin: not a file a checkpoint holds"):
        check_bundle_files(planted)
