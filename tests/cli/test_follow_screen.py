"""`gradlab experiment follow` on a terminal draws the run's live screen from its outbox on this
machine; piped, or when the outbox is elsewhere, it prints today's change lines only."""

from __future__ import annotations

import pytest
from rich.console import Console

from gradlab.cli import experiment_cmds, run_display
from gradlab.outbox import Outbox
from gradlab.settings import load_settings

RUN = "gradlab-20260101T120000-0123abcd"


def _status(state: str, *, live: bool, final: bool = False) -> dict:
    return {"run_id": RUN, "prefect": {"state": state, "flow_run_id": "f1", "state_message": None, "final": final},
            "flow_runs": [],
            "stores": {"attempts": [{"attempt_id": "attempt-001", "mode": "fresh", "outcome": None}],
                       "checkpoints": [], "evaluations": [], "promotion": None, "outcome": None, "reason": None,
                       "live": {"step": 1024, "timesteps": 4096, "steps_per_s": None, "learner_done": False,
                                "checkpoints": 1, "evaluations_left": 0} if live else None}}


def _outbox() -> None:
    run_dir = load_settings().run_dir(RUN)
    run_dir.mkdir(parents=True)
    outbox = Outbox(run_dir / "outbox.sqlite")
    for i, ret in enumerate([0.0, 1.0]):
        outbox.append("metrics", 512 * (i + 1), {"metrics": {"train/episode/return/shaped/mean": ret}})
    outbox.append("checkpoint_ready", 1024, {"path": "x", "sha256": "a" * 64, "step": 1024})
    outbox.close()


def _follow(monkeypatch: pytest.MonkeyPatch, statuses: list[dict], terminal: bool) -> str:
    console = Console(record=True, width=120, force_terminal=terminal, color_system=None)
    for module in (experiment_cmds, run_display):
        monkeypatch.setattr(module, "err_console", console)
    looks = iter(statuses)
    monkeypatch.setattr(experiment_cmds, "_status", lambda client, api_url, ref: next(looks))
    monkeypatch.setattr(experiment_cmds, "POLL_S", 0.0)
    experiment_cmds._follow(None, "http://127.0.0.1:1/api", RUN)
    return console.export_text()


def test_follow_on_a_terminal_shows_the_live_screen_from_the_outbox(monkeypatch: pytest.MonkeyPatch) -> None:
    _outbox()
    text = _follow(monkeypatch, [_status("Running", live=True), _status("Completed", live=False, final=True)], True)
    assert "prefect Running" in text and "attempt-001 opened (fresh)" in text and "prefect Completed" in text
    assert f"run {RUN}" in text  # the screen's title
    assert "1,024 / 4,096 (25%)" in text and "1.00  ▁█" in text and "1 ready, 0 published" in text


def test_follow_without_the_outbox_or_piped_prints_only_the_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    statuses = [_status("Running", live=False), _status("Completed", live=False, final=True)]
    elsewhere = _follow(monkeypatch, statuses, True)  # on a terminal, outbox on another machine
    assert "prefect Running" in elsewhere and "steps/s" not in elsewhere and "╭" not in elsewhere
    _outbox()
    statuses = [_status("Running", live=True), _status("Completed", live=False, final=True)]
    piped = _follow(monkeypatch, statuses, False)
    lines = [line.split(" ", 1)[1] for line in piped.splitlines() if line.strip()]
    assert lines == ["prefect Running", "attempt-001 opened (fresh)", "prefect Completed"], piped
