"""The Super Mario Bros. family (stable-retro's SuperMarioBros-Nes-v0), tested without its ROM.

The ROM is the user's and is not here, so every check that would need the game runs the family's
own contract on what is here: the composed goals from the repository's files, the family's task
program (RAM signals, events, named reward shapes) driven over scripted Mario traces and over the
bundled Airstriker emulator, the NES action profile decoded by stable-retro's own code, and the
"ROM missing" path of ``validate``, ``goals list`` and ``train``.
"""

from __future__ import annotations

import functools
import json
import types
from pathlib import Path

import numpy as np
import pytest

from gradlab.contracts import Experiments
from gradlab.contracts.experiments import environment_sha256
from gradlab.envs import make_vector_env
from gradlab.envs.registry import get_provider
from gradlab.envs.task import TaskRunner, signal_array
from tests.cli.test_contract_commands import gradlab

REPO = Path(__file__).resolve().parents[2]
FAMILY = "SuperMarioBros-Nes-v0"
GOALS = [f"{FAMILY}/Level1-1", f"{FAMILY}/Level1-1-no-stall", f"{FAMILY}/Levels_1-1_2-1"]


@pytest.fixture(scope="module")
def experiments() -> Experiments:
    return Experiments(REPO / "experiments")


def test_the_family_composes_signals_shapes_profile_and_starts(experiments: Experiments) -> None:
    goals = {g: experiments.load_goal(g) for g in GOALS}
    for goal_id, goal in goals.items():
        env = goal.train.environment
        assert (env.provider, env.env_id, env.preprocessing["state"]) == ("retro", FAMILY, "Level1-1"), goal_id
        assert env.task.signals["x"].byte_addresses() == (0x6D, 0x86)
        assert env.task.signals["float"].byte_addresses() == (0x1D,)
        assert sorted(env.task.reward.terms) == ["death", "flag", "progress", "time_cost"]
        assert env.task.reward.reward_scale == 15.0
        assert [a.name for a in env.action_profile.actions] == [
            "NOOP", "RIGHT", "RIGHT_JUMP", "RIGHT_RUN", "RIGHT_RUN_JUMP", "JUMP", "LEFT"]
    assert goals[f"{FAMILY}/Level1-1"].title == "Super Mario Bros., level 1-1"
    assert goals[f"{FAMILY}/Level1-1-no-stall"].train.environment.task.termination.failure == ["died", "stalled"]
    assert goals[f"{FAMILY}/Levels_1-1_2-1"].eval.starts == ["Level1-1", "Level2-1"]
    # The named starts are stable-retro's save states for the game (known without the ROM).
    starts = get_provider("retro").static_starts(goals[f"{FAMILY}/Level1-1"].train.environment)
    assert {"Level1-1", "Level2-1"} <= set(starts)
    # The action profile is part of the environment contract.
    env = goals[f"{FAMILY}/Level1-1"].train.environment
    right_only = env.model_copy(update={"action_profile": env.action_profile.model_copy(
        update={"name": "right_only", "actions": env.action_profile.actions[:5]})})
    assert environment_sha256(right_only) != environment_sha256(env)


def test_the_nes_profile_is_the_button_vector_stable_retro_decodes() -> None:
    """One entry per NES pad slot, the empty slot included: stable-retro's own decoding names the
    profile's buttons back (a vector without the empty slot would press the wrong buttons)."""
    import stable_retro as retro
    from stable_retro.data import EMU_INFO

    from gradlab.envs.action_profile import native_table

    spec = Experiments(REPO / "experiments").load_goal(f"{FAMILY}/Level1-1").train.environment
    table = native_table(get_provider("retro"), spec)
    slots = EMU_INFO["Nes"]["buttons"]
    assert table.shape == (7, len(slots)) == (7, 9)
    core = types.SimpleNamespace(players=1, use_restricted_actions=retro.Actions.ALL, num_buttons=len(slots),
                                 buttons=slots)
    core.action_to_array = functools.partial(retro.RetroEnv.action_to_array, core)
    decoded = [sorted(retro.RetroEnv.get_action_meaning(core, row)) for row in table]
    assert decoded == [sorted(a.buttons) for a in spec.action_profile.actions]
    assert decoded[4] == ["A", "B", "RIGHT"]


def _mario_runner(experiments: Experiments, goal_id: str, n: int = 2) -> TaskRunner:
    runner = TaskRunner(experiments.load_goal(goal_id).train.environment.task, n)
    runner.reset_lanes(list(range(n)), [None] * n, _signals(x=[40] * n, flt=[0] * n, lives=[2] * n, time=[400] * n))
    return runner


