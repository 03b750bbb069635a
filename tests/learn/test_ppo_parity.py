"""gradlab.ppo against stable-baselines3: initial parameters, one update, GAE, bootstrap, policies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gradlab.contracts.recipe import GradlabPPOConfig, PolicyModel
from gradlab.learn.ppo import PPOBackend
from gradlab.learn.ppo_net import build_network
from gradlab.learn.ppo_rollout import compute_gae
from gradlab.learn.ppo_update import ppo_update
from tests.learn.conftest import CARTPOLE, make_spec

SB3_KW = dict(n_steps=16, batch_size=32, n_epochs=3, gamma=0.98, gae_lambda=0.9, clip_range=0.2, clip_range_vf=0.3,
              ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, learning_rate=1e-3)


def _sb3_cartpole(seed: int, **kw: object) -> object:
    from stable_baselines3 import PPO
    from stable_baselines3.common.utils import set_random_seed

    from gradlab.envs import make_vector_env
    from gradlab.envs.sb3 import SB3VecEnv

    spec = make_spec(CARTPOLE, {"id": "sb3.ppo", "config": {}}, timesteps=1024, checkpoint_freq=1024, seed=seed)
    env = SB3VecEnv(make_vector_env(spec.environment, seed=seed))
    set_random_seed(seed)
    return PPO("MlpPolicy", env, policy_kwargs={"net_arch": [64, 64]}, device="cpu", verbose=0, **{**SB3_KW, **kw})


def _spaces(obs_shape: tuple[int, ...], dtype: type = np.float32, n_actions: int = 2) -> tuple[object, object]:
    from gymnasium import spaces

    if dtype is np.uint8:
        return spaces.Box(0, 255, obs_shape, np.uint8), spaces.Discrete(n_actions)
    return spaces.Box(-np.inf, np.inf, obs_shape, np.float32), spaces.Discrete(n_actions)


@pytest.mark.parametrize("case", ["mlp", "nature_cnn", "mlp_separate_extractors"])
def test_same_seed_gives_sb3s_initial_parameters(case: str) -> None:
    from stable_baselines3.common.policies import ActorCriticCnnPolicy, ActorCriticPolicy

    if case == "nature_cnn":
        obs, act = _spaces((4, 36, 36), np.uint8, 4)  # the smallest frames the Nature CNN takes: fast to build
        pm = PolicyModel(extractor="nature_cnn", net_arch=[], activation="relu")
        cls, kw = ActorCriticCnnPolicy, {"net_arch": [], "activation_fn": torch.nn.ReLU}
    else:
        obs, act = _spaces((4,))
        share = case == "mlp"
        pm = PolicyModel(net_arch={"pi": [32, 16], "vf": [8]}, share_features_extractor=share)
        cls, kw = ActorCriticPolicy, {"net_arch": {"pi": [32, 16], "vf": [8]}, "share_features_extractor": share}
    torch.manual_seed(7)
    theirs = cls(obs, act, lambda _: 1e-3, **kw).state_dict()
    torch.manual_seed(7)
    ours = build_network(obs, act, pm).state_dict()
    assert list(ours) == list(theirs)  # same tensor names, same order
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


def _flat(buf: object, name: str) -> torch.Tensor:
    arr = getattr(buf, name)
    return torch.as_tensor(arr.swapaxes(0, 1).reshape(arr.shape[0] * arr.shape[1], *arr.shape[2:]).copy())


def _sb3_rollout_batch(model: object) -> dict[str, torch.Tensor]:
    """One rollout collected by SB3 itself, flattened (time-major per lane, as SB3's train reads it)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Nothing(BaseCallback):
        def _on_step(self) -> bool:
            return True

    cb = Nothing()
    model._setup_learn(1024, cb)
    cb.on_training_start({}, {})
    model.collect_rollouts(model.env, cb, model.rollout_buffer, n_rollout_steps=model.n_steps)
    buf = model.rollout_buffer
    return {"obs": _flat(buf, "observations"), "actions": _flat(buf, "actions").long().flatten(),
            "old_log_prob": _flat(buf, "log_probs").flatten(), "old_values": _flat(buf, "values").flatten(),
            "advantages": _flat(buf, "advantages").flatten(), "returns": _flat(buf, "returns").flatten()}


@pytest.mark.parametrize("fast", [True, False], ids=["hand-written-gradients", "autograd"])
def test_one_update_equals_sb3_train(fast: bool) -> None:
    model = _sb3_cartpole(seed=5)
    batch = _sb3_rollout_batch(model)
    n = batch["advantages"].shape[0]
    rng = np.random.RandomState(11)
    perms = [torch.as_tensor(rng.permutation(n)) for _ in range(SB3_KW["n_epochs"])]

    net = build_network(model.observation_space, model.action_space, PolicyModel(net_arch=[64, 64]))
    net.load_state_dict(model.policy.state_dict(), strict=True)  # the same initial parameters
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-5, fused=True)
    cfg = GradlabPPOConfig(**{k: v for k, v in SB3_KW.items() if k != "learning_rate"})

    np.random.seed(11)  # SB3's RolloutBuffer.get draws np.random.permutation once per epoch
    model._current_progress_remaining = 1.0
    model.train()
    logged = dict(model.logger.name_to_value)
    out = ppo_update(net, opt, batch, cfg, clip_range=0.2, ent_coef=0.01, permutations=perms, fast=fast)

    assert out["epochs"] == 3 and logged["train/n_updates"] == 3
    for ours, theirs in (("pg_loss", "train/policy_gradient_loss"), ("value_loss", "train/value_loss"),
                         ("clip_fraction", "train/clip_fraction"), ("approx_kl", "train/approx_kl"),
                         ("loss", "train/loss")):
        assert out[ours] == pytest.approx(logged[theirs], rel=1e-4, abs=1e-6), ours
    assert -out["entropy"] == pytest.approx(logged["train/entropy_loss"], rel=1e-5)
    theirs = dict(model.policy.named_parameters())
    for name, p in net.named_parameters():
        assert torch.allclose(p.grad, theirs[name].grad, rtol=1e-4, atol=1e-6), f"gradient of {name}"
        assert torch.allclose(p, theirs[name], rtol=1e-4, atol=1e-6), f"updated {name}"
        assert not torch.equal(p, model.policy.state_dict()[name] * 0)  # it moved from zero init (non-trivial)
    model.env.close()


