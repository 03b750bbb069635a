"""`gradlab validate`, `goals list`, `recipe show` as a user runs them: real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def gradlab(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradlab.cli.app", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **(env or {})}, timeout=120)


def test_help_lists_every_command_with_help() -> None:
    out = gradlab("--help")
    assert out.returncode == 0
    for command in ("validate", "goals", "recipe", "benchmark"):
        assert command in out.stdout


def test_validate_json_counts_everything() -> None:
    out = gradlab("validate", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    goals = REPO / "experiments" / "goals"  # counted from the tree
    missing = doc.pop("missing")
    assert doc == {"goals": len(list(goals.rglob("_goal.yaml"))), "recipes": len(list(goals.rglob("recipes/*.yaml"))),
                   "presets": 2, "errors": []}
    # Only the Super Mario Bros. family needs a file a clean machine lacks: the user's ROM.
    assert {m["message"].split(":")[0] for m in missing} <= {
        "goal SuperMarioBros-Nes-v0/Level1-1", "goal SuperMarioBros-Nes-v0/Level1-1-no-stall",
        "goal SuperMarioBros-Nes-v0/Levels_1-1_2-1"}


def test_validate_lists_every_problem_and_exits_1(experiments_copy: Path) -> None:
    recipes = experiments_copy / "goals" / "CartPole-v1" / "recipes"
    (recipes / "bad.yaml").write_text("train:\n  timesteps: many\n  backend: {id: sb3.ppo, config: {n_stepz: 1}}\n")
    (recipes / "broken.yaml").write_text("train: [\n")
    out = gradlab("validate", "--json")
    assert out.returncode == 1
    doc = json.loads(out.stdout)
    files = sorted({e["file"] for e in doc["errors"]})
    assert files == ["experiments/goals/CartPole-v1/recipes/bad.yaml", "experiments/goals/CartPole-v1/recipes/broken.yaml"]
    keys = sorted(e["key_path"] for e in doc["errors"])
    assert keys == ["", "train.backend.config.n_stepz", "train.timesteps"]
    broken = next(e for e in doc["errors"] if e["file"].endswith("broken.yaml"))
    assert broken["line"] == 2 and broken["message"].startswith("invalid YAML")
    human = gradlab("validate")
    assert human.returncode == 1
    assert "bad.yaml:3:" in human.stderr and "did you mean n_steps?" in human.stderr


def test_goals_list_json_has_the_documented_keys() -> None:
    out = gradlab("goals", "list", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["goal_id"]: r for r in json.loads(out.stdout)}
    assert set(rows["CartPole-v1"]) == {"goal_id", "title", "project", "provider", "env_id", "evaluation_mode", "recipes",
                                        "missing"}
    assert rows["CartPole-v1"]["missing"] == []
    assert rows["CartPole-v1"]["recipes"] == ["a2c", "ppo", "ppo-sb3"]
    assert rows["CartPole-v1"]["project"] == "classic-control"
    assert rows["Breakout-Atari2600-v0"]["provider"] == "ale"
    assert rows["gradlab__bandit"]["project"] == "smoke"


def test_recipe_show_json_and_set() -> None:
    plain = json.loads(gradlab("recipe", "show", "CartPole-v1/ppo", "--json").stdout)
    assert set(plain) == {"goal_id", "recipe_id", "goal_contract_sha256", "recipe_sha256", "environment_sha256", "contract"}
    assert plain["contract"]["recipe"]["train"]["backend"]["config"]["n_steps"] == 32
    changed = gradlab("recipe", "show", "CartPole-v1/ppo", "--set", "train.backend.config.n_steps=64", "--json")
    doc = json.loads(changed.stdout)
    assert doc["contract"]["recipe"]["train"]["backend"]["config"]["n_steps"] == 64
    assert doc["recipe_sha256"] != plain["recipe_sha256"]
    assert doc["contract"]["overrides"] == ["train.backend.config.n_steps=64"]


def test_recipe_show_bad_set_exits_1_with_key_path() -> None:
    out = gradlab("recipe", "show", "CartPole-v1/ppo", "--set", "train.backend.config.n_steps=abc")
    assert out.returncode == 1
    assert "--set: train.backend.config.n_steps: expected a valid integer" in out.stderr
    assert out.stdout == ""
    unknown = gradlab("recipe", "show", "CartPole-v2/ppo")
    assert unknown.returncode == 1 and "did you mean CartPole-v1" in unknown.stderr


@pytest.mark.parametrize("args", [["validate"], ["goals", "list"], ["recipe", "show", "CartPole-v1/ppo"]])
def test_cheap_commands_import_neither_torch_nor_prefect(args: list[str]) -> None:
    """Speed itself is measured by benchmarks, not timed tests; what keeps these commands fast
    (under 2 s here) is that they never import torch, prefect, SB3 or W&B."""
    probe = (
        "import sys, runpy\n"
        f"sys.argv = ['gradlab', *{args!r}]\n"
        "try:\n    runpy.run_module('gradlab.cli.app', run_name='__main__')\n"
        "except SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'prefect', 'stable_baselines3', 'wandb'))\n"
        "print('HEAVY=' + ','.join(heavy), file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY=\n" in out.stderr, out.stderr[-500:]


def _retarget(goal_file: Path, old: str, new: str) -> None:
    text = goal_file.read_text()
    assert f"env_id: {old}" in text
    goal_file.write_text(text.replace(f"env_id: {old}", f"env_id: {new}"))


def test_validate_refuses_an_env_id_typo_and_reports_a_missing_rom_apart(experiments_copy: Path, tmp_path: Path) -> None:
    """Goals that compose but cannot run: checked against the providers, no emulator started."""
    goals = experiments_copy / "goals"
    _retarget(goals / "CartPole-v1" / "_goal.yaml", "CartPole-v1", "CartPol-v1")
    # An integrated stable-retro game whose ROM is not bundled and was never imported here.
    _retarget(goals / "Airstriker-Genesis-v0" / "_goal.yaml", "Airstriker-Genesis-v0", "SonicTheHedgehog-Genesis-v0")
    (goals / "gradlab__bandit" / "_goal.yaml").write_text(
        (goals / "gradlab__bandit" / "_goal.yaml").read_text().replace("n_arms: 4", "n_armz: 4"))
    out = gradlab("validate", "--json")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    errors = {e["file"]: e for e in doc["errors"]}
    assert set(errors) == {"experiments/goals/CartPole-v1/_goal.yaml", "experiments/goals/gradlab__bandit/_goal.yaml"}
    typo = errors["experiments/goals/CartPole-v1/_goal.yaml"]
    assert typo["key_path"] == "train.environment.env_id" and typo["line"] is not None
    assert "no environment 'CartPol-v1' (did you mean CartPole-v1?)" in typo["message"]
    # A missing ROM is this machine's lack, not the goal's fault: reported apart, not an error.
    (rom,) = [m for m in doc["missing"] if m["file"] == "experiments/goals/Airstriker-Genesis-v0/_goal.yaml"]
    assert rom["message"].startswith("goal Airstriker-Genesis-v0: retro:SonicTheHedgehog-Genesis-v0: ")
    assert rom["key_path"] == "train.environment.env_id"
    assert "no ROM for this game" in rom["message"] and "gradlab rom import" in rom["message"]
    args = errors["experiments/goals/gradlab__bandit/_goal.yaml"]
    assert args["key_path"] == "train.environment.provider_args.n_armz" and "did you mean n_arms?" in args["message"]


def test_train_refuses_an_unrunnable_goal_before_creating_anything(experiments_copy: Path, tmp_path: Path) -> None:
    _retarget(experiments_copy / "goals" / "CartPole-v1" / "_goal.yaml", "CartPole-v1", "CartPol-v1")
    home = tmp_path / "home"
    out = gradlab("train", "CartPole-v1/ppo", env={"GRADLAB_HOME": str(home)})
    assert out.returncode == 1
    assert "train.environment.env_id" in out.stderr and "did you mean CartPole-v1?" in out.stderr
    assert not (home / "runs").exists() and not (home / "stores").exists()
    # An override that makes the environment unbuildable is blamed on the command line.
    bad = gradlab("train", "gradlab__bandit/ppo", "--set", "train.environment.provider_args.n_arms=many",
                  env={"GRADLAB_HOME": str(home)})
    assert bad.returncode == 1 and "--set: train.environment.provider_args.n_arms" in bad.stderr, bad.stderr
    assert not (home / "runs").exists()


def test_train_refuses_what_the_learner_would_refuse_before_creating_anything(tmp_path: Path) -> None:
    """fp16-amp on CPU and CUDA where there is none: refused by the static check, not by the learner
    after a run exists (same messages as gradlab.learn.ppo's)."""
    from gradlab.envs.preflight import cuda_present

    home = tmp_path / "home"
    for args, expected in [
        (["CartPole-v1/ppo", "--set", "train.backend.config.precision=fp16-amp"],
         "--set: train.backend.config.precision: fp16-amp needs device cuda; use bf16 on CPU"),
        *([(["CartPole-v1/ppo", "--set", "train.device=cuda"],
            "--set: train.device: cuda asked for, but torch sees no CUDA device")] if not cuda_present() else []),
    ]:
        out = gradlab("train", args[0], "--set", "train.backend.id=gradlab.ppo", *args[1:], env={"GRADLAB_HOME": str(home)})
        assert out.returncode == 1, out.stderr
        assert expected in out.stderr, out.stderr
        assert not (home / "runs").exists() and not (home / "stores").exists()
        # `recipe show` shows the (valid) contract and says, on stderr, that it cannot train here.
        show = gradlab("recipe", "show", args[0], "--set", "train.backend.id=gradlab.ppo", *args[1:], "--json",
                       env={"GRADLAB_HOME": str(home)})
        assert show.returncode == 0 and json.loads(show.stdout)["goal_id"] == args[0].split("/")[0], show.stderr
        assert "not runnable on this machine" in show.stderr and expected in show.stderr, show.stderr


def test_training_problems_allow_fp16_amp_on_cuda_and_validate_names_the_recipe(experiments_copy: Path) -> None:
    from gradlab.contracts import Experiments
    from gradlab.envs.preflight import environment_problems, training_problems

    experiments = Experiments()
    cuda = experiments.resolve("CartPole-v1/ppo", ["train.backend.id=gradlab.ppo", "train.device=cuda",
                                                   "train.backend.config.precision=fp16-amp"])
    assert training_problems(cuda) == []
    sb3 = experiments.resolve("Breakout-Atari2600-v0/ppo-sb3", ["train.normalize.observation=true"])
    assert training_problems(sb3) == []  # sb3.ppo's VecNormalize takes images: only gradlab.ppo refuses
    recipe = experiments_copy / "goals" / "CartPole-v1" / "recipes" / "fp16.yaml"
    recipe.write_text("train:\n  timesteps: 64\n  device: cpu\n  backend: {id: gradlab.ppo, config: {precision: fp16-amp}}\n")
    [problem] = environment_problems(Experiments(), ["CartPole-v1/fp16"])
    assert (problem.file.endswith("goals/CartPole-v1/recipes/fp16.yaml"), problem.key_path) == (
        True, "train.backend.config.precision")
    assert problem.message == "fp16-amp needs device cuda; use bf16 on CPU"
