"""gradlab.ppo's rollout against sb3.ppo's (VecNormalize + PPO) on the same seed, step by step.

Together with ``tests/learn/test_ppo_parity.py`` (one update on the same batch equals SB3's
``PPO.train``) this is the step-by-step comparison of a normalised run: with the same seed both
backends build the same initial network and the same lanes, and their first rollout, its
normalised observations and rewards, the truncation bootstrap, GAE and the running statistics,
must agree. Acrobot-v1 is the normalised goal whose learning speed was in question; a short time
limit makes the rollout contain truncations (bootstrapped) beside terminations.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradlab.learn.ppo import PPOBackend
from gradlab.learn.sb3 import SB3Backend
from tests.learn.conftest import make_spec

ACROBOT = {"provider": "gymnasium", "env_id": "Acrobot-v1", "n_envs": 4, "vectorization": "sync",
           "task": {"termination": {"native_terminated": "success", "max_episode_steps": 40}}}
CONFIG = {"n_steps": 64, "batch_size": 64, "n_epochs": 1, "gamma": 0.99, "gae_lambda": 0.94, "ent_coef": 0.0}


def _time_major(buf: np.ndarray) -> torch.Tensor:
    """SB3's (n_steps, n_envs, ...) buffer as a float tensor."""
    return torch.as_tensor(np.asarray(buf, dtype=np.float32))


def _both_first_rollouts(spec: object) -> tuple[SB3Backend, PPOBackend]:
    """sb3.ppo set up and its first rollout collected, then gradlab.ppo set up with the same
    initial parameters checked (one after the other: both draw from torch's global generator,
    seeded by each setup). ``spec(backend_id)`` gives each side's run spec."""
    theirs = SB3Backend("sb3.ppo")
    s3 = spec("sb3.ppo")
    theirs.setup(s3, SB3Backend.make_env(s3), device="cpu")
    initial = {k: v.clone() for k, v in theirs.model.policy.state_dict().items()}
    theirs.begin(resumed=False)
    theirs.collect()
    ours = PPOBackend()
    sg = spec("gradlab.ppo")
    ours.setup(sg, PPOBackend.make_env(sg), device="cpu")
    for name, p in initial.items():  # the same seed builds the same network (up to the QR's threads)
        assert torch.allclose(ours.net.state_dict()[name], p, rtol=0, atol=1e-6), name
    return theirs, ours


@pytest.mark.parametrize("normalize", [{"observation": True, "reward": True}, {"observation": False, "reward": True},
                                       None], ids=["obs-and-reward", "reward-only", "none"])
def test_first_rollout_equals_sb3s_vecnormalize_and_ppo(normalize: dict | None) -> None:
    def spec(backend: str) -> object:
        return make_spec(ACROBOT, {"id": backend, "config": CONFIG}, timesteps=4096, checkpoint_freq=4096, seed=3,
                         normalize=normalize)

    theirs, ours = _both_first_rollouts(spec)
    try:
        ours.begin(resumed=False)
        ours.collect()
        buf = theirs.model.rollout_buffer
        ends = int(ours.buf_dones.sum())
        truncated = int((ours.buf_boot != 0).sum())
        assert ends > 0 and truncated > 0, "the rollout must hold episode ends and truncations"
        pairs = {
            "observations (as the network sees them)": (ours.buf_obs, _time_major(buf.observations)),
            "actions": (ours.buf_actions.float(), _time_major(buf.actions).squeeze(-1)),
            "log-probabilities": (ours.buf_logp, _time_major(buf.log_probs)),
            "values": (ours.buf_values, _time_major(buf.values)),
            # SB3 adds gamma * V(final obs) of a truncated step to its (normalised) reward in place
            "rewards + truncation bootstrap": (ours.buf_rewards + ours.buf_boot, _time_major(buf.rewards)),
            "advantages": (ours.advantages, _time_major(buf.advantages)),
            "returns (value targets)": (ours.returns, _time_major(buf.returns)),
        }
        for what, (a, b) in pairs.items():
            assert a.shape == b.shape, what
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), f"{what}: max difference {float((a - b).abs().max())}"
        if normalize is not None:
            vn, norm = theirs.vecnormalize, ours.normaliser
            np.testing.assert_allclose(norm.ret_rms.var, vn.ret_rms.var, rtol=1e-10)
            np.testing.assert_allclose(norm.returns, vn.returns, rtol=1e-10)
            if normalize["observation"]:
                np.testing.assert_allclose(norm.obs_rms.mean, vn.obs_rms.mean, rtol=1e-10)
                np.testing.assert_allclose(norm.obs_rms.var, vn.obs_rms.var, rtol=1e-10)
    finally:
        theirs.close()
        ours.close()


BREAKOUT = {"provider": "ale", "env_id": "Breakout", "n_envs": 2, "num_threads": 1,
            "preprocessing": {"resize": [42, 42], "frame_stack": 2}}


