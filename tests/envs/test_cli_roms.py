"""``gradlab env ...`` and ``gradlab rom ...`` through the real CLI, and the preflight of every goal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradlab.cli.app import app
from gradlab.contracts import Experiments
from gradlab.envs.preflight import preflight

runner = CliRunner()


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_env_list_json():
    rows = _json(runner.invoke(app, ["env", "list", "--json"]))
    by_name = {r["provider"]: r for r in rows}
    assert set(by_name) >= {"gradlab", "gymnasium", "ale", "vizdoom", "retro"}
    assert set(rows[0]) == {"provider", "available", "version", "env_ids"}
    assert by_name["gradlab"]["env_ids"] == ["Bandit-v0", "Corridor-v0", "Lives-v0", "FailOn-v0", "KeyDoor-v0"]
    assert "CartPole-v1" in by_name["gymnasium"]["env_ids"]


def test_env_inspect_cartpole_and_breakout():
    info = _json(runner.invoke(app, ["env", "inspect", "gymnasium:CartPole-v1", "--json"]))
    assert info["obs_shape"] == [4] and info["obs_dtype"] == "float32"
    assert info["action_space"] == "Discrete(2)" and info["action_meanings"] == ["PUSH_LEFT", "PUSH_RIGHT"]
    assert info["native_max_steps"] == 500 and info["render_shape"] == [400, 600, 3]
    info = _json(runner.invoke(app, ["env", "inspect", "ale:Breakout", "--json"]))
    assert info["obs_shape"] == [4, 84, 84] and info["action_meanings"] == ["NOOP", "FIRE", "RIGHT", "LEFT"]
    assert info["native_max_steps"] == 27000
    result = runner.invoke(app, ["env", "inspect", "ale:Brekout"])
    assert result.exit_code == 1 and "Breakout" in result.output


def test_env_preflight_cli_json_and_failure():
    rep = _json(runner.invoke(app, ["env", "preflight", "CartPole-v1/ppo", "--steps", "300", "--json"]))
    assert rep["ok"] is True and rep["obs_shape"] == [4] and rep["obs_dtype"] == "float32"
    assert rep["n_envs"] == 8 and rep["steps"] == 300
    assert rep["episodes"] > 0 and set(rep["outcomes"]) == {"failure"}
    assert rep["steps_per_s"] > 0
    # A provider argument gymnasium does not take: exit 1, the build check names it.
    result = runner.invoke(app, ["env", "preflight", "CartPole-v1/ppo", "--json",
                                 "--set", "train.environment.provider_args.bogus=1"])
    assert result.exit_code == 1
    rep = json.loads(result.stdout)
    assert rep["ok"] is False and rep["checks"][0]["name"] == "build"
    assert "provider_args" in rep["checks"][0]["detail"] and "bogus" in rep["checks"][0]["detail"]


def _needs_a_missing_file(goal_id: str) -> bool:
    from gradlab.envs.preflight import missing_files

    return bool(missing_files(Experiments().load_goal(goal_id).train.environment))


# Goals whose ROM is the user's (Super Mario Bros.) cannot start here; their contract is tested
# without the game in tests/envs/test_mario_family.py, and their preflight's refusal below.
GOALS = [g for g in Experiments().goal_ids() if not _needs_a_missing_file(g)]
ROM_GOALS = [g for g in Experiments().goal_ids() if _needs_a_missing_file(g)]


@pytest.mark.parametrize("goal_id", ROM_GOALS)
def test_preflight_of_a_goal_whose_rom_is_missing_fails_at_the_build_naming_it(goal_id):
    experiments = Experiments()
    for recipe_id in experiments.recipe_ids(goal_id):
        rep = preflight(experiments.resolve(f"{goal_id}/{recipe_id}").environment, steps=30,
                        target=f"{goal_id}/{recipe_id}")
        assert rep.ok is False and rep.checks[0]["name"] == "build"
        assert "no ROM for this game" in rep.checks[0]["detail"] and "gradlab rom import" in rep.checks[0]["detail"]


@pytest.mark.parametrize("goal_id", GOALS)
def test_preflight_passes_for_every_checked_in_goal(goal_id):
    experiments = Experiments()
    for recipe_id in experiments.recipe_ids(goal_id):
        spec = experiments.resolve(f"{goal_id}/{recipe_id}").environment
        rep = preflight(spec, steps=30, target=f"{goal_id}/{recipe_id}")
        assert rep.ok, rep.checks
        assert rep.steps == 30 and rep.obs_shape is not None


def _airstriker_rom() -> Path:
    from stable_retro.data import Integrations, get_romfile_path

    return Path(get_romfile_path("Airstriker-Genesis-v0", Integrations.STABLE))


def test_rom_import_verifies_the_hash_and_status_reports_it(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADLAB_HOME", str(tmp_path / "home"))
    src = tmp_path / "roms"
    src.mkdir()
    shutil.copy(_airstriker_rom(), src / "airstriker.md")
    (src / "junk.bin").write_bytes(b"not a rom" * 100)
    rows = _json(runner.invoke(app, ["rom", "import", str(src), "--json"]))
    by_file = {Path(r["file"]).name: r for r in rows}
    assert by_file["junk.bin"]["status"] == "unknown" and by_file["junk.bin"]["game"] is None
    imported = by_file["airstriker.md"]
    assert (imported["status"], imported["game"]) == ("imported", "Airstriker-Genesis-v0")
    dest = Path(imported["dest"])
    assert dest == tmp_path / "home" / "roms" / "retro" / "Airstriker-Genesis-v0" / "rom.md"
    assert (dest.parent / "Level1.state").is_file() and (dest.parent / "rom.sha").is_file()
    assert imported["sha1"] == (dest.parent / "rom.sha").read_text().split()[0]
    again = _json(runner.invoke(app, ["rom", "import", str(src / "airstriker.md"), "--json"]))
    assert again[0]["status"] == "already_imported"
    status = _json(runner.invoke(app, ["rom", "status", "--json"]))
    mine = [r for r in status["roms"] if r["source"] == "imported"]
    assert [(r["game"], r["verified"]) for r in mine] == [("Airstriker-Genesis-v0", True)]
    # A tampered ROM fails verification before use.
    from gradlab.envs.roms import verify_imported
    from gradlab.errors import IntegrityError

    dest.write_bytes(dest.read_bytes()[:-1] + b"\x00")
    with pytest.raises(IntegrityError, match="re-import"):
        verify_imported("Airstriker-Genesis-v0")
    status = _json(runner.invoke(app, ["rom", "status", "--json"]))
    assert [r["verified"] for r in status["roms"] if r["source"] == "imported"] == [False]


def test_rom_import_of_unknown_files_exits_1(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADLAB_HOME", str(tmp_path / "home"))
    junk = tmp_path / "x.bin"
    junk.write_bytes(b"\x01" * 64)
    result = runner.invoke(app, ["rom", "import", str(junk)])
    assert result.exit_code == 1
    result = runner.invoke(app, ["rom", "import", str(tmp_path / "missing.md")])
    assert result.exit_code == 1 and "no such file" in result.output
