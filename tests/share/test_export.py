"""`gradlab export`: rl-zoo3's loader plays an exported checkpoint and reproduces gradlab's evaluation,
and rl-zoo3's trainer trains from the exported hyperparameters."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from gradlab.checkpoints import file_sha256, list_checkpoints
from gradlab.contracts import Experiments
from gradlab.contracts.recipe import LinearSchedule
from gradlab.contracts.run_spec import RunSpec
from gradlab.evaluation import EvalRequest, build_manifest, run_evaluation
from gradlab.learn.schedules import schedule_fn
from gradlab.share.export import rl_zoo_hyperparameters
from tests.share.conftest import CARTPOLE_RUN_ID, REPO, gradlab, train_run

EPISODES = 10


def _gradlab_eval(ckpt: Path, spec: RunSpec):
    from gradlab.checkpoints import read_manifest

    m = read_manifest(ckpt)
    return run_evaluation(EvalRequest(checkpoint_dir=str(ckpt), checkpoint_sha256=m.sha256, checkpoint_step=m.step,
                                      spec=spec.to_json(), episodes=EPISODES))


_RL_ZOO_PLAY = """
import json, sys
from rl_zoo3 import ALGOS
from rl_zoo3.utils import create_test_env, get_model_path, get_saved_hyperparams

folder, env_id, seeds = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
_, model_path, log_path = get_model_path(1, folder, "ppo", env_id)
hyperparams, stats_path = get_saved_hyperparams(log_path + "/" + env_id, norm_reward=False, test_mode=True)
env = create_test_env(env_id, n_envs=1, stats_path=stats_path, seed=0, should_render=False,
                      hyperparams=hyperparams, env_kwargs={})
model = ALGOS["ppo"].load(model_path, custom_objects={"learning_rate": 0.0, "lr_schedule": lambda _: 0.0,
                                                      "clip_range": lambda _: 0.0}, device="cpu")
returns = []
for seed in seeds:
    env.seed(seed)
    obs = env.reset()
    total, done = 0.0, False
    while not done:
        action, _ = model.predict(obs, deterministic=True)
        obs, reward, dones, infos = env.step(action)
        total += float(reward[0])
        done = bool(dones[0])
    returns.append(total)