def test_kl_early_stop_follows_sb3s_rule() -> None:
    """target_kl: an epoch stops before the step of the first minibatch with KL > 1.5 * target_kl."""
    model = _sb3_cartpole(seed=2, target_kl=1e-9, n_epochs=4)
    batch = _sb3_rollout_batch(model)
    net = build_network(model.observation_space, model.action_space, PolicyModel(net_arch=[64, 64]))
    net.load_state_dict(model.policy.state_dict(), strict=True)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-5)
    cfg = GradlabPPOConfig(**{**{k: v for k, v in SB3_KW.items() if k != "learning_rate"}, "target_kl": 1e-9, "n_epochs": 4})
    perms = [torch.arange(128)] * 4
    out = ppo_update(net, opt, batch, cfg, clip_range=0.2, ent_coef=0.01, permutations=perms, fast=True)
    np.random.seed(0)
    model._current_progress_remaining = 1.0
    model.train()
    # First minibatch (KL 0) steps, the second exceeds 1.5e-9 and stops the first epoch: one epoch, one step.
    assert out["epochs"] == model.logger.name_to_value["train/n_updates"] == 1
    assert out["approx_kl"] > 1.5e-9
    model.env.close()


# -- GAE --------------------------------------------------------------------------------------------
GAMMA, LAM = 0.9, 0.8


def _trajectories() -> dict[str, np.ndarray]:
    """3 steps x 3 lanes. Step 1: lane 0 terminates and lane 1 is truncated (both in one step);
    lane 2 never ends. V(final obs of lane 1) = 4.0."""
    rewards = np.array([[1.0, 0.5, 0.2], [2.0, 1.0, 0.3], [0.5, 0.25, 0.4]], dtype=np.float32)
    values = np.array([[0.3, 0.6, 0.9], [0.2, 0.7, 1.1], [0.4, 0.1, 1.3]], dtype=np.float32)
    terminated = np.array([[0, 0, 0], [1, 0, 0], [0, 0, 0]], dtype=bool)
    truncated = np.array([[0, 0, 0], [0, 1, 0], [0, 0, 0]], dtype=bool)
    last_values = np.array([0.7, 0.8, 1.5], dtype=np.float32)
    return {"rewards": rewards, "values": values, "terminated": terminated, "truncated": truncated,
            "last_values": last_values, "final_value": np.float32(4.0)}


