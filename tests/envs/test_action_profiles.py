"""Action profiles: a family fragment's named discrete actions over provider-native ones
(docs/ARCHITECTURE.md sections 3 and 4), on real stable-retro and ALE environments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.contracts.experiments import Experiments, environment_sha256
from gradlab.envs import describe, make_vector_env
from gradlab.envs.preflight import static_check
from gradlab.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
GENESIS = ("B", "A", "MODE", "START", "UP", "DOWN", "LEFT", "RIGHT", "C", "Y", "X", "Z")
SHOOTER = ["NOOP", "FIRE", "LEFT", "RIGHT", "UP", "DOWN", "LEFT_FIRE", "RIGHT_FIRE"]


def _pad(*pressed: str) -> list[int]:
    return [int(b in pressed) for b in GENESIS]


def test_the_profile_is_part_of_the_environment_contract_and_env_inspect_names_its_actions() -> None:
    resolved = Experiments().resolve("Airstriker-Genesis-v0/ppo")
    env = resolved.environment
    assert env.action_profile is not None and env.action_profile.name == "shooter"
    assert env.action_profile.meanings == SHOOTER
    without = env.model_copy(update={"action_profile": None})
    assert "action_profile" not in without.semantic()  # goals without one keep their hash
    assert resolved.hashes.environment_sha256 == environment_sha256(env) != environment_sha256(without)
    fewer = env.action_profile.model_copy(update={"actions": env.action_profile.actions[:4]})
    assert environment_sha256(env.model_copy(update={"action_profile": fewer})) != environment_sha256(env)

    out = subprocess.run([sys.executable, "-m", "gradlab.cli.app", "env", "inspect", "Airstriker-Genesis-v0", "--json"],
                         capture_output=True, text=True, cwd=REPO, env=dict(os.environ), timeout=120)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert (info["action_space"], info["n_actions"], info["action_meanings"]) == ("Discrete(8)", 8, SHOOTER)
    assert info["extra"]["action_profile"] == "shooter"
    assert info["extra"]["native_action_space"] == "MultiBinary(12)"
    assert info["extra"]["profile_actions"][6] == {"name": "LEFT_FIRE", "buttons": ["LEFT", "B"],
                                                   "native": _pad("LEFT", "B")}


def test_the_wrapper_sends_each_profile_action_as_stable_retros_button_vector() -> None:
    spec = Experiments().resolve("Airstriker-Genesis-v0/ppo", ["train.environment.n_envs=1"]).environment
    with make_vector_env(spec, seed=0) as venv:
        assert str(venv.single_action_space) == "Discrete(8)"
        assert venv.backend.native(np.array([0, 1, 7])).tolist() == [_pad(), _pad("B"), _pad("RIGHT", "B")]
        venv.reset()
        # Tapping FIRE (B on the pad) shoots enemies down within 600 steps; NOOP scores nothing.
        scores = {}
        for name in ("NOOP", "FIRE"):
            venv.reset()
            action = SHOOTER.index(name)
            scores[name] = sum(float(venv.step(np.array([action if t % 2 == 0 else 0])).raw_reward[0])
                               for t in range(600))
    assert scores["NOOP"] == 0.0 and scores["FIRE"] > 0.0


def _ale(profile: dict | None, **pre) -> EnvironmentSpec:
    return EnvironmentSpec.model_validate({
        "provider": "ale", "env_id": "Breakout", "n_envs": 2, "vectorization": "native",
        "preprocessing": {"repeat_action_probability": 0.0, "noop_max": 0, **pre},
        **({"action_profile": profile} if profile else {})})


def test_an_ale_profile_picks_actions_of_the_full_action_set() -> None:
    profile = {"name": "paddle", "actions": [{"name": "STAY", "buttons": []}, {"name": "SERVE", "buttons": ["FIRE"]},
                                             {"name": "R", "buttons": ["RIGHT"]}, {"name": "L_FIRE",
                                                                                   "buttons": ["LEFT", "FIRE"]}]}
    info = describe(_ale(profile))
    assert info.action_meanings == ["STAY", "SERVE", "R", "L_FIRE"] and info.n_actions == 4
    assert [a["native"] for a in info.extra["profile_actions"]] == [0, 1, 3, 12]  # NOOP FIRE RIGHT LEFTFIRE
    assert info.extra["action_set"] == "full"
    with make_vector_env(_ale(profile), seed=1) as prof, make_vector_env(_ale(None, full_action_space=True),
                                                                          seed=1) as full:
        assert prof.backend.native(np.array([3, 2])).tolist() == [12, 3]
        a, b = prof.reset(), full.reset()
        assert np.array_equal(a, b)
        for t in range(40):  # the same game under profile action i and full-set action native[i]
            i = np.array([t % 4, (t + 1) % 4])
            ra, rb = prof.step(i), full.step(np.array([0, 1, 3, 12])[i])
            assert np.array_equal(ra.obs, rb.obs)


def _family(experiments_copy: Path, profile_yaml: str, goal_patch: str = "action_profile: shooter") -> None:
    (experiments_copy / "goals" / "_genesis-actions.yaml").write_text(profile_yaml)
    goal = experiments_copy / "goals" / "Airstriker-Genesis-v0" / "_goal.yaml"
    text = goal.read_text()
    goal.write_text(text.replace("action_profile: shooter", goal_patch))


@pytest.mark.parametrize(("profile_yaml", "goal_patch", "key_path", "message"), [
    ("action_profiles:\n  shooter: {actions: []}\n", "action_profile: shooter",
     "action_profiles.shooter", "action profile 'shooter' is empty: expected at least one action"),
    ("action_profiles:\n  shooter:\n    actions:\n      - {name: FIRE, buttons: [B]}\n"
     "      - {name: SHOOT, buttons: [B]}\n", "action_profile: shooter",
     "action_profiles.shooter", "actions 'FIRE' and 'SHOOT' press the same buttons ['B'] (duplicate action)"),
    ("action_profiles:\n  shooter:\n    actions:\n      - {name: FIRE, buttons: [B]}\n"
     "      - {name: FIRE, buttons: [A]}\n", "action_profile: shooter",
     "action_profiles.shooter", "action name(s) ['FIRE'] appear more than once"),
    ("action_profiles:\n  shooter:\n    actions:\n      - {name: FIRE, buttonz: [B]}\n", "action_profile: shooter",
     "action_profiles.shooter.actions.0.buttonz", "unknown key"),
    ("action_profiles:\n  shooter: {actions: [{name: FIRE, buttons: [B]}]}\n", "action_profile: shootr",
     "train.environment.action_profile", "unknown action profile 'shootr'; expected one of ['shooter']"),
])
def test_a_bad_profile_is_refused_naming_the_file_and_key(experiments_copy: Path, profile_yaml: str, goal_patch: str,
                                                          key_path: str, message: str) -> None:
    _family(experiments_copy, profile_yaml, goal_patch)
    with pytest.raises(ConfigError) as info:
        Experiments().load_goal("Airstriker-Genesis-v0")
    problems = info.value.problems
    assert [(p.key_path, message in p.message) for p in problems] == [(key_path, True)], [p.render() for p in problems]
    expected_file = ("experiments/goals/Airstriker-Genesis-v0/_goal.yaml" if key_path.startswith("train")
                     else "experiments/goals/_genesis-actions.yaml")
    assert problems[0].file.endswith(expected_file) and problems[0].line is not None


def test_unknown_buttons_and_providers_without_profiles_are_refused_before_an_emulator_starts(
        experiments_copy: Path) -> None:
    _family(experiments_copy, "action_profiles:\n  shooter:\n    actions:\n      - {name: FIRE, buttons: [B]}\n"
                              "      - {name: JUMP, buttons: [JUMP, A]}\n")
    out = subprocess.run([sys.executable, "-m", "gradlab.cli.app", "validate", "--json"], capture_output=True,
                         text=True, cwd=REPO, env=dict(os.environ), timeout=120)
    assert out.returncode == 1
    errors = [e for e in json.loads(out.stdout)["errors"] if "Airstriker" in e["file"]]
    assert [(e["file"], e["key_path"]) for e in errors] == [
        ("experiments/goals/Airstriker-Genesis-v0/_goal.yaml", "train.environment.action_profile.actions.1.buttons")]
    assert "action 'JUMP': unknown button(s) ['JUMP']; expected names from ['B', 'A', 'MODE'" in errors[0]["message"]

    spec = Experiments().load_goal("Airstriker-Genesis-v0").train.environment
    with pytest.raises(ConfigError, match=r"unknown button\(s\) \['JUMP'\]"):
        make_vector_env(spec, seed=0)
    bandit = EnvironmentSpec.model_validate({"provider": "gradlab", "env_id": "Bandit-v0",
                                             "action_profile": {"name": "p", "actions": [{"name": "A", "buttons": []}]}})
    assert static_check(bandit) == [("action_profile", "gradlab:Bandit-v0: provider 'gradlab' has no action profiles "
                                     "(they map a small discrete set onto native buttons; providers with them: "
                                     "retro, ale, vizdoom)")]
    updown = _ale({"name": "p", "actions": [{"name": "UD", "buttons": ["UP", "DOWN"]}]})
    assert static_check(updown) == [("action_profile.actions.0.buttons",
                                     "ale:Breakout: action 'UD': ALE has no action pressing UP and DOWN together")]


def test_the_players_action_names_and_keys_come_from_the_profile() -> None:
    from gradlab.play.human import HumanSession

    env = Experiments().load_goal("Airstriker-Genesis-v0").eval_environment()
    session = HumanSession(env.model_dump(mode="json"), seed=0)
    try:
        assert session.action_meanings == SHOOTER
        chords = dict(zip(session.keys.meanings, session.keys.chords, strict=True))
        assert chords["LEFT_FIRE"] == frozenset({"ArrowLeft", " "}) and chords["FIRE"] == frozenset({" "})
    finally:
        session.close()


def test_a_vizdoom_profile_sends_button_vectors() -> None:
    spec = EnvironmentSpec.model_validate({
        "provider": "vizdoom", "env_id": "basic", "n_envs": 2, "vectorization": "sync",
        "action_profile": {"name": "p", "actions": [{"name": "NOOP"},
                                                    {"name": "LEFT_FIRE", "buttons": ["MOVE_LEFT", "ATTACK"]}]}})
    info = describe(spec)
    assert (info.action_meanings, info.extra["native_action_space"]) == (["NOOP", "LEFT_FIRE"], "MultiBinary(3)")
    with make_vector_env(spec, seed=0) as venv:  # basic's buttons: MOVE_LEFT, MOVE_RIGHT, ATTACK
        assert venv.backend.native(np.array([0, 1])).tolist() == [[0, 0, 0], [1, 0, 1]]
        venv.reset()
        paid = sum(venv.step(np.array([0, 1])).raw_reward for _ in range(5))
    # basic pays -1 per tic (4 tics a step), -5 a shot and +101 a kill: only the lane that pressed
    # MOVE_LEFT + ATTACK is paid other than for time.
    assert paid[0] == -20.0 and paid[1] != -20.0