env.close()
print(json.dumps(returns))
"""


def _rl_zoo_returns(folder: Path, env_id: str, seeds: list[int]) -> list[float]:
    """Play each seed's episode through rl-zoo3's own loading path (enjoy.py's calls, without rendering).

    In a subprocess: importing rl_zoo3 replaces gymnasium's ``TimeLimit`` process-wide, which would
    leak into every later test of this process (lane-state restores then refuse the foreign class).
    """
    proc = subprocess.run([sys.executable, "-c", _RL_ZOO_PLAY, str(folder), env_id, json.dumps(seeds)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_RL_ZOO_TRAIN = """
import json, runpy, sys
conf, algo, env_id, n, logs = sys.argv[1:]
sys.argv = ["rl_zoo3.train", "--algo", algo, "--env", env_id, "-n", n, "--conf-file", conf, "-f", logs, "--seed", "0",
            "--eval-freq", "-1", "--device", "cpu"]
runpy.run_module("rl_zoo3.train", run_name="__main__", alter_sys=True)  # python -m rl_zoo3.train ...
assert "gradlab" not in sys.modules, "rl-zoo3 trained with gradlab imported"
import pickle
from rl_zoo3 import ALGOS

run = f"{logs}/{algo}/{env_id}_1"
model = ALGOS[algo].load(f"{run}/{env_id}.zip", device="cpu")
progress = (1.0, 0.5, 0.0)
out = {key: getattr(model, key) for key in ("n_envs", "num_timesteps", "n_steps", "batch_size", "n_epochs", "gamma",
                                            "gae_lambda", "ent_coef", "vf_coef", "max_grad_norm", "target_kl",
                                            "normalize_advantage")}
out["learning_rate"] = [model.lr_schedule(p) for p in progress]
out["clip_range"] = [model.clip_range(p) for p in progress]
out["clip_range_vf"] = None if model.clip_range_vf is None else [model.clip_range_vf(p) for p in progress]
kw = dict(model.policy_kwargs)
out["policy_kwargs"] = {**kw, "activation_fn": kw["activation_fn"].__name__}
out["policy"] = type(model.policy).__name__
try:
    with open(f"{run}/{env_id}/vecnormalize.pkl", "rb") as f:
        vn = pickle.load(f)
    out["normalize"] = {"norm_obs": vn.norm_obs, "norm_reward": vn.norm_reward, "clip_obs": vn.clip_obs, "gamma": vn.gamma}
except FileNotFoundError:
    out["normalize"] = None
print(json.dumps(out))
"""


def _check_rl_zoo3_trains_the_recipe(out: Path, spec: RunSpec, steps: int) -> None:
    """``python -m rl_zoo3.train --conf-file`` the export's hyperparams.yml (rl-zoo3 alone, a subprocess),
    then check what it trained with, field by field, against the recipe."""
    env_id, train = spec.environment.env_id, spec.recipe.train
    meta = out / "ppo" / f"{env_id}_1" / env_id
    logs = out.parent / "zoo-train"
    proc = subprocess.run([sys.executable, "-c", _RL_ZOO_TRAIN, str(meta / "hyperparams.yml"), "ppo", env_id,
                           str(steps), str(logs)], capture_output=True, text=True, cwd=out.parent, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (logs / "ppo" / f"{env_id}_1" / f"{env_id}.zip").is_file() and trained["num_timesteps"] >= steps
    # rl-zoo3 saves the hyperparameters it read: the very bytes of the exported config.yml.
    assert (logs / "ppo" / f"{env_id}_1" / env_id / "config.yml").read_bytes() == (meta / "config.yml").read_bytes()
    cfg = train.backend.typed_config()
    assert trained["n_envs"] == spec.environment.n_envs
    for key in ("n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "ent_coef", "vf_coef", "max_grad_norm",
                "target_kl", "normalize_advantage"):
        assert trained[key] == getattr(cfg, key), key
    for key in ("learning_rate", "clip_range", "clip_range_vf"):
        recipe = getattr(cfg, key)
        expected = None if recipe is None else [schedule_fn(recipe)(p) for p in (1.0, 0.5, 0.0)]
        assert trained[key] == pytest.approx(expected), key
    pm = train.policy_model
    assert trained["policy"] == "ActorCriticPolicy"  # MlpPolicy
    assert trained["policy_kwargs"] == {"net_arch": pm.net_arch, "activation_fn": {"tanh": "Tanh", "relu": "ReLU"}[pm.activation],
                                        "ortho_init": pm.ortho_init,
                                        "share_features_extractor": pm.share_features_extractor}
    norm = train.normalize
    assert trained["normalize"] == ({"norm_obs": norm.observation, "norm_reward": norm.reward,
                                     "clip_obs": norm.clip_observation, "gamma": cfg.gamma}
                                    if norm.observation or norm.reward else None)


def _check_plays_like_gradlab(run_dir: Path, out: Path, env_id: str) -> list[float]:
    ckpt = list_checkpoints(run_dir)[-1]
    spec = RunSpec.model_validate_json((run_dir / "spec.json").read_text())
    result = gradlab("export", str(ckpt), "--format", "rl-zoo", "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    provenance = json.loads(result.stdout)
    zoo_zip = out / "ppo" / f"{env_id}_1" / f"{env_id}.zip"
    assert provenance["files"][f"ppo/{env_id}_1/{env_id}.zip"] == file_sha256(zoo_zip) == file_sha256(ckpt / "policy.zip")
    ours = _gradlab_eval(ckpt, spec)
    seeds = [e.seed for e in build_manifest(spec.goal, episodes=EPISODES).episodes]
    theirs = _rl_zoo_returns(out, env_id, seeds)
    np.testing.assert_allclose(theirs, [row.return_ for row in ours.episodes], rtol=0, atol=1e-6)
    assert np.mean(theirs) == pytest.approx(ours.aggregates["eval/episode/return/mean"], abs=1e-6)
    return theirs


@pytest.mark.slow
def test_rl_zoo_plays_an_exported_cartpole_like_gradlabs_evaluation(cartpole_run: Path, tmp_path: Path) -> None:
    _check_plays_like_gradlab(cartpole_run, tmp_path / "zoo", "CartPole-v1")
    assert not (tmp_path / "zoo" / "ppo" / "CartPole-v1_1" / "CartPole-v1" / "vecnormalize.pkl").exists()
    enjoy = subprocess.run([sys.executable, "-m", "rl_zoo3.enjoy", "--algo", "ppo", "--env", "CartPole-v1", "-f",
                            str(tmp_path / "zoo"), "--exp-id", "1", "--no-render", "-n", "200"],
                           capture_output=True, text=True, cwd=REPO, timeout=300)
    assert enjoy.returncode == 0, enjoy.stderr[-2000:]
    assert "CartPole-v1.zip" in enjoy.stdout


@pytest.mark.slow
def test_rl_zoo3_trains_from_an_exported_cartpole_config_with_the_recipes_schedules(cartpole_run: Path,
                                                                                     tmp_path: Path) -> None:
    # Issue 22 item 3: rl_zoo3.train refused the exported config ("Invalid value for learning_rate:
    # {'final': 0.0, 'initial': 0.001, 'kind': 'linear'}"). The recipe has lin_ schedules (gradlab.ppo).
    ckpt = list_checkpoints(cartpole_run)[-1]
    spec = RunSpec.model_validate_json((cartpole_run / "spec.json").read_text())
    result = gradlab("export", str(ckpt), "--format", "rl-zoo", "--out", str(tmp_path / "zoo"), "--json")
    assert result.returncode == 0, result.stderr
    assert "ppo/CartPole-v1_1/CartPole-v1/hyperparams.yml" in json.loads(result.stdout)["files"]
    _check_rl_zoo3_trains_the_recipe(tmp_path / "zoo", spec, steps=256)  # 8 lanes x 32 steps: one update
    # The same checkpoint under a schedule rl-zoo3 cannot write: refused, naming the key, nothing written.
    from gradlab.errors import ContractViolation
    from gradlab.share.export import export_checkpoint

    train = spec.recipe.train
    backend = train.backend.model_copy(update={"config": {**train.backend.config, "learning_rate": LinearSchedule(
        initial=1e-3, final=1e-4)}})
    recipe = spec.recipe.model_copy(update={"train": train.model_copy(update={"backend": backend})})
    with pytest.raises(ContractViolation, match="train.backend.config.learning_rate: linear from 0.001 to 0.0001.*"
                                                "nothing written; use --format sb3"):
        export_checkpoint(ckpt, spec.model_copy(update={"recipe": recipe}), tmp_path / "refused", fmt="rl-zoo")
    assert not (tmp_path / "refused").exists()


def _rl_zoo3_entry(algo: str, env_id: str) -> dict:
    """rl-zoo3's own ``hyperparams/<algo>.yml`` entry, read from its package without importing it."""
    package = Path(importlib.util.find_spec("rl_zoo3").submodule_search_locations[0])
    return yaml.safe_load((package / "hyperparams" / f"{algo}.yml").read_text())[env_id]


def _spec(ref: str, *overrides: str) -> RunSpec:
    return RunSpec.from_resolved(Experiments().resolve(ref, list(overrides)), seed=0, run_id=CARTPOLE_RUN_ID)


@pytest.mark.parametrize("ref, algo", [("CartPole-v1/ppo", "ppo"), ("CartPole-v1/ppo-sb3", "ppo"),
                                       ("CartPole-v1/a2c", "a2c"), ("Acrobot-v1/ppo", "ppo")])
def test_recipes_taken_from_rl_zoo3_export_to_its_own_hyperparameter_entries(ref: str, algo: str) -> None:
    # These recipes cite rl-baselines3-zoo's hyperparams/<algo>.yml; exported, each key of that entry
    # comes back in rl-zoo3's own form (lin_0.001, normalize: true, n_timesteps 1e5); the other keys
    # are SB3's defaults, written out.
    spec = _spec(ref)
    ours, why = rl_zoo_hyperparameters(spec.recipe.train, spec.environment, image=False)
    assert why is None
    theirs = _rl_zoo3_entry(algo, spec.environment.env_id)
    assert {k: ours.get(k) for k in theirs} == theirs
    assert ours["policy_kwargs"] == ("dict(net_arch=[64, 64], activation_fn=nn.Tanh, ortho_init=True, "
                                     "share_features_extractor=True)")


def test_hyperparameters_rl_zoo3_cannot_express_are_refused_naming_the_key() -> None:
    spec = _spec("CartPole-v1/ppo")
    train = spec.recipe.train
    cfg = dict(train.backend.config)

    def with_config(**changes):
        backend = train.backend.model_copy(update={"config": {**cfg, **changes}})
        return train.model_copy(update={"backend": backend})

    hp, why = rl_zoo_hyperparameters(with_config(learning_rate=LinearSchedule(initial=1e-3, final=1e-4)),
                                     spec.environment, image=False)
    assert hp == {} and why == ("train.backend.config.learning_rate: linear from 0.001 to 0.0001, but rl-zoo3's "
                                "lin_<initial> ends at 0")
    _, why = rl_zoo_hyperparameters(with_config(ent_coef=LinearSchedule(initial=0.01)), spec.environment, image=False)
    assert why == "train.backend.config.ent_coef: rl-zoo3 takes a schedule only for learning_rate, clip_range, clip_range_vf"
    # Constants and the other forms: a plain float, a clip_range_vf, normalisation not on both or clipped apart.
    norm = train.normalize.model_copy(update={"observation": True, "clip_observation": 5.0})
    hp, _ = rl_zoo_hyperparameters(with_config(learning_rate=2.5e-4, clip_range_vf=0.3).model_copy(
        update={"normalize": norm}), spec.environment, image=True)
    assert (hp["learning_rate"], hp["clip_range_vf"], hp["policy"]) == (2.5e-4, 0.3, "CnnPolicy")
    assert hp["normalize"] == "dict(norm_obs=True, norm_reward=False, clip_obs=5.0)"
    assert hp["policy_kwargs"].endswith("features_extractor_kwargs=dict(features_dim=512))")


@pytest.mark.slow
def test_rl_zoo_plays_a_normalised_acrobot_with_its_statistics(tmp_path: Path) -> None:
    run_dir = train_run(tmp_path / "runs", "Acrobot-v1/ppo", run_id="gradlab-20260101T000000-000ac40b",
                        overrides=("train.timesteps=1024", "train.checkpoint_freq=1024", "train.environment.n_envs=4",
                                   "train.backend.config.n_steps=256"))
    _check_plays_like_gradlab(run_dir, tmp_path / "zoo", "Acrobot-v1")
    meta = tmp_path / "zoo" / "ppo" / "Acrobot-v1_1" / "Acrobot-v1"
    assert (meta / "vecnormalize.pkl").is_file()
    assert yaml.safe_load((meta / "hyperparams.yml").read_text())["Acrobot-v1"]["normalize"] is True
    spec = RunSpec.model_validate_json((run_dir / "spec.json").read_text())
    _check_rl_zoo3_trains_the_recipe(tmp_path / "zoo", spec, steps=1024)  # 4 lanes x 256 steps: one update


def test_rl_zoo_export_of_a_goal_rl_zoo3_cannot_play_is_refused_and_sb3_is_written(tmp_path: Path,
                                                                                  gradlab_home: Path) -> None:
    # Issue 22 item 5: --format rl-zoo exited 0 with the SB3 files only. It now refuses in one line.
    run_id = "gradlab-20260101T000000-000ba4d1"
    run_dir = train_run(gradlab_home / "runs", "gradlab__bandit/ppo", run_id=run_id,
                        overrides=("train.timesteps=1024", "train.checkpoint_freq=1024"))
    ckpt = list_checkpoints(run_dir)[-1]
    out = gradlab("export", str(ckpt), "--format", "rl-zoo", "--out", str(tmp_path / "out"))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "error: --format rl-zoo: rl-zoo3 cannot play goal gradlab__bandit (gradlab:Bandit-v0): provider 'gradlab' is "
        "not a gymnasium registry env rl-zoo3 can gym.make; nothing written; use --format sb3 (the stable-baselines3 "
        "zip; gradlab.make_env('gradlab__bandit') builds the goal's env for it)"]
    assert not (tmp_path / "out").exists()
    sb3 = gradlab("export", str(ckpt), "--format", "sb3", "--out", str(tmp_path / "out"))
    assert sb3.returncode == 0, sb3.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gradlab_export.json", "policy.zip"]
    assert "promoted no checkpoint" not in sb3.stderr  # a folder names its checkpoint
    assert gradlab("export", str(ckpt), "--format", "onnx", "--out", str(tmp_path / "x")).returncode == 2
    # By run id: the run promoted nothing (never supervised), so the export says what it took instead.
    by_id = gradlab("export", run_id, "--format", "sb3", "--out", str(tmp_path / "by-id"))
    assert by_id.returncode == 0, by_id.stderr
    assert (f"note: run {run_id} promoted no checkpoint (no checkpoint passed its acceptance rule, or the run has "
            "not finished): exporting the newest checkpoint (step 1024, local, not published)") in " ".join(
                by_id.stderr.split())