def _hand_gae(d: dict[str, np.ndarray]) -> np.ndarray:
    """Forward sums A_t = sum_k (gamma lambda)^k delta_{t+k} within each episode, by hand."""
    r, v = d["rewards"].astype(np.float64), d["values"].astype(np.float64)
    T, N = r.shape
    adv = np.zeros((T, N))
    for lane in range(N):
        for t in range(T):
            total, discount = 0.0, 1.0
            for k in range(t, T):
                if d["terminated"][k, lane]:
                    delta = r[k, lane] - v[k, lane]
                elif d["truncated"][k, lane]:
                    delta = r[k, lane] + GAMMA * float(d["final_value"]) - v[k, lane]
                else:
                    nxt = v[k + 1, lane] if k + 1 < T else d["last_values"][lane]
                    delta = r[k, lane] + GAMMA * nxt - v[k, lane]
                total += discount * delta
                if d["terminated"][k, lane] or d["truncated"][k, lane]:
                    break
                discount *= GAMMA * LAM
            adv[t, lane] = total
    return adv


def test_gae_equals_hand_computation_and_sb3_rollout_buffer() -> None:
    from gymnasium import spaces
    from stable_baselines3.common.buffers import RolloutBuffer

    d = _trajectories()
    dones = (d["terminated"] | d["truncated"]).astype(np.float32)
    boot = np.where(d["truncated"], GAMMA * d["final_value"], 0.0).astype(np.float32)
    ours_adv, ours_ret = compute_gae(torch.as_tensor(d["rewards"] + boot), torch.as_tensor(d["values"]),
                                     torch.as_tensor(dones), torch.as_tensor(d["last_values"]), GAMMA, LAM)
    hand = _hand_gae(d)
    assert ours_adv.numpy() == pytest.approx(hand, abs=1e-5)
    # The CPU rollout runs the recursion on NumPy views: bitwise the same float32 results.
    np_adv, np_ret = compute_gae((d["rewards"] + boot).astype(np.float32), d["values"].astype(np.float32), dones,
                                 d["last_values"].astype(np.float32), GAMMA, LAM)
    assert np_adv.dtype == np.float32 and np.array_equal(np_adv, ours_adv.numpy())
    assert np.array_equal(np_ret, ours_ret.numpy())
    assert ours_ret.numpy() == pytest.approx(hand + d["values"], abs=1e-5)
    # Hand-checked corners: lane 0 step 1 terminates (delta = r - V), lane 1 step 1 bootstraps.
    assert hand[1, 0] == pytest.approx(2.0 - 0.2)
    assert hand[1, 1] == pytest.approx(1.0 + 0.9 * 4.0 - 0.7)

    buf = RolloutBuffer(3, spaces.Box(-1, 1, (1,)), spaces.Discrete(2), device="cpu", gamma=GAMMA, gae_lambda=LAM, n_envs=3)
    starts = np.ones(3, dtype=np.float32)
    for t in range(3):  # SB3 adds gamma * V(terminal obs) to a truncated step's reward before storing it
        buf.add(np.zeros((3, 1)), np.zeros((3, 1)), d["rewards"][t] + boot[t], starts,
                torch.as_tensor(d["values"][t]), torch.zeros(3))
        starts = dones[t]
    buf.compute_returns_and_advantage(torch.as_tensor(d["last_values"]), dones[2].astype(bool))
    assert ours_adv.numpy() == pytest.approx(buf.advantages, abs=1e-6)
    assert ours_ret.numpy() == pytest.approx(buf.returns, abs=1e-6)


