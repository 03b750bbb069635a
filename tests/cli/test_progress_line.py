"""The progress line of `gradlab train`: most important first, and honest once the learner is done."""

from __future__ import annotations

from pathlib import Path

from gradlab.cli.run_display import _progress_line
from gradlab.outbox import Outbox
from gradlab.runs.progress import RunProgress


def test_progress_line_orders_and_finishes(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite")
    outbox.append("metrics", 1024, {"metrics": {"train/episode/return/shaped/mean": 21.5}})
    outbox.append("checkpoint_ready", 2048, {"path": "x", "sha256": "a" * 64, "step": 2048})
    outbox.append("supervisor_metrics", 2048, {"metrics": {"orchestration/checkpoints/published": 1}})
    progress = RunProgress(tmp_path / "outbox.sqlite", 100_000).refresh()
    assert _progress_line(progress) == ("step 1,024/100,000 · accepted 0 · return 21.5 · "
                                        "checkpoints 1, published 1, evaluated 0")
    outbox.append("supervisor_metrics", 2048, {"metrics": {"eval/checkpoint_step": 2048,
                                                           "orchestration/checkpoints/evaluated": 1,
                                                           "orchestration/checkpoints/accepted": 1}})
    outbox.append("stop_observed", 3072, {"reason": "accepted:2048"})
    outbox.append("learner_finished", 3072, {"final_step": 3072, "stop_reason": "stop_requested"})
    progress.refresh()
    assert progress.steps_per_s is None  # no rate once the learner is done
    assert _progress_line(progress) == ("step 3,072/100,000 · accepted 1 (stop: accepted:2048) · learner done, "
                                        "finishing · return 21.5 · checkpoints 1, published 1, evaluated 1")
    outbox.close()


def _finished_run(path: Path) -> Outbox:
    """A learner that wrote three checkpoints and finished; the first one evaluated (rejected, 4 s)."""
    outbox = Outbox(path)
    for step in (1000, 2000, 3000):
        outbox.append("checkpoint_ready", step, {"path": "x", "sha256": f"{step:064d}", "step": step})
    outbox.append("supervisor_metrics", 3000, {"metrics": {"orchestration/checkpoints/published": 3}})
    outbox.append("learner_finished", 3000, {"final_step": 3000, "stop_reason": "budget"})
    outbox.append("supervisor_metrics", 1000, {"metrics": {"eval/checkpoint_step": 1000, "orchestration/eval/seconds": 4.0,
                                                           "orchestration/checkpoints/evaluated": 1,
                                                           "orchestration/checkpoints/accepted": 0}})
    return outbox


def test_a_finished_learner_says_how_many_evaluations_remain_and_how_long(tmp_path: Path) -> None:
    outbox = _finished_run(tmp_path / "outbox.sqlite")
    progress = RunProgress(tmp_path / "outbox.sqlite", 3000).refresh()
    assert progress.evaluations_left == 2 and progress.eval_seconds_mean == 4.0
    assert "learner done, 2 evaluations left, ~8 s at 4.0 s each" in _progress_line(progress)
    # Step 2000 accepted: 3000 is deferred (above the lowest accepted step), nothing is left.
    outbox.append("supervisor_metrics", 2000, {"metrics": {"eval/checkpoint_step": 2000, "orchestration/eval/seconds": 2.0,
                                                           "orchestration/checkpoints/evaluated": 2,
                                                           "orchestration/checkpoints/accepted": 1}})
    progress.refresh()
    assert progress.accepted_steps == {2000} and progress.evaluations_left == 0
    assert "learner done, finishing" in _progress_line(progress)
    outbox.close()


def test_a_run_that_never_evaluates_has_no_evaluations_left(tmp_path: Path) -> None:
    import json

    outbox = _finished_run(tmp_path / "outbox.sqlite")
    (tmp_path / "spec.json").write_text(json.dumps({"evaluate": False}))  # `gradlab train --no-eval`
    progress = RunProgress(tmp_path / "outbox.sqlite", 3000).refresh()
    assert progress.evaluating is False and progress.evaluations_left == 0
    assert "learner done, finishing" in _progress_line(progress)
    outbox.close()


def test_a_retried_runs_progress_is_its_new_learners(tmp_path: Path) -> None:
    """The first attempt's learner stopped (its supervisor lost); the retry's learner trains on."""
    outbox = Outbox(tmp_path / "outbox.sqlite")
    outbox.append("learner_started", 0, {"pid": 1})
    outbox.append("stop_observed", 2048, {"reason": "supervisor_lost"})
    outbox.append("learner_finished", 2048, {"final_step": 2048, "stop_reason": "supervisor_lost"})
    outbox.append("learner_started", 2048, {"pid": 2})
    outbox.append("metrics", 4096, {"metrics": {}})
    progress = RunProgress(tmp_path / "outbox.sqlite", 100_000).refresh()
    assert not progress.finished and progress.stop is None and progress.step == 4096
    assert "learner done" not in _progress_line(progress) and "supervisor_lost" not in _progress_line(progress)
    outbox.close()


def test_off_a_terminal_a_line_is_printed_only_when_something_changed(tmp_path: Path) -> None:
    from gradlab.cli.run_display import _LinePrinter

    outbox = _finished_run(tmp_path / "outbox.sqlite")
    progress = RunProgress(tmp_path / "outbox.sqlite", 3000)
    lines: list[str] = []
    printer = _LinePrinter(every_s=10.0, out=lines.append)
    for second in range(60):  # a minute of readings, once a second, while the evaluations run
        printer.offer(progress.refresh(), float(second))
    assert len(lines) == 1 and "2 evaluations left" in lines[0]
    outbox.append("supervisor_metrics", 2000, {"metrics": {"eval/checkpoint_step": 2000, "orchestration/eval/seconds": 2.0,
                                                           "orchestration/checkpoints/evaluated": 2,
                                                           "orchestration/checkpoints/accepted": 0}})
    printer.offer(progress.refresh(), 60.5)  # an evaluation finished: printed at once
    assert len(lines) == 2 and "1 evaluation left" in lines[1] and "evaluated 2" in lines[1]
    # While training, steps alone change the line: at most one line per 10 s.
    training = RunProgress(tmp_path / "t.sqlite", 100_000)
    live = Outbox(tmp_path / "t.sqlite")
    lines.clear()
    printer = _LinePrinter(every_s=10.0, out=lines.append)
    for second in range(30):
        live.append("metrics", 100 * (second + 1), {"metrics": {}})
        printer.offer(training.refresh(), float(second))
    assert len(lines) == 3
    live.close()
    outbox.close()
