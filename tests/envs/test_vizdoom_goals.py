"""The ViZDoom scenario set as goals: each passes preflight, its ``ppo`` recipe trains, and the task
contracts read the scenarios right (deaths are failures, kills and survival are successes, the
time limits truncate).

Every goal runs on its real scenario, through the environment ``gradlab env preflight GOAL/ppo``
builds and through gradlab.ppo's real learner, on four lanes and 2,048 steps (several updates).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradlab.contracts.experiments import Experiments
from gradlab.contracts.run_spec import RunSpec
from gradlab.envs import make_vector_env
from gradlab.envs.preflight import preflight
from gradlab.envs.providers.vizdoom import scenario_names
from gradlab.learn.learner import run_learner
from gradlab.outbox import Outbox

#: Goal -> its bundled scenario: every scenario ViZDoom ships for one player.
GOALS = {
    "VizdoomBasic-v1": "basic",
    "VizdoomDefendCenter-v1": "defend_the_center",
    "VizdoomDefendLine-v1": "defend_the_line",
    "VizdoomDeadlyCorridor-v1": "deadly_corridor",
    "VizdoomHealthGathering-v1": "health_gathering",
    "VizdoomHealthGatheringSupreme-v1": "health_gathering_supreme",
    "VizdoomMyWayHome-v1": "my_way_home",
    "VizdoomPredictPosition-v1": "predict_position",
    "VizdoomTakeCover-v1": "take_cover",
}
#: Four lanes, 16 updates of 4 x 32 steps, one epoch of one minibatch: the cheapest 2,048-step run
#: (fewer lanes cost more batched policy calls than the engines they save).
SMALL = ["train.timesteps=2048", "train.checkpoint_freq=2048", "train.environment.n_envs=4",
         "train.backend.config.n_steps=32", "train.backend.config.batch_size=128", "train.backend.config.n_epochs=1",
         "train.backend.config.threads=1", "train.device=cpu"]


def test_every_single_player_scenario_vizdoom_ships_has_a_goal_in_the_catalog() -> None:
    experiments = Experiments()
    shipped = {"basic", "deadly_corridor", "defend_the_center", "defend_the_line", "health_gathering",
               "health_gathering_supreme", "my_way_home", "predict_position", "take_cover"}
    assert shipped <= set(scenario_names())
    assert set(GOALS.values()) == shipped
    assert {g: experiments.load_goal(g).train.environment.env_id for g in GOALS} == GOALS
    # `gradlab goals list` shows each under the vizdoom project (no goal outside every project).
    catalog = experiments.catalog
    assert {g: catalog.project_of(g) for g in experiments.goal_ids() if g.startswith("Vizdoom")} == dict.fromkeys(
        GOALS, "vizdoom")


@pytest.mark.parametrize("goal", list(GOALS))
def test_goal_passes_preflight_and_its_ppo_recipe_trains_2048_steps(goal: str, tmp_path: Path) -> None:
    resolved = Experiments().resolve(f"{goal}/ppo", SMALL)
    assert resolved.recipe.train.backend.id == "gradlab.ppo"
    # `gradlab env preflight GOAL/ppo --set train.environment.n_envs=1 --steps 64`: one engine is enough.
    report = preflight(resolved.environment.model_copy(update={"n_envs": 1}), steps=64, seed=0, target=f"{goal}/ppo")
    assert report.ok, [c for c in report.checks if not c["ok"]]
    assert report.obs_shape == [4, 84, 84] and report.steps == 64
    spec = RunSpec.from_resolved(resolved, seed=0)
    result = run_learner(spec, tmp_path / "run", watch_parent=False)
    assert (result.final_step, result.stop_reason) == (2048, "budget")
    assert len(result.checkpoints) == 1 and Path(result.checkpoints[0]).exists()
    events = Outbox(tmp_path / "run" / "outbox.sqlite").read(limit=10_000)
    updates = [e.payload["metrics"]["train/algorithm/ppo/update/count"] for e in events
               if e.kind == "metrics" and "train/algorithm/ppo/update/count" in e.payload["metrics"]]
    assert updates and updates[-1] == 16.0  # 2,048 steps / (4 lanes x 32 steps), one minibatch each


def _play(goal: str, action: int, *, max_steps: int, first: int | None = None) -> tuple[list, list[bool], list[bool], dict]:
    """One lane of ``goal``'s training environment pressing ``action`` every step (``first`` on the
    first step, when given) until its first episode ends: (episode records, terminated flags,
    truncated flags, the last step's info)."""
    spec = Experiments().load_goal(goal).train.environment.model_copy(update={"n_envs": 1})
    with make_vector_env(spec, seed=0) as venv:
        venv.reset()
        terminated, truncated = [], []
        for t in range(max_steps):
            res = venv.step(np.array([first if t == 0 and first is not None else action]))
            terminated.append(bool(res.terminated[0]))
            truncated.append(bool(res.truncated[0]))
            if res.episodes:
                return res.episodes, terminated, truncated, res.infos[0]
    raise AssertionError(f"{goal}: no episode ended in {max_steps} steps of action {action}")


# Action 0 is the profile's FORWARD (walk) or NOOP (corridor), or no button (the provider's default).
@pytest.mark.parametrize(("goal", "action", "outcome", "reason", "steps"), [
    # Turning on the spot in the acid dies after 385 tics (96 steps): a survival goal's failure.
    ("VizdoomHealthGathering-v1", 1, "failure", "native_terminated", 96),
    # Monsters at skill 5 kill a player who stands still: the died event, not the vest.
    ("VizdoomDeadlyCorridor-v1", 0, "failure", "died", None),
    # Fireballs kill a player who does not dodge.
    ("VizdoomTakeCover-v1", 0, "failure", "native_terminated", None),
    # No rocket fired: the 300-tic limit truncates 75 steps in (frame skip 4).
    ("VizdoomPredictPosition-v1", 0, "timeout", "native_time_limit", 75),
    # Turning on the spot never finds the vest: 2,100 tics truncate at 525 steps.
    ("VizdoomMyWayHome-v1", 1, "timeout", "native_time_limit", 525),
])
def test_task_contracts_end_episodes_as_the_scenarios_do(goal: str, action: int, outcome: str, reason: str,
                                                         steps: int | None) -> None:
    episodes, terminated, truncated, info = _play(goal, action, max_steps=600)
    (episode,) = episodes
    assert (episode.outcome, episode.reason) == (outcome, reason)
    if steps is not None:
        assert episode.length == steps
    # A death is a termination (never bootstrapped); a time limit is a truncation (bootstrapped).
    assert (terminated[-1], truncated[-1]) == ((True, False) if outcome == "failure" else (False, True))
    assert not any(terminated[:-1]) and not any(truncated[:-1])
    # The ending step's info is read from the game too: the death shows as no health left (these
    # three scenarios list HEALTH).
    if outcome == "failure":
        assert info["dead"] is True and info["health"] <= 0.0
    else:
        assert info["dead"] is False


def test_a_kill_is_a_success_read_from_the_kill_count() -> None:
    """predict_position ends with its one rocket, hit or miss; the kill count tells the two apart.
    The same contract on defend_the_center (monsters walk up to a player firing straight ahead)
    ends the episode at the first kill, before the scenario does."""
    spec = Experiments().load_goal("VizdoomPredictPosition-v1").train.environment
    center = spec.model_copy(update={"env_id": "defend_the_center", "n_envs": 1})
    with make_vector_env(center, seed=0) as venv:
        venv.reset()
        for _ in range(500):  # defend_the_center's buttons: TURN_LEFT, TURN_RIGHT, ATTACK (action 3)
            res = venv.step(np.array([3]))
            if res.episodes:
                break
    (episode,) = res.episodes
    assert (episode.outcome, episode.reason, bool(res.terminated[0])) == ("success", "killed", True)
    # Firing as soon as the launcher is up (the first step's press is not taken) misses the monster
    # walking in from the side: the rocket's end, 15 steps in, is a failure.
    episodes, terminated, _, info = _play("VizdoomPredictPosition-v1", 3, max_steps=100, first=0)
    assert episodes[0].length == 15
    assert (episodes[0].outcome, episodes[0].reason, terminated[-1]) == ("failure", "native_terminated", True)
    assert info["killcount"] == 0.0 and info["dead"] is False
