"""`gradlab experiment`'s pure helpers: durations, run references, UI URLs, what `follow` prints."""

from __future__ import annotations

import uuid

import pytest

from gradlab.cli.experiment_cmds import _changes
from gradlab.cli.prefect_runs import gradlab_run_id, is_flow_run_id, parse_duration, ui_url
from gradlab.errors import ConfigError

RUN = "gradlab-20260101T120000-0123abcd"


@pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("5m", 300.0), ("1.5h", 5400.0),
                                               ("2d", 172800.0), ("500ms", 0.5), (" 3 m ", 180.0)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "-1s", "5 minutes", "1h30m", "s"])
def test_parse_duration_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ConfigError, match="expected a duration like 90, 90s, 5m, 1h"):
        parse_duration(text)


def test_run_references_and_ui_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.client.schemas.objects import FlowRun

    flow_run_id = uuid.UUID("7d0c4b52-3f1e-4c7b-9a59-0b8a3c6f1e2d")
    assert is_flow_run_id(str(flow_run_id)) and not is_flow_run_id(RUN)
    by_param = FlowRun(id=flow_run_id, flow_id=uuid.uuid4(), parameters={"run_id": RUN}, tags=["gradlab"])
    by_tag = FlowRun(flow_id=uuid.uuid4(), parameters={"recipe": "gradlab__bandit/ppo"}, tags=["gradlab", "local", RUN])
    untagged = FlowRun(flow_id=uuid.uuid4(), parameters={"recipe": "gradlab__bandit/ppo"},
                       tags=["gradlab", "gradlab-20260101T120000-xyz"])  # not a run id: wrong hex
    assert [gradlab_run_id(fr) for fr in (by_param, by_tag, untagged)] == [RUN, RUN, None]

    monkeypatch.delenv("PREFECT_UI_URL", raising=False)
    assert ui_url("http://127.0.0.1:4200/api", flow_run_id) == f"http://127.0.0.1:4200/runs/flow-run/{flow_run_id}"
    monkeypatch.setenv("PREFECT_UI_URL", "https://prefect.example.org/")
    assert ui_url("http://127.0.0.1:4200/api", flow_run_id) == f"https://prefect.example.org/runs/flow-run/{flow_run_id}"


def _status(state: str, checkpoints=(), evaluations=(), promotion=None, outcome=None, attempts=("fresh",)) -> dict:
    return {"prefect": {"state": state, "flow_run_id": "f1", "state_message": None},
            "stores": {"attempts": [{"attempt_id": f"attempt-{i + 1:03d}", "mode": m, "outcome": None}
                                    for i, m in enumerate(attempts)],
                       "checkpoints": [{"step": s, "sha256": f"{s:012x}" + "f" * 52, "uri": ""} for s in checkpoints],
                       "evaluations": [{"checkpoint_step": s, "status": st, "return_mean": r} for s, st, r in evaluations],
                       "promotion": {"checkpoint_step": promotion} if promotion is not None else None,
                       "outcome": outcome, "reason": "done" if outcome else None}}


def test_follow_prints_each_change_once() -> None:
    first = {"prefect": {"state": "Scheduled", "flow_run_id": "f1", "state_message": None}, "stores": None}
    assert _changes(None, first) == ["prefect Scheduled"]
    running = _status("Running", checkpoints=[2048])
    assert _changes(first, running) == ["prefect Running", "attempt-001 opened (fresh)",
                                        f"checkpoint step 2048 published ({2048:012x})"]
    assert _changes(running, running) == []  # nothing new, nothing printed
    evaluated = _status("Running", checkpoints=[2048, 4096], evaluations=[(2048, "accepted", 1.0)])
    assert _changes(running, evaluated) == [f"checkpoint step 4096 published ({4096:012x})",
                                            "evaluation of step 2048: accepted, mean return 1.00"]
    done = _status("Completed", checkpoints=[2048, 4096], evaluations=[(2048, "accepted", 1.0)], promotion=2048,
                   outcome="succeeded")
    assert _changes(evaluated, done) == ["prefect Completed", "promoted step 2048", "receipt: succeeded: done"]


def test_status_says_where_the_run_is_and_what_it_proved(capsys: pytest.CaptureFixture[str]) -> None:
    from gradlab.cli.experiment_cmds import _render_status

    status = _status("Completed", checkpoints=[2048, 4096], evaluations=[(2048, "accepted", 1.0), (4096, "rejected", 0.4)],
                     promotion=2048, outcome="succeeded", attempts=("fresh", "resume"))
    status["stores"] |= {"goal_id": "gradlab__bandit", "recipe_id": "ppo", "seed": 3, "final_step": 4096}
    status["prefect"] |= {"deployment": "training-run/local", "ui_url": "http://127.0.0.1:4200/runs/flow-run/f1"}
    _render_status({"run_id": RUN, "prefect": status["prefect"], "flow_runs": [status["prefect"]] * 2,
                    "stores": status["stores"]})
    lines = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert lines == [
        f"{RUN} gradlab__bandit/ppo seed 3",
        "  prefect: Completed; flow run f1 (training-run/local), 2 flow run(s)",
        "  ui: http://127.0.0.1:4200/runs/flow-run/f1",
        "  attempt-001 (fresh): running (no receipt yet)",
        "  attempt-002 (resume): running (no receipt yet)",
        "  checkpoints: 2 published (steps 2048, 4096)",
        "  evaluations: 1 accepted, 1 rejected",
        "  last evaluation: step 4096 rejected (return mean 0.40)",
        "  promotion: step 2048",
        "  outcome: succeeded: done (final step 4096)",
    ]


def test_status_of_a_running_run_shows_its_step_rate_and_last_evaluation(capsys: pytest.CaptureFixture[str]) -> None:
    from gradlab.cli.experiment_cmds import _render_status

    status = _status("Running", checkpoints=[2048], evaluations=[(2048, "rejected", 0.25)])
    status["stores"] |= {"goal_id": "gradlab__bandit", "recipe_id": "ppo", "seed": 0, "final_step": None,
                         "live": {"step": 3072, "timesteps": 16384, "steps_per_s": 1234.5, "learner_done": False,
                                  "checkpoints": 1, "evaluations_left": 0}}
    status["prefect"] |= {"deployment": "training-run/local", "ui_url": "u"}
    _render_status({"run_id": RUN, "prefect": status["prefect"], "flow_runs": [status["prefect"]],
                    "stores": status["stores"]})
    lines = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert "  attempt-001 (fresh): running (no receipt yet)" in lines
    assert "  training: step 3,072/16,384 (1,234 steps/s)" in lines
    assert "  last evaluation: step 2048 rejected (return mean 0.25)" in lines