def test_normalised_frames_roll_out_as_sb3s_vecnormalize_over_a_nature_cnn() -> None:
    """``train.normalize.observation`` of images, SB3's meaning: per-pixel running statistics,
    float32 frames in [-clip, clip] fed to the Nature CNN unscaled (``normalize_images=False``)."""
    def spec(backend: str) -> object:
        return make_spec(BREAKOUT, {"id": backend, "config": {"n_steps": 16, "batch_size": 32, "n_epochs": 1}},
                         timesteps=64, checkpoint_freq=64, seed=3, normalize={"observation": True})

    theirs, ours = _both_first_rollouts(spec)
    try:
        assert theirs.model.policy.normalize_images is False
        assert ours.net.nature_cnn and ours.obs_space.dtype == np.float32 and ours.obs_space.high.max() == 10.0
        ours.begin(resumed=False)
        ours.collect()
        buf = theirs.model.rollout_buffer
        observations = _time_major(buf.observations)
        assert ours.buf_obs.dtype == torch.float32 and float(ours.buf_obs.abs().max()) > 1.0  # not scaled by 1/255
        pairs = {"observations": (ours.buf_obs, observations),
                 "actions": (ours.buf_actions.float(), _time_major(buf.actions).squeeze(-1)),
                 "log-probabilities": (ours.buf_logp, _time_major(buf.log_probs)),
                 "values": (ours.buf_values, _time_major(buf.values))}
        for what, (a, b) in pairs.items():
            assert a.shape == b.shape, what
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), f"{what}: max difference {float((a - b).abs().max())}"
        np.testing.assert_allclose(ours.normaliser.obs_rms.var, theirs.vecnormalize.obs_rms.var, rtol=1e-10)
    finally:
        theirs.close()
        ours.close()


def test_channel_last_frames_are_not_normalised() -> None:
    """Normalised frames are no longer an image space, so nothing transposes them: (H, W, C) frames
    would reach the Nature CNN with their height as channels. Refused, naming the key."""
    from gymnasium import spaces

    from gradlab.contracts.recipe import Normalize
    from gradlab.errors import ConfigError
    from gradlab.learn.sb3_model import normalizes_images

    frames = spaces.Box(0, 255, (84, 84, 4), np.uint8)
    with pytest.raises(ConfigError, match=r"^train.normalize.observation: normalised frames must be channel-first "
                                          r"\(C, H, W\), found \(84, 84, 4\)"):
        normalizes_images(frames, Normalize(observation=True))
    assert not normalizes_images(frames, Normalize(reward=True))
    assert normalizes_images(spaces.Box(0, 255, (4, 84, 84), np.uint8), Normalize(observation=True))


def _train(backend: object, spec: object, iterations: int) -> tuple[list[dict[str, torch.Tensor]], list[dict[str, float]]]:
    """Parameters and update metrics after each of ``iterations`` rollouts and updates."""
    backend.setup(spec, type(backend).make_env(spec), device="cpu")
    backend.begin(resumed=False)
    net = backend.model.policy if isinstance(backend, SB3Backend) else backend.net
    params, metrics = [], []
    try:
        for _ in range(iterations):
            backend.collect()
            metrics.append(backend.update())
            params.append({k: v.detach().clone() for k, v in net.state_dict().items()})
    finally:
        backend.close()
    return params, metrics


# The goals' own recipes (rl-zoo3's hyperparameters), fewer lanes where a rollout is long; the
# lane count is not part of the run's semantics.
RECIPES = {"Acrobot-v1/ppo": [], "MountainCar-v0/ppo": [], "LunarLander-v3/ppo": ["train.environment.n_envs=2"],
           "CartPole-v1/ppo": []}


@pytest.mark.parametrize("ref", list(RECIPES))
def test_the_same_seed_trains_sb3s_run(ref: str) -> None:
    # Three rollouts and updates: both backends draw the minibatch order from NumPy's generator as
    # SB3's RolloutBuffer does and sample actions from torch's, so the runs stay equal (up to
    # rounding) across updates, not only for the first rollout.
    from gradlab.contracts.experiments import Experiments
    from gradlab.contracts.run_spec import RunSpec

    def spec(backend: str) -> object:
        overrides = [f"train.backend.id={backend}", "train.device=cpu", *RECIPES[ref]]
        return RunSpec.from_resolved(Experiments().resolve(ref, overrides), seed=5)

    theirs, their_metrics = _train(SB3Backend("sb3.ppo"), spec("sb3.ppo"), iterations=3)
    ours, our_metrics = _train(PPOBackend(), spec("gradlab.ppo"), iterations=3)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        for name in b:
            diff = float((a[name] - b[name]).abs().max())
            assert diff < 1e-4, f"update {i + 1}: {name} differs by {diff}"
    key = "train/algorithm/ppo/update/approx_kl"
    for i, (a, b) in enumerate(zip(our_metrics, their_metrics, strict=True)):
        assert a[key] == pytest.approx(b[key], rel=1e-3, abs=1e-7), f"update {i + 1}: {key}"
        assert a[key] > 0  # the policy moved
