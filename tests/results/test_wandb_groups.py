"""W&B: the runs of a cohort share a group (the leaders' cohort key); the project is the goal's family by default."""

from __future__ import annotations

from pathlib import Path

from gradlab.contracts import Experiments
from gradlab.contracts.run_spec import RunSpec
from gradlab.metrics.wandb_sink import WandbSink, read_offline_run, wandb_project
from gradlab.results.cohorts import cohort_group


def _spec(ref: str, overrides: list[str] | None = None) -> RunSpec:
    return RunSpec.from_resolved(Experiments().resolve(ref, overrides or []), seed=0,
                                 run_id="gradlab-20260101T000000-0000beef")


def test_project_is_the_goal_family_unless_configured() -> None:
    assert wandb_project(None, _spec("gradlab__bandit/ppo")) == "smoke"
    assert wandb_project(None, _spec("CartPole-v1/ppo")) == "classic-control"
    assert wandb_project("mine", _spec("CartPole-v1/ppo")) == "mine"  # GRADLAB_WANDB_PROJECT wins
    assert wandb_project(None, _spec("CartPole-v1/ppo", ["logging.wandb_project=lab"])) == "lab"


def test_the_wandb_group_is_the_leaders_cohort_key() -> None:
    # The leaders count runs by (goal, recipe, canonical overrides): the same key, in any override order.
    assert cohort_group("gradlab__bandit", "ppo", []) == "gradlab__bandit/ppo"
    assert cohort_group("gradlab__bandit", "ppo", ["train.timesteps=4096", "seed_note = a", "train.timesteps=2048"]) == \
        cohort_group("gradlab__bandit", "ppo", ["seed_note=a", "train.timesteps=2048"]) == \
        "gradlab__bandit/ppo [seed_note=a, train.timesteps=2048]"
    long = [f"train.backend.config.key_{i}={i}" for i in range(8)]
    group = cohort_group("CartPole-v1", "ppo", long)
    assert len(group) <= 128 and group.startswith("CartPole-v1/ppo [overrides sha256:")
    assert group == cohort_group("CartPole-v1", "ppo", list(reversed(long))) != cohort_group("CartPole-v1", "ppo", long[1:])


def test_cohort_runs_share_a_wandb_group(tmp_path: Path) -> None:
    group = cohort_group("gradlab__bandit", "ppo", ["train.timesteps=4096"])
    runs = []
    for i in range(2):
        run_id = f"gradlab-20260101T000000-0000aa0{i}"
        sink = WandbSink(run_id, "offline", tmp_path / f"run{i}", "smoke", group=group, tags=["cohort-20260101T000000-0000abcd"],
                         name=f"gradlab__bandit__ppo__s{i}__0000aa0{i}")
        assert sink.status == "ok", sink.error
        sink.finish()
        runs.append(read_offline_run(tmp_path / f"run{i}", run_id))  # what W&B recorded, read back from its files
    assert runs == [{"run_id": f"gradlab-20260101T000000-0000aa0{i}", "project": "smoke", "group": group,
                     "name": f"gradlab__bandit__ppo__s{i}__0000aa0{i}", "tags": ["cohort-20260101T000000-0000abcd"]}
                    for i in range(2)]