@pytest.mark.parametrize(("end", "last_target"), [("truncate", 10.0), ("terminate", 1.0)])
def test_backend_bootstraps_only_on_truncation(end: str, last_target: float) -> None:
    env = {"provider": "gradlab", "env_id": "Corridor-v0", "n_envs": 2, "provider_args": {"length": 5, "end": end}}
    spec = make_spec(env, {"id": "gradlab.ppo", "config": {"n_steps": 5, "batch_size": 10, "gamma": 0.9,
                                                            "gae_lambda": 0.95, "threads": 1}},
                     timesteps=10, checkpoint_freq=10)
    backend = PPOBackend()
    backend.setup(spec, backend.make_env(spec))
    with torch.no_grad():  # V(s) = 10 everywhere
        backend.net.value_net.weight.zero_()
        backend.net.value_net.bias.fill_(10.0)
    backend.begin(resumed=False)
    backend.collect()
    returns = backend.returns.numpy()
    backend.close()
    assert returns[4] == pytest.approx([last_target] * 2, abs=1e-5)
    if end == "terminate":
        assert returns[3] == pytest.approx([10.0 + 0.9 * 0.95 * (1.0 - 10.0)] * 2, abs=1e-5)
    else:
        assert returns == pytest.approx(np.full((5, 2), 10.0), abs=1e-5)


# -- interchangeable weights-only policies ---------------------------------------------------------
def test_gradlab_and_sb3_policies_are_interchangeable(tmp_path: Path) -> None:
    from stable_baselines3 import PPO

    from gradlab.checkpoints.policy import load_policy
    from gradlab.learn.learner import run_learner

    cfg = {"n_steps": 32, "batch_size": 64, "n_epochs": 2}
    ckpt = {}
    for backend in ("gradlab.ppo", "sb3.ppo"):
        spec = make_spec(CARTPOLE, {"id": backend, "config": cfg}, timesteps=512, checkpoint_freq=512, seed=1)
        result = run_learner(spec, tmp_path / backend, watch_parent=False)
        ckpt[backend] = Path(result.checkpoints[-1])
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    ours = load_policy(ckpt["gradlab.ppo"])  # gradlab's loader rebuilds SB3's ActorCriticPolicy
    theirs = load_policy(ckpt["sb3.ppo"])
    assert ours.spec.model_dump(exclude={"backend_id"}) == theirs.spec.model_dump(exclude={"backend_id"})
    # The loaded gradlab.ppo policy gives our network's probabilities and values.
    spec = make_spec(CARTPOLE, {"id": "gradlab.ppo", "config": cfg}, timesteps=512, checkpoint_freq=512, seed=1)
    backend = PPOBackend()
    backend.setup(spec, backend.make_env(spec))
    backend.restore(ckpt["gradlab.ppo"])
    with torch.no_grad():
        head, value = backend.net(torch.as_tensor(obs))
    assert ours.action_probs(obs) == pytest.approx(torch.softmax(head, -1).numpy(), abs=1e-6)
    assert ours.value(obs) == pytest.approx(value.numpy(), abs=1e-5)
    # An sb3.ppo policy's tensors load into gradlab.ppo's network and act the same.
    from safetensors.torch import load_file

    backend.net.load_state_dict(load_file(str(ckpt["sb3.ppo"] / "policy.safetensors")), strict=True)
    with torch.no_grad():
        head, _ = backend.net(torch.as_tensor(obs))
    assert theirs.action_probs(obs) == pytest.approx(torch.softmax(head, -1).numpy(), abs=1e-6)
    backend.close()
    # policy.zip is an SB3 PPO zip of the same weights.
    loaded = PPO.load(str(ckpt["gradlab.ppo"] / "policy.zip"), device="cpu")
    probs = loaded.policy.get_distribution(torch.as_tensor(obs)).distribution.probs.detach().numpy()
    assert probs == pytest.approx(ours.action_probs(obs), abs=1e-6)


