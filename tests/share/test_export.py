"""`gradlab export`: rl-zoo3's loader plays an exported checkpoint and reproduces gradlab's evaluation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gradlab.checkpoints import file_sha256, list_checkpoints
from gradlab.contracts.run_spec import RunSpec
from gradlab.evaluation import EvalRequest, build_manifest, run_evaluation
from tests.share.conftest import REPO, gradlab, train_run

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
def test_rl_zoo_plays_a_normalised_acrobot_with_its_statistics(tmp_path: Path) -> None:
    run_dir = train_run(tmp_path / "runs", "Acrobot-v1/ppo", run_id="gradlab-20260101T000000-000ac40b",
                        overrides=("train.timesteps=1024", "train.checkpoint_freq=1024", "train.environment.n_envs=4",
                                   "train.backend.config.n_steps=256"))
    _check_plays_like_gradlab(run_dir, tmp_path / "zoo", "Acrobot-v1")
    meta = tmp_path / "zoo" / "ppo" / "Acrobot-v1_1" / "Acrobot-v1"
    assert (meta / "vecnormalize.pkl").is_file()
    import yaml

    assert yaml.safe_load((meta / "config.yml").read_text())["normalize"] == {"norm_obs": True, "norm_reward": True}


def test_export_of_a_provider_rl_zoo_cannot_build_writes_the_sb3_files(tmp_path: Path, gradlab_home: Path) -> None:
    run_id = "gradlab-20260101T000000-000ba4d1"
    run_dir = train_run(gradlab_home / "runs", "gradlab__bandit/ppo", run_id=run_id,
                        overrides=("train.timesteps=1024", "train.checkpoint_freq=1024"))
    ckpt = list_checkpoints(run_dir)[-1]
    out = gradlab("export", str(ckpt), "--format", "rl-zoo", "--out", str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr
    assert "rl-zoo3 cannot build gradlab:Bandit-v0 (provider 'gradlab' is not a gymnasium registry env" in out.stderr
    assert "exported the SB3 files only" in out.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gradlab_export.json", "policy.zip"]
    assert "promoted no checkpoint" not in out.stderr  # a folder names its checkpoint
    assert gradlab("export", str(ckpt), "--format", "onnx", "--out", str(tmp_path / "x")).returncode == 2
    # By run id: the run promoted nothing (never supervised), so the export says what it took instead.
    by_id = gradlab("export", run_id, "--format", "sb3", "--out", str(tmp_path / "by-id"))
    assert by_id.returncode == 0, by_id.stderr
    assert (f"note: run {run_id} promoted no checkpoint (no checkpoint passed its acceptance rule, or the run has "
            "not finished): exporting the newest checkpoint (step 1024, local, not published)") in " ".join(
                by_id.stderr.split())
