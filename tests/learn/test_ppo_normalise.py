"""gradlab.ppo's ``train.normalize``: stable-baselines3's VecNormalize step for step, and a real run.

The statistics test drives two identically seeded vector envs with the same actions: one through
:class:`gradlab.learn.ppo_state.Normaliser` (gradlab.ppo's path), the other through SB3's own
``VecNormalize`` over gradlab's ``SB3VecEnv`` (sb3.ppo's path); every normalised observation,
reward and final observation and every running statistic must agree. The run test trains a
normalised Acrobot recipe, stops, resumes, evaluates and exports it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from gradlab.checkpoints import list_checkpoints, load_policy, verify_checkpoint
from gradlab.contracts.environment import EnvironmentSpec
from gradlab.envs import make_vector_env
from gradlab.learn.learner import run_learner
from gradlab.learn.ppo_state import Normaliser
from gradlab.outbox import Outbox
from tests.learn.conftest import make_spec

# Pendulum: varied rewards and a native time limit of 200 steps (truncations with final observations).
PENDULUM = {"provider": "gymnasium", "env_id": "Pendulum-v1", "n_envs": 3, "vectorization": "sync"}
# CartPole: terminations at different steps per lane.
CARTPOLE = {"provider": "gymnasium", "env_id": "CartPole-v1", "n_envs": 4, "vectorization": "sync",
            "task": {"termination": {"native_terminated": "failure"}}}
ACROBOT = {"provider": "gymnasium", "env_id": "Acrobot-v1", "n_envs": 4, "vectorization": "sync",
           "task": {"termination": {"native_terminated": "success"}}}


@pytest.mark.parametrize("env", [PENDULUM, CARTPOLE], ids=["pendulum", "cartpole"])
@pytest.mark.parametrize(("norm_obs", "norm_reward"), [(True, True), (True, False), (False, True)])
def test_statistics_equal_sb3_vecnormalize_on_the_same_steps(env: dict, norm_obs: bool, norm_reward: bool) -> None:
    from stable_baselines3.common.vec_env import VecNormalize

    from gradlab.envs.sb3 import SB3VecEnv

    spec = EnvironmentSpec.model_validate(env)
    ours_env = make_vector_env(spec, seed=3)
    theirs = VecNormalize(SB3VecEnv(make_vector_env(spec, seed=3)), norm_obs=norm_obs, norm_reward=norm_reward,
                          clip_obs=2.5, clip_reward=10.0, gamma=0.9, epsilon=1e-8)
    ours = Normaliser(spec.n_envs, ours_env.single_observation_space.shape, norm_obs=norm_obs,
                      norm_reward=norm_reward, clip_obs=2.5, gamma=0.9)
    space = ours_env.single_action_space
    rng = np.random.default_rng(0)
    first = ours.reset(ours_env.reset())
    np.testing.assert_array_equal(first, theirs.reset())
    ended = 0
    for _ in range(260):
        if hasattr(space, "n"):
            actions = rng.integers(0, space.n, spec.n_envs)
        else:
            actions = rng.uniform(space.low, space.high, (spec.n_envs, *space.shape)).astype(np.float32)
        res = ours_env.step(actions)
        done = res.terminated | res.truncated
        obs, reward = ours.step(res.obs, res.reward, done)
        theirs.step_async(actions)
        t_obs, t_reward, t_done, t_infos = theirs.step_wait()
        np.testing.assert_array_equal(done, t_done)
        np.testing.assert_allclose(obs, t_obs, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(reward, t_reward, rtol=1e-6, atol=1e-7)
        assert obs.dtype == t_obs.dtype and reward.dtype == np.float32
        for lane, final in res.final_obs.items():  # what the truncation bootstrap is computed from
            ended += 1
            np.testing.assert_allclose(ours.normalize_obs(final[None])[0], t_infos[lane]["terminal_observation"],
                                       rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(ours.returns, theirs.returns, rtol=1e-12)
    assert ended > 0  # episodes ended: the return reset and the final observations were compared
    np.testing.assert_allclose(ours.ret_rms.mean, theirs.ret_rms.mean, rtol=1e-12)
    np.testing.assert_allclose(ours.ret_rms.var, theirs.ret_rms.var, rtol=1e-12)
    assert ours.ret_rms.count == theirs.ret_rms.count
    if norm_obs:
        np.testing.assert_allclose(ours.obs_rms.mean, theirs.obs_rms.mean, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(ours.obs_rms.var, theirs.obs_rms.var, rtol=1e-12)
        assert ours.obs_rms.count == theirs.obs_rms.count
    theirs.close()
    ours_env.close()


def _update_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    lr = "train/algorithm/ppo/update/learning_rate"
    events = Outbox(run_dir / "outbox.sqlite").read(kind="metrics", limit=100_000)
    return {e.step: e.payload["metrics"] for e in events if lr in e.payload["metrics"]}


@pytest.mark.slow
def test_a_normalised_acrobot_run_checkpoints_resumes_evaluates_and_exports(tmp_path: Path) -> None:
    import torch

    from gradlab.contracts.goal import Goal
    from gradlab.evaluation.runner import evaluate_policy
    from gradlab.learn.ppo import PPOBackend
    from gradlab.share.export import export_checkpoint

    config = {"n_steps": 32, "batch_size": 64, "n_epochs": 2, "gamma": 0.99, "gae_lambda": 0.94, "threads": 1,
              "learning_rate": {"kind": "linear", "initial": 1e-3, "final": 0.0}}
    spec = make_spec(ACROBOT, {"id": "gradlab.ppo", "config": config}, timesteps=768, checkpoint_freq=256, seed=3,
                     normalize={"observation": True, "reward": True}, policy_model={"net_arch": [32]})
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    assert run_learner(spec, straight, watch_parent=False).final_step == 768
    stopped = run_learner(spec, broken, stop_at_step=384, watch_parent=False)
    assert (stopped.final_step, stopped.stop_reason) == (384, "stop_requested")
    middle = list_checkpoints(broken)[-1]
    assert verify_checkpoint(middle).step == 384
    assert "resume/vecnormalize.json" in verify_checkpoint(middle).files  # covered by the manifest
    assert json.loads((middle / "resume" / "state.json").read_text())["env_state"] == "lanes"
    resumed = run_learner(spec, broken, resume_from=middle, watch_parent=False)
    assert (resumed.final_step, resumed.stop_reason) == (768, "budget")

    # The resumed run is the uninterrupted one: statistics, weights, losses and raw episode figures.
    final_a, final_b = list_checkpoints(straight)[-1], list_checkpoints(broken)[-1]
    stats_a, stats_b = (json.loads((f / "resume" / "vecnormalize.json").read_text()) for f in (final_a, final_b))
    assert stats_a == stats_b and stats_a["norm_obs"] and stats_a["norm_reward"] and stats_a["gamma"] == 0.99
    assert stats_a["obs_rms"]["count"] == 768 + 4 + 1e-4  # the first reset and every step, VecNormalize's count
    wa, wb = load_file(str(final_a / "policy.safetensors")), load_file(str(final_b / "policy.safetensors"))
    assert sorted(wa) == sorted(wb) and all((wa[k] == wb[k]).all() for k in wa)
    a, b = _update_metrics(straight), _update_metrics(broken)
    for step in (s for s in a if s > 384):
        for name in ("train/algorithm/ppo/update/value_loss", "train/episode/count",
                     "train/reward/shaped/mean", "train/episode/return/raw/mean"):
            assert b[step].get(name) == a[step].get(name), (step, name)
    # Episode statistics and rollout rewards are raw (Acrobot pays -1 per step, never normalised).
    assert a[768]["train/reward/shaped/min"] == -1.0 and a[768]["train/reward/shaped/max"] in (-1.0, 0.0)

    # Evaluation and the player apply the frozen observation statistics of the weights-only policy.
    policy = load_policy(final_a)
    assert policy.spec.obs_normalization is not None and policy.spec.obs_normalization.clip == 10.0
    np.testing.assert_array_equal(wa["gradlab.obs_rms.mean"].numpy(), np.asarray(stats_a["obs_rms"]["mean"]))
    backend = PPOBackend()
    backend.setup(spec, backend.make_env(spec))
    assert backend.restore(final_a)
    # A warm start from it takes its observation statistics too (as sb3.ppo's does).
    from gradlab.contracts.run_spec import InitFrom

    m = verify_checkpoint(final_a)
    child = PPOBackend()
    child.setup(spec, child.make_env(spec))
    child.warm_start(InitFrom(source=str(final_a), checkpoint_sha256=m.sha256, checkpoint_step=m.step, path=str(final_a)))
    np.testing.assert_array_equal(child.normaliser.obs_rms.var, np.asarray(stats_a["obs_rms"]["var"]))
    child.close()
    raw = make_vector_env(spec.environment, seed=11).reset()
    with torch.no_grad():
        head, _ = backend.net(torch.as_tensor(backend.normaliser.normalize_obs(raw)))
    np.testing.assert_allclose(policy.action_probs(raw), torch.softmax(head, -1).numpy(), rtol=1e-5, atol=1e-6)
    backend.close()
    goal = Goal.model_validate({"goal_id": "test", "evaluation_mode": "evaluated",
                                "train": {"checkpoint_freq": 256, "environment": ACROBOT},
                                "eval": {"episodes": 4, "n_envs": 4, "seed": 0, "policy": "deterministic",
                                         "acceptance": [{"metric": "eval/episode/return/mean", "operator": ">=",
                                                         "threshold": -500}]}})
    result = evaluate_policy(policy, goal=goal, environment=spec.environment, hashes=spec.hashes,
                             checkpoint_sha256=verify_checkpoint(final_a).sha256, checkpoint_step=768)
    assert result.completed == 4 and result.verdict == "accepted"

    # Export writes SB3's vecnormalize.pkl from the JSON statistics, as for sb3.ppo.
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    layout, files = export_checkpoint(final_a, spec, tmp_path / "export", fmt="rl-zoo")
    assert layout == "rl-zoo"
    vec = next(p for p in files if p.name == "vecnormalize.pkl")
    import gymnasium as gym

    loaded = VecNormalize.load(str(vec), DummyVecEnv([lambda: gym.make("Acrobot-v1")]))  # our own file, just written
    np.testing.assert_array_equal(loaded.obs_rms.mean, np.asarray(stats_a["obs_rms"]["mean"]))
    assert loaded.ret_rms.var == stats_a["ret_rms"]["var"] and not loaded.training


@pytest.mark.parametrize("backend", ["sb3.ppo", "gradlab.ppo"])
def test_reward_only_normalisation_checkpoints_resumes_and_exports(backend: str, tmp_path: Path) -> None:
    """Only rewards normalised: VecNormalize then has no observation statistics (null in the JSON)."""
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from gradlab.share.export import export_checkpoint

    config = {"n_steps": 32, "batch_size": 64, "n_epochs": 1, "gamma": 0.9}
    spec = make_spec(ACROBOT, {"id": backend, "config": config}, timesteps=256, checkpoint_freq=128, seed=1,
                     normalize={"reward": True}, policy_model={"net_arch": [16]})
    run_learner(spec, tmp_path / "run", stop_at_step=128, watch_parent=False)
    middle = list_checkpoints(tmp_path / "run")[-1]
    assert run_learner(spec, tmp_path / "run", resume_from=middle, watch_parent=False).final_step == 256
    final = list_checkpoints(tmp_path / "run")[-1]
    stats = json.loads((final / "resume" / "vecnormalize.json").read_text())
    assert stats["obs_rms"] is None and stats["norm_reward"] and not stats["norm_obs"] and stats["gamma"] == 0.9
    assert stats["ret_rms"]["count"] == 256 + 1e-4
    assert load_policy(final).spec.obs_normalization is None
    _, files = export_checkpoint(final, spec, tmp_path / "export", fmt="sb3")
    vec = next(p for p in files if p.name == "vecnormalize.pkl")
    loaded = VecNormalize.load(str(vec), DummyVecEnv([lambda: gym.make("Acrobot-v1")]))  # our own file, just written
    assert loaded.ret_rms.var == stats["ret_rms"]["var"] and not loaded.norm_obs


BREAKOUT = {"provider": "ale", "env_id": "Breakout", "n_envs": 2, "num_threads": 1,
            "preprocessing": {"resize": [42, 42], "frame_stack": 2},
            "task": {"termination": {"max_episode_steps": 200}}}  # short evaluation episodes


def _one_lane_like(spec):
    """A one-lane SB3 vector env with the spec's frame and action spaces, for loading statistics."""
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv

    envs = make_vector_env(spec.environment, seed=0)
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    envs.close()

    class Spaces(gym.Env):
        def __init__(self) -> None:
            self.observation_space, self.action_space = obs_space, act_space

    return DummyVecEnv([Spaces])


