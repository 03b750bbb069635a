"""W&B: the runs of a cohort share a group (the cohort id); the project is the goal's family by default."""

from __future__ import annotations

from pathlib import Path

from gradlab.contracts import Experiments
from gradlab.contracts.run_spec import RunSpec
from gradlab.metrics.wandb_sink import WandbSink, wandb_project


def _spec(ref: str, overrides: list[str] | None = None) -> RunSpec:
    return RunSpec.from_resolved(Experiments().resolve(ref, overrides or []), seed=0,
                                 run_id="gradlab-20260101T000000-0000beef")


def test_project_is_the_goal_family_unless_configured() -> None:
    assert wandb_project(None, _spec("gradlab__bandit/ppo")) == "smoke"
    assert wandb_project(None, _spec("CartPole-v1/ppo")) == "classic-control"
    assert wandb_project("mine", _spec("CartPole-v1/ppo")) == "mine"  # GRADLAB_WANDB_PROJECT wins
    assert wandb_project(None, _spec("CartPole-v1/ppo", ["logging.wandb_project=lab"])) == "lab"


def test_cohort_runs_share_a_wandb_group(tmp_path: Path) -> None:
    runs = []
    for i in range(2):
        sink = WandbSink(f"gradlab-20260101T000000-0000aa0{i}", "offline", tmp_path / f"run{i}", "smoke",
                         group="cohort-20260101T000000-0000abcd", name=f"gradlab__bandit__ppo__s{i}__0000aa0{i}")
        assert sink.status == "ok", sink.error
        runs.append((sink._run.group, sink._run.project, sink._run.name))
        sink.finish()
    assert runs == [("cohort-20260101T000000-0000abcd", "smoke", f"gradlab__bandit__ppo__s{i}__0000aa0{i}") for i in range(2)]
