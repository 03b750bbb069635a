"""Composition, validation and error reporting of goals and recipes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradlab.contracts import Experiments
from gradlab.errors import ConfigError, NotFound


def test_checked_in_experiments_are_valid() -> None:
    report = Experiments().validate_all()
    assert [p.render() for p in report.problems] == []
    goals = Path(__file__).resolve().parents[2] / "experiments" / "goals"  # counted from the tree
    assert report.goals == len(list(goals.rglob("_goal.yaml"))) == 26
    assert report.recipes == len(list(goals.rglob("recipes/*.yaml")))
    assert report.presets == 2


def test_preset_and_fragment_are_merged_with_lists_replaced() -> None:
    resolved = Experiments().resolve("Breakout-Atari2600-v0/ppo")
    config = resolved.recipe.train.backend.config
    assert resolved.recipe.train.backend.id == "gradlab.ppo"  # the recipe's own key over the preset's
    assert config["n_steps"] == 128 and config["batch_size"] == 256  # from the preset
    assert resolved.recipe.train.timesteps == 10_000_000  # from the recipe itself
    assert resolved.recipe.train.policy_model.net_arch == []  # list replaced, not merged with [64, 64]
    assert resolved.environment.preprocessing["frame_skip"] == 4  # from the shared _atari.yaml fragment
    assert resolved.environment.env_id == "Breakout"
    assert resolved.recipe.description.startswith("rl-zoo3's Atari PPO on Breakout,")  # {{ env_id }} rendered
    assert Experiments().resolve("Breakout-Atari2600-v0/ppo-sb3").recipe.train.backend.id == "sb3.ppo"


def test_self_position_decides_who_wins(experiments_copy: Path) -> None:
    recipes = experiments_copy / "goals" / "Breakout-Atari2600-v0" / "recipes"
    (recipes / "late.yaml").write_text(
        "defaults: [_self_, sb3_ppo_atari]\ntrain:\n  timesteps: 100\n  backend:\n    id: sb3.ppo\n"
        "    config: {n_steps: 7}\n"
    )
    resolved = Experiments().resolve("Breakout-Atari2600-v0/late")
    assert resolved.recipe.train.backend.config["n_steps"] == 128  # the preset comes after _self_


def test_defaults_cycle_is_an_error(experiments_copy: Path) -> None:
    presets = experiments_copy / "recipes" / "_presets"
    (presets / "a.yaml").write_text("defaults: [b]\n")
    (presets / "b.yaml").write_text("defaults: [a]\n")
    report = Experiments().validate_all()
    messages = [p.render() for p in report.problems]
    assert any("cycle in defaults" in m and "a.yaml -> " in m for m in messages), messages


def _problems(experiments_copy: Path, text: str, overrides: tuple[str, ...] = ()) -> list[str]:
    path = experiments_copy / "goals" / "CartPole-v1" / "recipes" / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        Experiments().resolve("CartPole-v1/bad", list(overrides))
    return [p.render() for p in info.value.problems]


GOOD = "train:\n  timesteps: 1000\n  backend:\n    id: sb3.ppo\n    config:\n      n_steps: 32\n"


def test_unknown_key_names_file_line_key_and_suggestion(experiments_copy: Path) -> None:
    problems = _problems(experiments_copy, GOOD.replace("n_steps: 32", "n_stepz: 32"))
    assert problems == [
        "experiments/goals/CartPole-v1/recipes/bad.yaml:6:7: train.backend.config.n_stepz: unknown key (did you mean n_steps?)"
    ]



@pytest.mark.parametrize("backend", ["sb3.ppo", "gradlab.ppo", "sb3.a2c"])
def test_every_stable_baselines3_argument_is_a_key_or_refused_with_its_reason(
        experiments_copy: Path, backend: str) -> None:
    import inspect

    from stable_baselines3 import A2C, PPO

    from gradlab.contracts.recipe import BACKEND_CONFIGS, SB3_ARGUMENTS_ELSEWHERE

    arguments = set(inspect.signature((A2C if backend == "sb3.a2c" else PPO).__init__).parameters) - {"self"}
    taken = set(BACKEND_CONFIGS[backend].model_fields)
    assert arguments - taken - set(SB3_ARGUMENTS_ELSEWHERE) == set()  # SB3's own signature, read here
    base = GOOD.replace("id: sb3.ppo", f"id: {backend}").replace("      n_steps: 32\n", "")
    for name in sorted(arguments - taken):
        text = base + f"      {name}: 1\n"
        problems = _problems(experiments_copy, text)
        assert problems == [f"experiments/goals/CartPole-v1/recipes/bad.yaml:6:7: train.backend.config.{name}: "
                            f"a stable-baselines3 argument gradlab does not take here: {SB3_ARGUMENTS_ELSEWHERE[name]}"]
    assert "gradlab train --seed" in SB3_ARGUMENTS_ELSEWHERE["seed"]
    problems = _problems(experiments_copy, base + "      use_sde: true\n", ("train.backend.config.sde_sample_freq=4",))
    assert any("sde_sample_freq: a stable-baselines3 argument" in p and "see use_sde" in p for p in problems), problems

def test_wrong_type_names_expected_and_found(experiments_copy: Path) -> None:
    problems = _problems(experiments_copy, GOOD.replace("n_steps: 32", "n_steps: lots"))
    assert len(problems) == 1
    assert problems[0].startswith("experiments/goals/CartPole-v1/recipes/bad.yaml:6:7: train.backend.config.n_steps: expected")
    assert "integer" in problems[0] and "found 'lots'" in problems[0]


def test_all_problems_of_a_file_are_reported_together(experiments_copy: Path) -> None:
    text = GOOD.replace("n_steps: 32", "n_stepz: 32\n      gamma: high") + "  policy_modle: {}\nlogging: {wandb_mode: loud}\n"
    problems = _problems(experiments_copy, text)
    joined = "\n".join(problems)
    assert "train.backend.config.n_stepz: unknown key (did you mean n_steps?)" in joined
    assert "train.backend.config.gamma: expected" in joined
    assert "train.policy_modle: unknown key (did you mean policy_model?)" in joined
    assert "logging.wandb_mode: expected" in joined and "found 'loud'" in joined


def test_broken_yaml_reports_line_and_column(experiments_copy: Path) -> None:
    problems = _problems(experiments_copy, "train:\n  timesteps: [1\n")
    assert len(problems) == 1
    assert problems[0].startswith("experiments/goals/CartPole-v1/recipes/bad.yaml:3:1: invalid YAML:")


def test_bad_set_value_and_unknown_set_key(experiments_copy: Path) -> None:
    problems = _problems(experiments_copy, GOOD, ("train.backend.config.n_steps=abc", "train.timestepz=5"))
    assert "--set: train.backend.config.n_steps: expected a valid integer, unable to parse string as an integer; found 'abc'" in problems
    assert "--set: train.timestepz: unknown key (did you mean timesteps?)" in problems


def test_negative_rates_and_non_positive_limits_are_refused_before_training(experiments_copy: Path) -> None:
    # Adam refused a negative learning rate only inside the learner, after a run existed; a negative
    # clip range or entropy coefficient was accepted and turned the objective around.
    sets = ("train.backend.config.learning_rate=-0.1", "train.backend.config.clip_range.initial=-0.2",
            "train.backend.config.ent_coef=-0.01", "train.backend.config.target_kl=0",
            "train.backend.config.clip_range_vf=-1")
    problems = _problems(experiments_copy, GOOD, sets)
    expected = "expected a value >= 0, or a linear schedule between values >= 0; found"
    assert f"--set: train.backend.config.learning_rate: {expected} -0.1" in problems, problems
    assert any(p.startswith(f"--set: train.backend.config.clip_range: {expected} {{") for p in problems), problems
    assert f"--set: train.backend.config.ent_coef: {expected} -0.01" in problems, problems
    assert "--set: train.backend.config.target_kl: expected greater than 0; found 0" in problems, problems
    assert "--set: train.backend.config.clip_range_vf: expected greater than 0; found -1" in problems, problems
    # A schedule that anneals to zero, and a zero entropy coefficient, stay valid.
    Experiments().resolve("CartPole-v1/bad", ["train.backend.config.clip_range.initial=0.2",
                                              "train.backend.config.ent_coef=0"])


def test_net_arch_is_bounded_and_a_set_may_turn_its_list_into_pi_and_vf(experiments_copy: Path) -> None:
    # A zero-width layer trained until its first checkpoint before the policy spec refused it; a
    # mapping over the list default was OmegaConf's TypeError traceback.
    for arch in ("[0]", "[-3]", "[" + ",".join(["8"] * 17) + "]"):
        problems = _problems(experiments_copy, GOOD, (f"train.policy_model.net_arch={arch}",))
        assert problems == [f"--set: train.policy_model.net_arch: expected at most 16 layers of 1..16384 units; "
                            f"found {arch.replace(',', ', ')}"], problems
    resolved = Experiments().resolve("CartPole-v1/ppo", ["train.policy_model.net_arch={pi: [32], vf: [64, 64]}"])
    assert resolved.recipe.train.policy_model.net_arch == {"pi": [32], "vf": [64, 64]}
    back = Experiments().resolve("CartPole-v1/ppo", ["train.policy_model.net_arch={pi: [32]}",
                                                     "train.policy_model.net_arch=[16]"])
    assert back.recipe.train.policy_model.net_arch == [16]


def test_set_without_equals_and_eval_override_are_refused() -> None:
    with pytest.raises(ConfigError) as info:
        Experiments().resolve("CartPole-v1/ppo", ["train.timesteps", "eval.episodes=3"])
    rendered = [p.render() for p in info.value.problems]
    assert "--set: train.timesteps: expected KEY=VALUE with a dotted key, found 'train.timesteps'" in rendered
    assert "--set: eval.episodes: evaluation settings belong to the goal's protocol and cannot be overridden" in rendered


def test_training_environment_override_is_mirrored_into_evaluation() -> None:
    resolved = Experiments().resolve("Breakout-Atari2600-v0/ppo", ["train.environment.preprocessing.frame_skip=5"])
    assert resolved.environment.preprocessing["frame_skip"] == 5
    assert resolved.eval_environment.preprocessing["frame_skip"] == 5
    assert resolved.eval_environment.n_envs == resolved.goal.eval.n_envs


def test_bad_preprocessing_override_names_full_key_path() -> None:
    with pytest.raises(ConfigError) as info:
        Experiments().resolve("Breakout-Atari2600-v0/ppo", ["train.environment.preprocessing.frame_skipp=2"])
    assert [p.render() for p in info.value.problems] == [
        "--set: train.environment.preprocessing.frame_skipp: unknown key (did you mean frame_skip?)"
    ]


def test_undefined_template_name_is_an_error(experiments_copy: Path) -> None:
    problems = _problems(experiments_copy, "description: 'run {{ run_name }}'\n" + GOOD)
    assert len(problems) == 1
    assert "description: undefined template name 'run_name'" in problems[0]


def test_secret_like_key_is_refused(experiments_copy: Path) -> None:
    goal = experiments_copy / "goals" / "CartPole-v1" / "_goal.yaml"
    goal.write_text(goal.read_text().replace("    env_id: CartPole-v1\n", "    env_id: CartPole-v1\n    provider_args: {api_key: abc}\n"))
    report = Experiments().validate_all()
    assert any("train.environment.provider_args.api_key: secret-like key refused" in p.render() for p in report.problems)


def test_goal_id_must_match_folder(experiments_copy: Path) -> None:
    goal = experiments_copy / "goals" / "CartPole-v1" / "_goal.yaml"
    goal.write_text("goal_id: Other\n" + goal.read_text())
    with pytest.raises(ConfigError) as info:
        Experiments().load_goal("CartPole-v1")
    assert "goal_id: expected 'CartPole-v1' (the folder path), found 'Other'" in info.value.problems[0].render()


def test_unknown_goal_and_recipe_suggest_names() -> None:
    with pytest.raises(NotFound, match="did you mean CartPole-v1"):
        Experiments().resolve("CartPole-v2/ppo")
    with pytest.raises(NotFound, match=r"did you mean CartPole-v1/ppo\?"):
        Experiments().resolve("CartPole-v1/ppp")


def test_catalog_must_cover_every_goal_once(experiments_copy: Path) -> None:
    catalog = experiments_copy / "goals" / "_catalog.yaml"
    catalog.write_text(catalog.read_text().replace("goals: [gradlab__bandit, gradlab__keydoor, Bandit]", "goals: [gradlab__bandit, gradlab__keydoor, Bandit, Nope]").replace(
        "goals: [Airstriker-Genesis-v0, SuperMarioBros-Nes-v0]", "goals: [SuperMarioBros-Nes-v0]"))
    messages = [p.render() for p in Experiments().validate_all().problems]
    assert "experiments/goals/_catalog.yaml: projects.smoke.goals: expected a goal or a family folder, found no goal 'Nope'" in messages
    assert "experiments/goals/_catalog.yaml: projects: goal 'Airstriker-Genesis-v0' belongs to no project" in messages


def test_a_clip_beyond_float32_is_refused_before_anything_runs(experiments_copy: Path) -> None:
    # Normalised observations are float32: 1e39 was accepted, then crashed the learner's Box.
    problems = _problems(experiments_copy, GOOD, ("train.normalize.clip_observation=1e39",))
    assert len(problems) == 1 and "train.normalize.clip_observation: expected" in problems[0], problems
    assert "expected less than or equal to 34028234663852886" in problems[0] and "found '1e39'" in problems[0]
