"""The catalog's answers for what cannot be played or loaded: contract errors are shown, not raised."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from gradlab.checkpoints.resolve import ResolvedCheckpoint
from gradlab.errors import NotFound
from gradlab.play.catalog import Catalog
from gradlab.settings import load_settings
from gradlab.stores import open_stores


def _catalog(**kwargs) -> Catalog:
    settings = load_settings()
    return Catalog(stores=open_stores(settings), settings=settings, **kwargs)


def test_a_checkpoint_whose_spec_no_longer_validates_names_the_contract_error(
        cartpole_checkpoint: tuple[Path, Path]) -> None:
    run_dir, ckpt = cartpole_checkpoint
    spec = json.loads((run_dir / "spec.json").read_text())
    spec["goal"]["eval"]["episodes"] = -1
    catalog = _catalog()
    run_id, step = catalog.pin(ResolvedCheckpoint(path=ckpt, spec=spec, spec_source="test", origin="directory"))
    page = catalog.playback_page(run_id, step)
    assert page.error is not None and "goal.eval.episodes" in page.error
    run = catalog.run_page(run_id)  # a pinned run outside any store is listed from its folder
    assert [c.step for c in run.checkpoints] == [64] and run.project == "classic-control"
    with pytest.raises(NotFound, match="no checkpoint at step 65"):
        catalog.playback_page(run_id, 65)


def test_a_goal_that_no_longer_validates_is_a_row_with_its_error(experiments_copy: Path) -> None:
    from gradlab.contracts import Experiments

    goal = experiments_copy / "goals" / "MountainCar-v0" / "_goal.yaml"
    goal.write_text(goal.read_text().replace("eval:", "eval:\n  episodez: 3", 1))
    page = _catalog(experiments=Experiments(experiments_copy)).project_page("classic-control")
    rows = {r.goal_id: r for r in page.goals}
    assert rows["MountainCar-v0"].error is not None and "episodez" in rows["MountainCar-v0"].error
    assert rows["CartPole-v1"].error is None and rows["CartPole-v1"].title


def test_a_runs_duration_is_the_receipts_span(gradlab_home: Path) -> None:
    """First attempt's start to the terminal receipt's seal: what the receipts say, not the record's creation."""
    from datetime import timedelta

    from gradlab.receipts import LearnerExit, TerminalMetrics, begin_attempt, open_run, seal_terminal
    from gradlab.receipts.models import TerminalReceipt
    from tests.receipts.test_receipts import RUN, T0, _spec

    stores = open_stores(load_settings())
    open_run(stores, _spec(), now=T0)
    attempt, _ = begin_attempt(stores, RUN, mode="fresh", now=T0 + timedelta(seconds=40))  # queued 40 s
    seal_terminal(stores, TerminalReceipt(
        run_id=RUN, attempt_id=attempt.attempt_id, goal_id="gradlab__bandit", recipe_id="ppo", seed=0,
        outcome="succeeded", reason="ok", final_step=100, checkpoints=[], evaluations=[], promotion=None,
        metrics=TerminalMetrics(local_high_water=0, sinks={}), drained=True,
        learner=LearnerExit(exit_code=0, stop_reason="budget"), sealed_at=T0 + timedelta(seconds=100.5)))
    (row,) = _catalog().goal_page("smoke", "gradlab__bandit").runs
    assert row.duration_s == 60.5  # not the 100.5 s since the run record was written
    assert row.started_at == (T0 + timedelta(seconds=40)).isoformat()


def test_an_evaluation_without_a_result_is_running_or_queued_while_open_and_deferred_once_sealed(
        gradlab_home: Path, tmp_path: Path) -> None:
    """The run page says what ``gradlab runs show`` says: one word per evaluation state."""
    from gradlab.receipts import (
        LearnerExit,
        TerminalMetrics,
        begin_attempt,
        open_run,
        publish_checkpoint,
        register_evaluation,
        seal_terminal,
    )
    from gradlab.receipts.models import CheckpointRef, EvaluationIntent, TerminalReceipt
    from tests.receipts.test_receipts import RUN, T0, _checkpoint_dir, _spec

    stores = open_stores(load_settings())
    open_run(stores, _spec(), now=T0)
    attempt, _ = begin_attempt(stores, RUN, mode="fresh", now=T0)
    pubs = [publish_checkpoint(stores, run_id=RUN, attempt_id=attempt.attempt_id, now=T0,
                               checkpoint_dir=_checkpoint_dir(tmp_path, step, b"policy-%d" % step))
            for step in (100, 200)]
    asked = pubs[0]
    register_evaluation(stores, EvaluationIntent.create(
        run_id=RUN, checkpoint=CheckpointRef(step=asked.step, sha256=asked.sha256, uri=asked.uri),
        goal_contract_sha256="g" * 64, episode_manifest_sha256="m" * 64, backend="local", now=T0))

    def words() -> dict[int, str | None]:
        return {c.step: c.evaluation for c in _catalog().run_page(RUN).checkpoints}

    assert words() == {100: "running", 200: "queued"}
    seal_terminal(stores, TerminalReceipt(
        run_id=RUN, attempt_id=attempt.attempt_id, goal_id="gradlab__bandit", recipe_id="ppo", seed=0,
        outcome="failed", reason="learner exited 1", final_step=200, checkpoints=[], evaluations=[],
        promotion=None, metrics=TerminalMetrics(local_high_water=0, sinks={}), drained=True,
        learner=LearnerExit(exit_code=1, stop_reason="error"), sealed_at=T0 + timedelta(seconds=10)))
    assert words() == {100: "deferred", 200: "deferred"}
