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


def test_the_summary_has_no_padding_and_keeps_the_receipt_url_whole(tmp_path: Path, monkeypatch) -> None:
    """Piped or on a narrow terminal: no trailing spaces, and the receipt's URL on one line."""
    from datetime import UTC, datetime

    from gradlab.cli.output import err_console
    from gradlab.cli.run_display import print_summary
    from gradlab.receipts.models import LearnerExit, TerminalMetrics, TerminalReceipt
    from gradlab.stores import keys, open_stores

    monkeypatch.setenv("GRADLAB_HOME", str(tmp_path / "a-home-whose-path-is-long" / ("x" * 60)))
    receipt = TerminalReceipt(
        run_id="gradlab-20261206T083413-6a3dbb37", attempt_id="attempt-001", goal_id="CartPole-v1", recipe_id="ppo",
        seed=0, outcome="succeeded", reason="accepted", final_step=49152,
        checkpoints=[{"step": 32768, "sha256": "a" * 64, "uri": "file:///c/"}],
        evaluations=[{"checkpoint_step": 32768, "status": "accepted", "result_uri": "file:///r", "return_mean": 500.0}],
        promotion={"checkpoint_step": 32768, "sha256": "a" * 64, "uri": "file:///c/"},
        metrics=TerminalMetrics(local_high_water=209, sinks={"journal": 209}), drained=True,
        learner=LearnerExit(exit_code=0, stop_reason="stop_requested"), sealed_at=datetime(2026, 12, 6, tzinfo=UTC),
    ).model_dump(mode="json")
    monkeypatch.setattr(err_console, "width", 60)  # narrower than the receipt's URL
    with err_console.capture() as captured:
        print_summary(receipt, 7.4)
    lines = captured.get().splitlines()
    assert [line.split("  ")[0] for line in lines] == ["run", "outcome", "final step", "checkpoints", "evaluations",
                                                       "promotion", "metrics", "wall time", "receipt"]
    assert all(line == line.rstrip() for line in lines), lines
    url = open_stores().control.url(keys.terminal(receipt["run_id"], "attempt-001"))
    assert len(url) > 60 and lines[-1] == f"receipt      {url}"
    assert "metrics      delivered locally up to event 209" in lines


def test_the_rate_does_not_count_the_wait_before_the_first_step(tmp_path: Path, monkeypatch) -> None:
    """A learner waiting 6 s for its supervisor, then 9,472 steps in 0.5 s: ~19k steps/s, not 1.6k."""
    import gradlab.runs.progress as progress_module

    clock = [100.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: clock[0])
    outbox = Outbox(tmp_path / "outbox.sqlite")
    progress = RunProgress(tmp_path / "outbox.sqlite", 100_000)
    for _ in range(7):  # waiting: nothing stepped
        progress.refresh()
        clock[0] += 1.0
    assert progress.steps_per_s is None
    clock[0] -= 0.5
    outbox.append("metrics", 9472, {"metrics": {}})
    progress.refresh()
    assert progress.steps_per_s == 9472 / 0.5
    clock[0] += 1.0
    outbox.append("metrics", 28416, {"metrics": {}})
    progress.refresh()
    assert progress.steps_per_s == 28416 / 1.5  # from the last reading before the first step
    outbox.close()


def test_what_is_starting_says_how_long_only_from_the_first_second(tmp_path: Path, monkeypatch) -> None:
    import gradlab.cli.run_display as display

    clock = [50.0]
    monkeypatch.setattr(display.time, "monotonic", lambda: clock[0])
    Outbox(tmp_path / "outbox.sqlite").close()
    progress = RunProgress(tmp_path / "outbox.sqlite", 1000).refresh()
    starting = display.Starting()
    starting.set("the local Prefect server", 4.0)
    clock[0] += 0.4
    assert starting.line(progress) == "starting: the local Prefect server; it took 4 s last time here"
    clock[0] += 2.0
    assert starting.line(progress) == "starting: the local Prefect server: 2 s so far; it took 4 s last time here"