@pytest.mark.slow
def test_rl_zoo_export_of_an_atari_run_is_refused_saying_why_and_what_to_use(tmp_path: Path) -> None:
    # rl-zoo3's Atari path is not gradlab's ALE pipeline step for step: enjoy would play another game.
    run_dir = train_run(tmp_path / "runs", "Breakout-Atari2600-v0/ppo", run_id="gradlab-20260101T000000-000b4e40",
                        overrides=("train.timesteps=64", "train.checkpoint_freq=64", "train.environment.n_envs=2",
                                   "train.backend.config.n_steps=32", "train.backend.config.batch_size=32",
                                   "train.backend.config.n_epochs=1"))
    ckpt = list_checkpoints(run_dir)[-1]
    out = gradlab("export", str(ckpt), "--out", str(tmp_path / "zoo"))  # rl-zoo is the default format
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: --format rl-zoo: rl-zoo3 cannot play goal Breakout-Atari2600-v0 (ale:")
    assert "not gradlab's ALE frame pipeline and task program step for step" in line
    assert line.endswith("nothing written; use --format sb3 (the stable-baselines3 zip; "
                         "gradlab.make_env('Breakout-Atari2600-v0') builds the goal's env for it)")
    assert not (tmp_path / "zoo").exists()
    sb3 = gradlab("export", str(ckpt), "--format", "sb3", "--out", str(tmp_path / "sb3"))
    assert sb3.returncode == 0, sb3.stderr
    assert (tmp_path / "sb3" / "policy.zip").read_bytes() == (ckpt / "policy.zip").read_bytes()