def _signals(*, x, flt, lives, time) -> dict[str, np.ndarray]:
    n = len(x)
    return {"x": signal_array(x, n), "float": signal_array(flt, n), "lives": signal_array(lives, n),
            "time": signal_array(time, n)}


def test_the_familys_task_program_ends_at_the_flag_or_a_lost_life_and_pays_its_shapes(experiments) -> None:
    runner = _mario_runner(experiments, f"{FAMILY}/Level1-1")
    no = np.zeros(2, dtype=bool)
    raw = np.zeros(2)
    # Lane 0 runs right (40 -> 52 -> 50 -> 70), then slides down the flagpole; lane 1 loses a life.
    trace = [([52, 44], [0, 0], [2, 2]), ([50, 44], [0, 0], [2, 2]), ([70, 44], [0, 0], [2, 1])]
    steps = [runner.step(raw, no, no, _signals(x=x, flt=f, lives=li, time=[399, 399])) for x, f, li in trace]
    comps = [{k: v.tolist() for k, v in s.components.items()} for s in steps]
    assert [c["progress"] for c in comps] == [[12.0, 4.0], [0.0, 0.0], [15.0, 0.0]]  # clipped at 15 a step
    assert all(c["time_cost"] == [-0.1, -0.1] for c in comps)
    assert comps[2]["death"] == [0.0, -15.0]
    for s in steps:  # the terms sum, then the divisor 15, then [-1, 1]
        total = np.sum(list(s.components.values()), axis=0)
        np.testing.assert_allclose(s.reward, np.clip(total / 15.0, -1, 1), rtol=1e-6)
    (lost,) = steps[2].episodes
    assert (lost.lane, lost.outcome, lost.reason) == (1, "failure", "died")
    assert lost.progress == {"x": 44.0, "time": 399.0, "lives": 1.0}
    runner.reset_lanes([1], [None], _signals(x=[40], flt=[0], lives=[1], time=[400]))
    flag = runner.step(raw, no, no, _signals(x=[72, 40], flt=[3, 0], lives=[2, 1], time=[398, 400]))
    (won,) = flag.episodes
    assert (won.lane, won.outcome, won.reason) == (0, "success", "flag")
    assert flag.components["flag"].tolist() == [15.0, 0.0]


