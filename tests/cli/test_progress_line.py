"""The progress line of `gradlab train`: most important first, and honest once the learner is done."""

from __future__ import annotations

from pathlib import Path

from gradlab.cli.train_cmds import _progress_line
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
    outbox.append("supervisor_metrics", 2048, {"metrics": {"orchestration/checkpoints/evaluated": 1,
                                                           "orchestration/checkpoints/accepted": 1}})
    outbox.append("stop_observed", 3072, {"reason": "accepted:2048"})
    outbox.append("learner_finished", 3072, {"final_step": 3072, "stop_reason": "stop_requested"})
    progress.refresh()
    assert progress.steps_per_s is None  # no rate once the learner is done
    assert _progress_line(progress) == ("step 3,072/100,000 · accepted 1 (stop: accepted:2048) · learner done, "
                                        "finishing evaluations · return 21.5 · checkpoints 1, published 1, evaluated 1")
    outbox.close()
