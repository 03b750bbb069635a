"""Identity hashes: stable under formatting, sensitive to meaning, blind to cosmetics."""

from __future__ import annotations

from pathlib import Path

from gradlab.contracts import Experiments, canonical_json, sha256_json

REF = "CartPole-v1/ppo-sb3"


def _hashes(overrides: tuple[str, ...] = ()) -> dict[str, str]:
    return Experiments().resolve(REF, list(overrides)).hashes.as_dict()


def test_canonical_json_sorts_keys_and_is_compact() -> None:
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'.encode()
    assert sha256_json({"b": 1, "a": 2}) == sha256_json({"a": 2, "b": 1})


def test_reordering_whitespace_and_anchors_do_not_change_hashes(experiments_copy: Path) -> None:
    before = _hashes()
    recipe = experiments_copy / "goals" / "CartPole-v1" / "recipes" / "ppo-sb3.yaml"
    recipe.write_text(
        "# rewritten with another key order, other spacing, an anchor and aliases\n"
        "description:   rl-zoo3's PPO for CartPole-v1.\n"
        "train:\n"
        "    backend:\n"
        "        config:\n"
        "            ent_coef: &zero 0.0\n"
        "            clip_range: {final: *zero, kind: linear, initial: 0.2}\n"
        "            gae_lambda: 0.8\n"
        "            gamma: 0.98\n"
        "            n_epochs: 20\n"
        "            batch_size: 256\n"
        "            n_steps: 32\n"
        "            learning_rate: {initial: 1.0e-3, final: *zero, kind: linear}\n"
        "        id: sb3.ppo\n"
        "    environment: {n_envs: 8}\n"
        "    policy_model: {activation: tanh, net_arch: [64, 64]}\n"
        "    timesteps: 100000\n"
    )
    assert _hashes() == before


def test_spelling_out_a_default_does_not_change_hashes(experiments_copy: Path) -> None:
    before = _hashes()
    recipe = experiments_copy / "goals" / "CartPole-v1" / "recipes" / "ppo-sb3.yaml"
    recipe.write_text(recipe.read_text().replace("      ent_coef: 0.0\n", "      ent_coef: 0.0\n      vf_coef: 0.5\n"))
    assert _hashes() == before


def test_cosmetic_fields_do_not_change_hashes(experiments_copy: Path) -> None:
    before = _hashes()
    goal = experiments_copy / "goals" / "CartPole-v1" / "_goal.yaml"
    text = goal.read_text().replace("title: CartPole balance", "title: Something else").replace(
        "tags: [classic-control, gymnasium]", "tags: [other]")
    goal.write_text(text)
    recipe = experiments_copy / "goals" / "CartPole-v1" / "recipes" / "ppo-sb3.yaml"
    recipe.write_text(recipe.read_text().replace("description: rl-zoo3's PPO for CartPole-v1.", "description: changed"))
    assert _hashes() == before


def test_semantic_changes_change_the_right_hashes(experiments_copy: Path) -> None:
    before = _hashes()
    goal = experiments_copy / "goals" / "CartPole-v1" / "_goal.yaml"
    goal.write_text(goal.read_text().replace("threshold: 475", "threshold: 400"))
    after_goal = _hashes()
    assert after_goal["goal_contract_sha256"] != before["goal_contract_sha256"]
    assert after_goal["recipe_sha256"] == before["recipe_sha256"]
    assert after_goal["environment_sha256"] == before["environment_sha256"]
    goal.write_text(goal.read_text().replace("native_terminated: failure", "native_terminated: ended"))
    after_env = _hashes()
    assert after_env["environment_sha256"] != after_goal["environment_sha256"]


def test_set_changes_recipe_hash_and_lane_count_does_not_change_environment_hash() -> None:
    before = _hashes()
    changed = _hashes(("train.backend.config.n_epochs=10",))
    assert changed["recipe_sha256"] != before["recipe_sha256"]
    assert changed["goal_contract_sha256"] == before["goal_contract_sha256"]
    lanes = _hashes(("train.environment.n_envs=4",))
    assert lanes["environment_sha256"] == before["environment_sha256"]
    assert lanes["recipe_sha256"] != before["recipe_sha256"]


def test_training_and_evaluation_environments_hash_alike() -> None:
    from gradlab.contracts.experiments import environment_sha256

    resolved = Experiments().resolve("Breakout-Atari2600-v0/ppo", ["train.environment.preprocessing.noop_max=0"])
    assert environment_sha256(resolved.eval_environment) == resolved.hashes.environment_sha256