def test_nature_cnn_policy_loads_in_gradlabs_loader(tmp_path: Path) -> None:
    """Breakout (uint8 frames, channels-last convolutions, bf16): the checkpoint's policy acts as our network."""
    from gradlab.checkpoints.policy import load_policy
    from gradlab.contracts.experiments import Experiments
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.learn.learner import run_learner

    overrides = ["train.backend.id=gradlab.ppo", "train.timesteps=64", "train.checkpoint_freq=64",
                 "train.environment.n_envs=2", "train.backend.config.n_steps=32", "train.backend.config.batch_size=32",
                 "train.backend.config.n_epochs=1", "train.backend.config.precision=bf16", "train.backend.config.threads=1",
                 "train.device=cpu"]
    spec = RunSpec.from_resolved(Experiments().resolve("Breakout-Atari2600-v0/ppo", overrides), seed=0)
    result = run_learner(spec, tmp_path / "run", watch_parent=False)
    policy = load_policy(Path(result.checkpoints[-1]))
    assert (policy.spec.backend_id, policy.spec.extractor, policy.spec.transpose_image) == ("gradlab.ppo", "nature_cnn", False)
    backend = PPOBackend()
    backend.setup(spec, backend.make_env(spec))
    backend.restore(Path(result.checkpoints[-1]))
    obs = np.random.default_rng(0).integers(0, 256, size=(3, 4, 84, 84), dtype=np.uint8)
    with torch.no_grad():
        head, value = backend.net(torch.as_tensor(obs))
    backend.close()
    assert policy.action_probs(obs) == pytest.approx(torch.softmax(head, -1).numpy(), abs=1e-5)
    assert policy.value(obs) == pytest.approx(value.numpy(), abs=1e-4)


def test_one_nature_cnn_update_equals_sb3_train() -> None:
    """Breakout frames through the Nature CNN: the 1/255 folded into the first convolution, frames
    stored channels-last and gathered by ``take_rows``, against SB3's ``CnnPolicy`` and ``PPO.train``."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.utils import set_random_seed

    from gradlab.contracts.experiments import Experiments
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.envs import make_vector_env
    from gradlab.envs.sb3 import SB3VecEnv

    spec = RunSpec.from_resolved(Experiments().resolve("Breakout-Atari2600-v0/ppo-sb3", ["train.environment.n_envs=2"]), seed=3)
    env = SB3VecEnv(make_vector_env(spec.environment, seed=3))
    set_random_seed(3)
    kw = {**SB3_KW, "batch_size": 16, "n_epochs": 2}
    model = PPO("CnnPolicy", env, device="cpu", verbose=0, **kw)
    batch = _sb3_rollout_batch(model)
    n = batch["advantages"].shape[0]
    # Stored as the backend stores channel-first frames: channels-last, the same values.
    batch["obs"] = batch["obs"].permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    assert batch["obs"].is_contiguous(memory_format=torch.channels_last) and batch["obs"].dtype == torch.uint8
    rng = np.random.RandomState(5)
    perms = [torch.as_tensor(rng.permutation(n)) for _ in range(kw["n_epochs"])]
    pm = PolicyModel(extractor="nature_cnn", net_arch=[], activation="tanh")
    net = build_network(model.observation_space, model.action_space, pm)
    net.load_state_dict(model.policy.state_dict(), strict=True)
    net = net.to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-5, fused=True)
    cfg = GradlabPPOConfig(**{k: v for k, v in kw.items() if k != "learning_rate"})
    first = net.features_extractor.cnn[0].weight.detach().clone()

    np.random.seed(5)
    model._current_progress_remaining = 1.0
    model.train()
    logged = dict(model.logger.name_to_value)
    out = ppo_update(net, opt, batch, cfg, clip_range=0.2, ent_coef=0.01, permutations=perms)

    for ours, theirs in (("pg_loss", "train/policy_gradient_loss"), ("value_loss", "train/value_loss"),
                         ("approx_kl", "train/approx_kl"), ("loss", "train/loss")):
        assert out[ours] == pytest.approx(logged[theirs], rel=1e-3, abs=1e-6), ours
    theirs = dict(model.policy.named_parameters())
    for name, p in net.named_parameters():
        assert torch.allclose(p.grad, theirs[name].grad, rtol=1e-3, atol=1e-6), f"gradient of {name}"
        # Adam moves a weight by about lr per step whatever its gradient's size, so a gradient that is
        # zero up to rounding (a unit ReLU keeps off) may step either way: all but a few in 1,000
        # weights agree within rounding, and none by more than the steps taken could move it.
        off = (p - theirs[name]).abs() > 1e-5 + 1e-4 * theirs[name].abs()
        assert off.float().mean() <= 1e-3, f"updated {name}: {int(off.sum())} of {off.numel()} weights differ"
        assert float((p - theirs[name]).abs().max()) <= 2 * kw["learning_rate"] * 4, f"updated {name}"
    assert not torch.allclose(net.features_extractor.cnn[0].weight, first, rtol=1e-4, atol=1e-6)  # the update moved it
    model.env.close()
