"""The live screen of a run on a terminal, rendered from a real outbox as a person reads it."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from gradlab.cli.run_screen import SPARK, run_screen, sparkline
from gradlab.outbox import Outbox
from gradlab.runs.progress import RETURN_HISTORY, RunProgress


def test_sparkline_scales_between_min_and_max() -> None:
    assert sparkline([0.0, 1.0, 0.5]) == "▁█▅"
    assert sparkline([2.0, 2.0]) == SPARK[3] * 2
    assert sparkline([]) == ""


def test_screen_shows_step_rate_return_losses_evaluations_and_stop(tmp_path: Path) -> None:
    run_dir = tmp_path / "gradlab-screen-run"
    run_dir.mkdir()
    outbox = Outbox(run_dir / "outbox.sqlite")
    for i, ret in enumerate([0.0, 0.5, 1.0]):
        outbox.append("metrics", 512 * (i + 1), {"metrics": {"train/episode/return/shaped/mean": ret,
                                                             "train/algorithm/ppo/update/loss": 0.25,
                                                             "train/algorithm/ppo/update/value_loss": 0.125}})
    outbox.append("checkpoint_ready", 1024, {"path": "x", "sha256": "a" * 64, "step": 1024})
    outbox.append("supervisor_metrics", 1024, {"metrics": {
        "eval/checkpoint_step": 1024, "eval/episode/return/mean": 0.5, "eval/episode/return/std": 0.5,
        "eval/acceptance/episodes/completed": 100, "eval/outcome/success/rate": 0.5,
        "eval/outcome/success/rate_ci95_low": 0.4, "eval/outcome/success/rate_ci95_high": 0.6,
        "eval/acceptance/pass": 0.0, "orchestration/eval/seconds": 2.5,
        "orchestration/checkpoints/published": 1, "orchestration/checkpoints/evaluated": 1,
        "orchestration/checkpoints/accepted": 0}})
    outbox.append("stop_observed", 1536, {"reason": "budget"})
    progress = RunProgress(run_dir / "outbox.sqlite", 16384).refresh()
    console = Console(record=True, width=100)
    console.print(run_screen(progress))
    text = console.export_text()
    assert "run gradlab-screen-run" in text
    assert "1,536 / 16,384 (9%)" in text
    assert "steps/s" in text and "time left" in text
    assert "1.00  ▁▅█" in text  # the recent return and its history
    assert "loss 0.25  value 0.125" in text
    assert "1 ready, 1 published, 1 evaluated, 0 accepted" in text
    # 1.96 * 0.5 / sqrt(100) = 0.098: the return's normal 95% interval; the Wilson one as written.
    assert "1,024" in text and "0.50 ± 0.10" in text and "0.50 [0.40, 0.60]" in text and "rejected" in text
    assert "budget" in text
    outbox.close()


def test_return_history_is_bounded(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite")
    for i in range(RETURN_HISTORY + 10):
        outbox.append("metrics", i + 1, {"metrics": {"train/episode/return/shaped/mean": float(i)}})
    progress = RunProgress(tmp_path / "outbox.sqlite", 1000).refresh()
    assert len(progress.returns) == RETURN_HISTORY and progress.returns[0] == 10.0
    outbox.close()