@pytest.mark.parametrize("backend", ["sb3.ppo", "gradlab.ppo"])
def test_normalised_frames_checkpoint_evaluate_and_load_in_sb3(backend: str, tmp_path: Path) -> None:
    """Image observations normalised (per-pixel statistics, SB3's VecNormalize meaning): the
    weights-only policy takes the env's uint8 frames, applies the frozen statistics and feeds the
    Nature CNN unscaled; SB3 loads the checkpoint's ``policy.zip`` and acts as that policy does."""
    import torch
    from stable_baselines3 import PPO

    from gradlab.contracts.goal import Goal
    from gradlab.evaluation.runner import evaluate_policy

    config = {"n_steps": 16, "batch_size": 32, "n_epochs": 1}
    spec = make_spec(BREAKOUT, {"id": backend, "config": config}, timesteps=64, checkpoint_freq=64, seed=2,
                     normalize={"observation": True, "clip_observation": 5.0})
    assert run_learner(spec, tmp_path / "run", watch_parent=False).final_step == 64
    final = list_checkpoints(tmp_path / "run")[-1]
    stats = json.loads((final / "resume" / "vecnormalize.json").read_text())
    assert stats["norm_obs"] and np.asarray(stats["obs_rms"]["mean"]).shape == (2, 42, 42)
    policy = load_policy(final)
    spec_json = policy.spec
    assert (spec_json.normalize_images, spec_json.transpose_image, spec_json.extractor) == (False, False, "nature_cnn")
    assert spec_json.observation_space.dtype == "uint8"  # what the env gives
    assert (spec_json.policy_observation_space.dtype, spec_json.policy_observation_space.low,
            spec_json.policy_observation_space.high) == ("float32", -5.0, 5.0)  # what the network takes
    raw = make_vector_env(spec.environment, seed=11).reset()
    assert raw.dtype == np.uint8
    normalised = np.clip((raw - np.asarray(stats["obs_rms"]["mean"])) / np.sqrt(np.asarray(stats["obs_rms"]["var"]) + 1e-8),
                         -5.0, 5.0).astype(np.float32)
    model = PPO.load(str(final / "policy.zip"), device="cpu")  # the checkpoint this test just wrote
    assert model.policy.normalize_images is False
    with torch.no_grad():
        theirs = model.policy.get_distribution(torch.as_tensor(normalised)).distribution.probs.numpy()
    np.testing.assert_allclose(policy.action_probs(raw), theirs, rtol=1e-5, atol=1e-6)
    # `gradlab export --format sb3`: SB3's own VecNormalize.load of the exported statistics turns the
    # env's frames into what the exported policy.zip takes (rl-zoo's layout is refused for Atari).
    from stable_baselines3.common.vec_env import VecNormalize

    from gradlab.share.export import export_checkpoint

    _, files = export_checkpoint(final, spec, tmp_path / "sb3", fmt="sb3")
    assert sorted(f.name for f in files) == ["gradlab_export.json", "policy.zip", "vecnormalize.pkl"]
    loaded = VecNormalize.load(str(tmp_path / "sb3" / "vecnormalize.pkl"), _one_lane_like(spec))
    assert (loaded.norm_obs, loaded.training, loaded.clip_obs) == (True, False, 5.0)
    np.testing.assert_allclose(loaded.normalize_obs(raw), normalised, rtol=1e-5, atol=1e-5)
    exported = PPO.load(str(tmp_path / "sb3" / "policy.zip"), device="cpu")
    with torch.no_grad():
        played = exported.policy.get_distribution(torch.as_tensor(loaded.normalize_obs(raw))).distribution.probs.numpy()
    np.testing.assert_allclose(played, theirs, rtol=1e-5, atol=1e-6)
    goal = Goal.model_validate({"goal_id": "test", "evaluation_mode": "evaluated",
                                "train": {"checkpoint_freq": 64, "environment": BREAKOUT},
                                "eval": {"episodes": 2, "n_envs": 2, "seed": 0, "policy": "stochastic",
                                         "acceptance": [{"metric": "eval/episode/return/mean", "operator": ">=",
                                                         "threshold": 0}]}})
    result = evaluate_policy(policy, goal=goal, environment=spec.environment, hashes=spec.hashes,
                             checkpoint_sha256=verify_checkpoint(final).sha256, checkpoint_step=64)
    assert result.completed == 2 and result.verdict == "accepted"
