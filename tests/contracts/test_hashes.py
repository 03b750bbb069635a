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


# -- pinned identities --------------------------------------------------------------------------
# The composed gradlab__bandit goal and its ppo-sb3 recipe (sb3.ppo; ppo itself is on gradlab.ppo), written out as canonical JSON (sorted keys,
# compact separators, defaults filled, cosmetic fields left out). Their sha256 is the identity every
# stored result of these contracts is keyed by. If this test fails, canonicalisation or the models'
# defaults changed and every stored result would be re-keyed: either that is a bug, or a deliberate
# change to be stated in the change's notes, with these literals and digests updated by hand.
BANDIT_GOAL_CANONICAL = (
    '{"eval":{"acceptance":[{"metric":"eval/outcome/success/rate","operator":">=","threshold":0.95}],'
    '"episodes":100,"n_envs":4,"policy":"deterministic","seed":0,"starts":[]},"evaluation_mode":"eval'
    'uated","goal_id":"gradlab__bandit","objective":{"direction":"maximize","rank":"eval/outcome/succ'
    'ess/rate"},"train":{"checkpoint_freq":2048,"early_stop":{"conditions":[],"on_acceptance":null},"'
    'environment":{"env_id":"Bandit-v0","n_envs":8,"num_threads":null,"preprocessing":{"frame_stack":'
    '1,"normalize_observation":false},"provider":"gradlab","provider_args":{"n_arms":4},"task":{"even'
    'ts":{"hit":{"op":"equals","signal":"correct","steps":null,"value":true},"miss":{"op":"equals","s'
    'ignal":"correct","steps":null,"value":false}},"progress":[],"reward":{"events":{},"reward_clip":'
    'false,"reward_scale":1.0,"source":"native"},"signals":{"correct":{"address":null,"key":"correct"'
    ',"source":"info"}},"termination":{"failure":["miss"],"max_episode_steps":null,"native_terminated'
    '":"ended","outcome_precedence":["failure","success","timeout"],"success":["hit"],"timeout":[]}},'
    '"vectorization":"auto"}}}'
)
GOAL_SHA256 = "a898a5db76603500af201022f9504c7622a41a39cd21e3ff333b9ac3e436a55a"

BANDIT_PPO_RECIPE_CANONICAL = (
    '{"logging":{"wandb_mode":"offline","wandb_project":"gradlab"},"recipe_id":"ppo-sb3","train":{"backen'
    'd":{"config":{"batch_size":128,"clip_range":0.2,"clip_range_vf":null,"ent_coef":0.0,"gae_lambda"'
    ':1.0,"gamma":0.0,"learning_rate":0.003,"max_grad_norm":0.5,"n_epochs":4,"n_steps":64,"normalize_'
    'advantage":true,"target_kl":null,"vf_coef":0.5},"id":"sb3.ppo"},"checkpoint_freq":null,"device":'
    '"auto","environment":{"n_envs":null,"num_threads":null,"preprocessing":null,"provider_args":null'
    ',"vectorization":null},"normalize":{"clip_observation":10.0,"observation":false,"reward":false},'
    '"policy_model":{"activation":"tanh","extractor":"auto","features_dim":512,"net_arch":[32],"ortho'
    '_init":true,"share_features_extractor":true},"timesteps":16384,"torch_threads":1}}'
)
RECIPE_SHA256 = "9897b6e0697e783d1e6850f83177b6b3d468a9ec5abf28599d7ce928c141f514"


def test_identity_hashes_are_pinned_to_hand_written_canonical_json() -> None:
    import hashlib
    import json

    for text, digest in ((BANDIT_GOAL_CANONICAL, GOAL_SHA256), (BANDIT_PPO_RECIPE_CANONICAL, RECIPE_SHA256)):
        assert hashlib.sha256(text.encode("utf-8")).hexdigest() == digest  # the literal is what is pinned
        assert canonical_json(json.loads(text)) == text.encode("utf-8")  # and it is canonical
    hashes = Experiments().resolve("gradlab__bandit/ppo-sb3").hashes
    assert hashes.goal_contract_sha256 == GOAL_SHA256
    assert hashes.recipe_sha256 == RECIPE_SHA256