def test_no_stall_ends_an_episode_that_makes_no_progress_for_100_steps(experiments) -> None:
    runner = _mario_runner(experiments, f"{FAMILY}/Level1-1-no-stall", n=1)
    no = np.zeros(1, dtype=bool)
    ended = []
    for t in range(1, 200):
        step = runner.step(np.zeros(1), no, no, _signals(x=[41], flt=[0], lives=[2], time=[400 - t // 6]))
        if step.episodes:
            ended.append((t, step.episodes[0].outcome, step.episodes[0].reason))
            break
    # x moves once (40 -> 41) on step 1 and then stays: the 100th unchanged step (step 101) ends it.
    assert ended == [(101, "failure", "stalled")]
    plain = _mario_runner(experiments, f"{FAMILY}/Level1-1", n=1)
    assert not any(plain.step(np.zeros(1), no, no, _signals(x=[41], flt=[0], lives=[2], time=[400])).episodes
                   for _ in range(150))


def test_the_familys_ram_signals_read_a_real_emulator(experiments) -> None:
    """The family's task program, unchanged, on the bundled Airstriker emulator: ``x`` is the
    two-byte number of RAM 0x6D (high) and 0x86 (low) after each step, and the progress shape
    pays only new maxima of it."""
    mario = experiments.load_goal(f"{FAMILY}/Level1-1").train.environment
    spec = mario.model_copy(update={"env_id": "Airstriker-Genesis-v0", "action_profile": None, "n_envs": 1,
                                    "vectorization": "sync", "preprocessing": {**mario.preprocessing, "state": None}})
    rng = np.random.default_rng(0)
    with make_vector_env(spec, seed=0) as venv:
        venv.reset()
        ram = venv.backend.ram()
        best = ram[0, 0x6D] * 256.0 + ram[0, 0x86]
        seen = set()
        for _ in range(120):
            res = venv.step(rng.integers(0, venv.single_action_space.n, size=1))
            if res.episodes:
                break
            ram = venv.backend.ram()
            x = ram[0, 0x6D] * 256.0 + ram[0, 0x86]
            seen.add(x)
            assert res.signals["x"].tolist() == [x]
            assert res.signals["float"].tolist() == [float(ram[0, 0x1D])]
            assert res.components["progress"].tolist() == [float(np.clip(max(0.0, x - best), 0.0, 15.0))]
            best = max(best, x)
            np.testing.assert_allclose(res.reward, np.clip(sum(res.components.values()) / 15.0, -1, 1), rtol=1e-6)
    assert len(seen) > 1  # the bytes moved: the reading was exercised on changing RAM


def test_without_the_rom_validate_passes_and_says_what_is_missing_and_train_refuses(tmp_path: Path) -> None:
    home = {"GRADLAB_HOME": str(tmp_path / "home")}
    out = gradlab("validate", "--json", env=home)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["errors"] == []
    missing = {m["message"].split(":")[0]: m for m in report["missing"]}
    assert set(missing) == {f"goal {g}" for g in GOALS}
    for m in missing.values():
        assert m["file"] == f"experiments/goals/{FAMILY}/_goal-common.yaml" and m["key_path"] == "train.environment.env_id"
        assert "no ROM for this game" in m["message"] and "gradlab rom import PATH" in m["message"]
    text = gradlab("validate", env=home)
    assert text.returncode == 0 and "3 goal(s) need a file this machine lacks" in text.stdout
    assert "missing here:" in text.stderr and "gradlab rom import" in text.stderr
    rows = {r["goal_id"]: r for r in json.loads(gradlab("goals", "list", "--json", env=home).stdout)}
    assert all(len(rows[g]["missing"]) == 1 and "gradlab rom import" in rows[g]["missing"][0] for g in GOALS)
    assert rows["Airstriker-Genesis-v0"]["missing"] == []  # bundled with stable-retro
    train = gradlab("train", f"{FAMILY}/Level1-1/ppo", env=home)
    assert train.returncode == 1 and "no ROM for this game" in train.stderr and "gradlab rom import" in train.stderr
    assert not (tmp_path / "home" / "runs").exists()


def test_an_unknown_save_state_or_start_is_refused_without_the_rom(experiments_copy: Path, tmp_path: Path) -> None:
    family = experiments_copy / "goals" / FAMILY
    common = family / "_goal-common.yaml"
    common.write_text(common.read_text().replace("state: Level1-1", "state: Level1-2"))
    two = family / "Levels_1-1_2-1" / "_goal.yaml"
    two.write_text(two.read_text().replace("starts: [Level1-1, Level2-1]", "starts: [Level1-1, Level9-9]"))
    out = gradlab("validate", "--json", env={"GRADLAB_HOME": str(tmp_path / "home")})
    assert out.returncode == 1
    errors = json.loads(out.stdout)["errors"]
    state = [e for e in errors if e["key_path"] == "train.environment.preprocessing.state"]
    assert state and all("found 'Level1-2'" in e["message"] and "Level2-1" in e["message"] for e in state)
    (start,) = [e for e in errors if e["key_path"] == "eval.starts.1"]
    assert start["file"] == f"experiments/goals/{FAMILY}/Levels_1-1_2-1/_goal.yaml" and "found 'Level9-9'" in start["message"]
    # train checks the same before it creates anything, blaming the fragment that set the key.
    train = gradlab("train", f"{FAMILY}/Levels_1-1_2-1/ppo", env={"GRADLAB_HOME": str(tmp_path / "home")})
    assert train.returncode == 1
    assert f"goals/{FAMILY}/_goal-common.yaml:" in train.stderr and "train.environment.preprocessing.state" in train.stderr
    assert f"goals/{FAMILY}/Levels_1-1_2-1/_goal.yaml:" in train.stderr and "eval.starts.1" in train.stderr
    assert not (tmp_path / "home" / "runs").exists()


@pytest.mark.parametrize("address", ["[]", "[-1, 134]", "[1, 2, 3, 4, 5, 6, 7, 8, 9]"])
def test_a_bad_ram_address_list_is_refused_naming_the_signal(experiments_copy: Path, address: str) -> None:
    common = experiments_copy / "goals" / FAMILY / "_goal-common.yaml"
    common.write_text(common.read_text().replace("address: [0x6D, 0x86]", f"address: {address}"))
    out = gradlab("validate", "--json")
    assert out.returncode == 1
    errors = json.loads(out.stdout)["errors"]
    assert errors and all(e["key_path"] == "train.environment.task.signals.x" and "address: expected" in e["message"]
                          and e["file"] == f"experiments/goals/{FAMILY}/_goal-common.yaml" for e in errors)
