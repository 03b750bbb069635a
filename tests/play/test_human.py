"""Human play without a browser: the key map from action meanings, and a recorded session whose
dataset lands with ``agent: human``, holds the actions played and re-simulates bit-exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradlab.play.human import key_map

ALE_FULL = ["NOOP", "FIRE", "UP", "RIGHT", "LEFT", "DOWN", "UPRIGHT", "UPLEFT", "DOWNRIGHT", "DOWNLEFT", "UPFIRE",
            "RIGHTFIRE", "LEFTFIRE", "DOWNFIRE", "UPRIGHTFIRE", "UPLEFTFIRE", "DOWNRIGHTFIRE", "DOWNLEFTFIRE"]


def test_cartpole_plays_turn_by_turn_with_the_arrows_and_number_keys() -> None:
    keys = key_map(["PUSH_LEFT", "PUSH_RIGHT"])
    assert keys.noop is None and keys.mode == "turn"
    assert keys.action(["ArrowLeft"]) == 0 and keys.action(["ArrowRight"]) == 1
    assert keys.action(["0"]) == 0 and keys.action(["1"]) == 1
    assert keys.action([]) is None and keys.action(["x"]) is None and keys.action(["7"]) is None
    assert keys.action(["ArrowLeft", "1"]) == 1  # a number key wins
    assert [(r["labels"], r["noop"]) for r in keys.as_json()] == [(["←", "0"], False), (["→", "1"], False)]


def test_breakout_plays_in_real_time_with_noop_when_no_key_is_held() -> None:
    keys = key_map(["NOOP", "FIRE", "RIGHT", "LEFT"])
    assert keys.noop == 0 and keys.mode == "realtime"
    assert keys.action([]) == 0 and keys.action(["q"]) == 0
    assert keys.action([" "]) == 1 and keys.action(["ArrowRight"]) == 2 and keys.action(["ArrowLeft"]) == 3
    assert keys.action(["ArrowLeft", " "]) == 1  # no LEFTFIRE: of two chords held, the lower index
    assert keys.as_json()[1]["labels"] == ["Space", "1"] and keys.as_json()[0]["noop"]


def test_the_full_ale_action_set_is_chords_of_arrows_and_space() -> None:
    keys = key_map(ALE_FULL)
    assert keys.action(["ArrowUp", "ArrowRight"]) == ALE_FULL.index("UPRIGHT")
    assert keys.action(["ArrowRight", "ArrowUp"]) == ALE_FULL.index("UPRIGHT")  # order of press does not matter
    assert keys.action(["ArrowDown", "ArrowLeft", " "]) == ALE_FULL.index("DOWNLEFTFIRE")
    assert keys.action(["ArrowLeft", "ArrowRight"]) == ALE_FULL.index("RIGHT")  # no chord: the lower index of the two
    assert keys.action(["9"]) == 9 and keys.action([]) == 0
    assert keys.as_json()[14]["labels"] == ["↑+→+Space"]  # past 9: no number key


def test_meanings_without_direction_words_play_by_number_keys_only() -> None:
    keys = key_map(["ARM_0", "ARM_1", "ARM_2", "ARM_3"])
    assert keys.mode == "turn" and keys.action(["2"]) == 2 and keys.action(["ArrowLeft"]) is None
    assert [r["labels"] for r in keys.as_json()] == [["0"], ["1"], ["2"], ["3"]]
    twice = key_map(["LEFT", "PUSH_LEFT"])  # the second LEFT gets its number key only
    assert twice.action(["ArrowLeft"]) == 0 and twice.as_json()[1]["keys"] == []


def test_a_recorded_human_session_lands_with_its_actions_and_verifies(gradlab_home: Path) -> None:
    from gradlab.datasets.plan import plan_recording
    from gradlab.datasets.store import fetch_dataset, load_steps, read_dataset
    from gradlab.datasets.verify import verify_dataset
    from gradlab.errors import ContractViolation
    from gradlab.play.human import HumanSession
    from gradlab.stores import open_dataset_store

    plan = plan_recording("me-cartpole", goal_id="CartPole-v1", policy="human", episodes=2, frames=False)
    assert len(plan.chunks) == 1 and plan.agent.kind == "human"
    session = HumanSession(plan.environment, plan=plan.model_dump(mode="json"))
    played: list[list[int]] = [[]]
    ends = []
    try:
        first = session.reset()
        assert first.t == 0 and first.action is None and session.recording["landed"] == 0
        while session.published is None:
            action = 1 if len(played[-1]) % 3 else 0
            report = session.act(action)
            played[-1].append(action)
            if report.episode is not None:
                ends.append(report.episode)
                played.append([])
        with pytest.raises(ContractViolation, match="every planned episode is recorded"):
            session.act(0)
    finally:
        session.close()
    assert [e["recording"]["landed"] for e in ends] == [1, 2]
    assert ends[0]["recording"]["published"] is None and ends[1]["recording"]["published"] is not None
    store = open_dataset_store()
    manifest = read_dataset(store, "me-cartpole")
    assert manifest.agent.kind == "human" and manifest.agent.input_device == "keyboard"
    assert [e.seed for e in manifest.episodes] == [e.seed for e in plan.episodes]  # the goal's eval manifest
    folder = fetch_dataset(store, manifest, gradlab_home / "cache")
    for episode, actions in zip(manifest.episodes, played, strict=False):
        assert load_steps(folder, episode)["actions"].tolist() == actions
    report = verify_dataset(store, "me-cartpole", cache=gradlab_home / "cache")
    assert report.ok and report.episodes_replayed == 2 and not report.divergences


def test_human_play_refuses_a_goal_without_discrete_actions(gradlab_home: Path) -> None:
    from gradlab.contracts import Experiments
    from gradlab.errors import ContractViolation
    from gradlab.play.human import HumanSession

    environment = Experiments().load_goal("MountainCar-v0").eval_environment().model_dump(mode="json")
    environment = {**environment, "env_id": "MountainCarContinuous-v0"}
    with pytest.raises(ContractViolation, match="needs a Discrete action space, found Box"):
        HumanSession(environment)
