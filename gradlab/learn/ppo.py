"""The ``gradlab.ppo`` backend: PPO written for gradlab's vector env, tensors end to end.

Read top to bottom (the network, :class:`ActorCritic`, is in :mod:`gradlab.learn.ppo_net`): GAE (:func:`compute_gae`), one update
(:func:`ppo_update`), then the backend the learner drives (:class:`PPOBackend`: setup → begin →
collect → update → save/restore), with the same interface, metric names and checkpoint bundle
as :class:`gradlab.learn.sb3.SB3Backend` (docs/ARCHITECTURE.md section 5).

Semantics are stable-baselines3 2.x PPO's (``PPO.train``, ``OnPolicyAlgorithm.collect_rollouts``,
``RolloutBuffer.compute_returns_and_advantage``), which the parity tests in
``tests/learn/test_ppo_parity.py`` check term by term:

* the network has SB3 ``ActorCriticPolicy``'s modules and tensor names, built in the same order
  with SB3's orthogonal initialisation (gain sqrt(2) for the extractor and hidden layers, 0.01 for
  the action head, 1 for the value head), so the same seed gives the same initial parameters and a
  ``gradlab.ppo`` weights-only policy loads in :class:`gradlab.checkpoints.policy.Policy` exactly
  like an ``sb3.ppo`` one;
* a truncated step's reward gets ``gamma * V(true final observation)`` (the vector env keeps it in
  ``StepResult.final_obs``); a terminated step is never bootstrapped;
* advantages are normalised per minibatch (``(A - mean) / (std + 1e-8)``, unbiased std); the
  value loss is clipped around the rollout's values when ``clip_range_vf`` is set; an epoch stops
  at the first minibatch whose approximate KL exceeds ``1.5 * target_kl`` (SB3's rule, before
  that minibatch's gradient step);
* Adam with ``eps=1e-5``, gradients clipped to ``max_grad_norm``; the learning rate, clip range
  and entropy coefficient follow their schedules with SB3's ``progress_remaining``.

What differs is speed: the rollout lives in preallocated ``(n_steps, n_envs)`` tensors written in
place, the policy step is a few tensor operations (no distribution objects), minibatch
permutations are drawn on the device, and losses stay on the device until the update ends.

Resume state (``resume/`` in a checkpoint), never pickle: ``state.json`` (counters, schedules'
progress, every RNG stream, episode windows, optimizer hyperparameters) and
``optimizer.safetensors`` (Adam's moments and step counts by parameter index), and, as
``sb3.ppo`` writes them, the lane state (``lanes.json`` + ``lanes.npz`` + ``last_obs.npy``: a
resumed run continues the same episodes) and the normalisation statistics (``vecnormalize.json``,
``train.normalize`` with VecNormalize's rules): :mod:`gradlab.learn.ppo_state`.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.checkpoints.manifest import POLICY_FILE, RESUME_DIR
from gradlab.contracts.recipe import GradlabPPOConfig
from gradlab.contracts.run_spec import RunSpec
from gradlab.errors import ConfigError, ContractViolation
from gradlab.learn import ppo_mlp
from gradlab.learn.backend_config import validate_backend_config
from gradlab.learn.ppo_net import build_network, is_image, log_prob_entropy, sample_actions
from gradlab.learn.ppo_state import VECNORMALIZE_FILE, Normaliser, restore_lanes, save_lanes
from gradlab.learn.resume_state import LANES_SAVED, load_resume_policy, rng_state, set_rng_state
from gradlab.learn.schedules import schedule_fn
from gradlab.learn.stats import EpisodeStats, RolloutStats
from gradlab.learn.warm_start import check_warm_start_tensors, read_warm_start_parent

logger = logging.getLogger(__name__)

BACKEND_ID = "gradlab.ppo"
ALGORITHM = "ppo"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "state.json"
ADAM_EPS = 1e-5
"""SB3's ``ActorCriticPolicy`` Adam epsilon (``optimizer_kwargs["eps"] = 1e-5``)."""


# -- advantages -------------------------------------------------------------------------------
def compute_gae(rewards: Any, values: Any, dones: Any, last_values: Any, gamma: float, gae_lambda: float) -> tuple[Any, Any]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16), SB3's recursion.

    Works on numpy arrays or torch tensors alike (only arithmetic and indexing).

    Args:
        rewards: (T, N) float32, each step's reward with ``gamma * V(final obs)`` already added
            on truncated steps.
        values: (T, N) float32, V(s_t) of the rollout's observations.
        dones: (T, N) float32, 1.0 where the lane's episode ended at step t (terminated or truncated).
        last_values: (N,) float32, V of the observation after the last step.

    Returns:
        (advantages (T, N), returns (T, N) = advantages + values).
    """
    advantages = values * 0
    last = last_values * 0
    for t in reversed(range(rewards.shape[0])):
        next_values = last_values if t == rewards.shape[0] - 1 else values[t + 1]
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_values * not_done - values[t]
        last = delta + gamma * gae_lambda * not_done * last
        advantages[t] = last
    return advantages, advantages + values


# -- one update ---------------------------------------------------------------------------------
def take_rows(tensor: Any, index: Any) -> Any:
    """``tensor[index]`` along dim 0, keeping a channels-last image batch channels-last.

    ``index_select`` is a row copy, several times faster than advanced indexing on uint8 frames
    (Breakout minibatches, measured here); a (B, C, H, W) batch stored channels-last is gathered in
    its storage order, so the convolutions get it without a layout conversion.
    """
    import torch

    if tensor.dim() == 4 and not tensor.is_contiguous() and tensor.is_contiguous(memory_format=torch.channels_last):
        return tensor.permute(0, 2, 3, 1).index_select(0, index).permute(0, 3, 1, 2)
    return tensor.index_select(0, index)


def ppo_update(net: Any, optimizer: Any, batch: dict[str, Any], cfg: GradlabPPOConfig, *, clip_range: float,
               ent_coef: float, permutations: list[Any] | None = None, autocast: Any = None,
               scaler: Any = None, fast: bool = False, forward: Any = None) -> dict[str, Any]:
    """SB3's ``PPO.train`` on one flat rollout batch (the learning rate is set on ``optimizer`` already).

    Args:
        batch: ``obs`` (B, *obs_shape), ``actions`` (B,) int64 or (B, d) float32, ``old_log_prob``,
            ``old_values``, ``advantages``, ``returns`` (B,) float32; all on the network's device.
        permutations: one index permutation of ``range(B)`` per epoch (default: ``torch.randperm``
            on the device); a batch that fits one minibatch is used in order.
        autocast: a context factory for the forward pass (bf16 / fp16 autocast), or None.
        scaler: a ``torch.amp.GradScaler`` for fp16, or None.
        fast: compute the loss and gradients with :mod:`gradlab.learn.ppo_mlp` (hand-written
            chain rule) instead of autograd; only where ``ppo_mlp.applies``.
        forward: the network's forward to call (a ``torch.compile``d one), default ``net``.

    Returns:
        ``pg_loss``, ``value_loss``, ``entropy``, ``clip_fraction``, ``approx_kl`` (means over the
        minibatches; ``approx_kl`` over the last epoch's), ``loss`` (last minibatch), ``epochs``
        (completed, counting an epoch stopped by the KL rule), ``grad_norm`` (mean before clipping),
        as floats.
    """
    import contextlib

    import torch

    b = batch["advantages"].shape[0]
    bs = cfg.batch_size
    ctx = autocast or contextlib.nullcontext
    forward = forward or net
    pg, vl, ent, cf, gn = [], [], [], [], []
    kls: list[Any] = []
    loss = torch.zeros(())
    epochs = 0
    params = [p for p in net.parameters()]
    for epoch in range(cfg.n_epochs):
        kls = []
        stop = False
        if permutations is not None:
            perm = permutations[epoch]
        elif bs >= b:
            perm = None
        else:
            perm = torch.randperm(b, device=batch["advantages"].device)
        for start in range(0, b, bs):
            if perm is None and start == 0 and bs >= b:
                mb = batch
            else:
                if perm is not None:
                    idx = perm[start:start + bs]
                    mb = {k: take_rows(v, idx) for k, v in batch.items()}
                else:
                    mb = {k: v[start:start + bs] for k, v in batch.items()}
            adv = mb["advantages"]
            if cfg.normalize_advantage and adv.shape[0] > 1:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            if fast:
                terms = ppo_mlp.loss_and_grads(net, mb, adv, clip_range=clip_range, clip_range_vf=cfg.clip_range_vf,
                                               ent_coef=ent_coef, vf_coef=cfg.vf_coef)
                pg_loss, value_loss, entropy_loss, loss = (terms[k] for k in ("pg_loss", "value_loss", "entropy_loss", "loss"))
                ratio, log_ratio = terms["ratio"], terms["log_ratio"]
            else:
                with ctx():
                    head, values = forward(mb["obs"])
                values = values.float()
                logp, entropy = log_prob_entropy(net, head, mb["actions"])
                log_ratio = logp - mb["old_log_prob"]
                ratio = torch.exp(log_ratio)
                pg_loss = -torch.min(adv * ratio, adv * torch.clamp(ratio, 1 - clip_range, 1 + clip_range)).mean()
                if cfg.clip_range_vf is not None:
                    old = mb["old_values"]
                    values = old + torch.clamp(values - old, -cfg.clip_range_vf, cfg.clip_range_vf)
                value_loss = torch.nn.functional.mse_loss(mb["returns"], values)
                entropy_loss = -entropy.mean()
                loss = pg_loss + ent_coef * entropy_loss + cfg.vf_coef * value_loss
            with torch.no_grad():
                kl = ((ratio - 1) - log_ratio).mean()
                pg.append(pg_loss.detach())
                vl.append(value_loss.detach())
                ent.append(entropy_loss.detach())
                cf.append(((ratio - 1).abs() > clip_range).float().mean())
                kls.append(kl)
            if cfg.target_kl is not None and float(kl) > 1.5 * cfg.target_kl:
                stop = True
                break
            if not fast:
                optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                gn.append(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm, foreach=True))
                scaler.step(optimizer)
                scaler.update()
            else:
                if not fast:
                    loss.backward()
                gn.append(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm, foreach=True))
                optimizer.step()
        epochs += 1
        if stop:
            break

    def mean(xs: list[Any]) -> float:
        return float(torch.stack(xs).float().mean()) if xs else float("nan")

    return {"pg_loss": mean(pg), "value_loss": mean(vl), "entropy": -mean(ent), "clip_fraction": mean(cf),
            "approx_kl": mean(kls), "loss": float(loss.detach()), "epochs": float(epochs), "grad_norm": mean(gn)}


def explained_variance(y_pred: Any, y_true: Any) -> float:
    """``1 - Var[y_true - y_pred] / Var[y_true]`` (population variances; NaN when Var[y_true] = 0), SB3's."""
    var_y = float(y_true.var(unbiased=False))
    return float("nan") if var_y == 0 else 1.0 - float((y_true - y_pred).var(unbiased=False)) / var_y


def default_threads() -> int:
    """torch threads for ``threads: auto``: the CPUs this process may use, less one for evaluation, at most 8."""
    from gradlab.envs.groups import usable_cpus

    return max(1, min(usable_cpus() - 1, 8))


# -- the backend ------------------------------------------------------------------------------------
class PPOBackend:
    """``gradlab.ppo``: the learner's collect → update → save/restore over gradlab's vector env.

    Attributes:
        id: ``gradlab.ppo``. algorithm: ``ppo`` (the metric segment, as ``sb3.ppo``'s).
        net: the :class:`ActorCritic` (after :meth:`setup`). optimizer: its Adam.
        episodes: rolling episode statistics. rollout: the current rollout's accumulators.
        num_timesteps: env steps trained so far.
    """

    def __init__(self, backend_id: str = BACKEND_ID):
        if backend_id != BACKEND_ID:
            raise ConfigError(f"train.backend.id: expected {BACKEND_ID}, found {backend_id!r}")
        self.id = backend_id
        self.algorithm = ALGORITHM
        self.spec: RunSpec | None = None
        self.episodes = EpisodeStats()
        self.rollout = RolloutStats()
        self.num_timesteps = 0
        self.n_updates = 0
        self.net: Any = None
        self.optimizer: Any = None
        self.venv: Any = None
        self.normaliser: Normaliser | None = None
        self._obs: Any = None
        self._lanes_note = False

    @staticmethod
    def make_env(spec: RunSpec) -> Any:
        """gradlab's vector env for the run (task program applied, lane seeds from ``spec.seed``):
        two lane groups where the provider steps lanes in the background (ale-py), so the rollout
        overlaps one group's env step with the other's forward pass (:mod:`gradlab.envs.groups`)."""
        from gradlab.envs.groups import make_lane_groups

        return make_lane_groups(spec.environment, seed=spec.seed, groups=2)

    # -- construction ------------------------------------------------------------------------
    def setup(self, spec: RunSpec, venv: Any, *, device: str = "auto") -> None:
        """Build network, optimizer and rollout tensors over ``venv`` (a gradlab ``VectorEnv``;
        an ``SB3VecEnv`` is unwrapped). Seeds Python, NumPy and torch from ``spec.seed``.

        Raises:
            ConfigError: an invalid config (naming ``train.backend.config.<key>``), observation
                normalisation of images (``train.normalize.observation``), an unsupported space,
                CUDA asked for but absent.
        """
        import random

        import torch

        venv = getattr(venv, "venv", venv)  # SB3VecEnv -> VectorEnv
        self.spec = spec
        train = spec.recipe.train
        cfg = validate_backend_config(train, venv.num_envs)
        assert isinstance(cfg, GradlabPPOConfig)
        self.cfg = cfg
        self.normaliser = None
        if train.normalize.observation and is_image(venv.single_observation_space):
            raise ConfigError("train.normalize.observation: gradlab.ppo normalises vector observations only, found "
                              f"images {venv.single_observation_space} (they are scaled by 1/255 already)")
        if train.normalize.observation or train.normalize.reward:
            self.normaliser = Normaliser(venv.num_envs, tuple(venv.single_observation_space.shape),
                                         norm_obs=train.normalize.observation, norm_reward=train.normalize.reward,
                                         clip_obs=train.normalize.clip_observation, gamma=cfg.gamma)
        if device == "auto":
            device = train.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() and is_image(venv.single_observation_space) else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError("train.device: cuda asked for, but torch sees no CUDA device")
        self.device = torch.device(device)
        if self.device.type == "cpu":
            if cfg.threads != "auto":
                threads = int(cfg.threads)
            elif "torch_threads" in train.model_fields_set:  # the recipe said how many: both backends honour it
                threads = train.torch_threads
            else:
                threads = default_threads()
            from gradlab.envs.groups import usable_cpus

            if threads > (usable := usable_cpus()):  # more threads than CPUs only oversubscribes them
                logger.info("train.backend.config.threads: %d asked for, %d usable CPUs: using %d",
                            threads, usable, usable)
                threads = usable
            torch.set_num_threads(threads)
            self.threads = threads
            # The rollout's forward is one small batch per step (one observation per lane): on one thread
            # it is as fast (Breakout, 8 lanes: 1.3 ms of CPU per step against 1.5 ms of wall on two, and
            # 4-7x slower on two under load, measured here) and it leaves the other cores to the env's
            # lanes (ALE's own threads). One more thread per 32 lanes.
            self.rollout_threads = max(1, min(threads, venv.num_envs // 32))
        if cfg.precision == "fp16-amp" and self.device.type == "cpu":
            raise ConfigError("train.backend.config.precision: fp16-amp needs device cuda; use bf16 on CPU")
        random.seed(spec.seed)
        np.random.seed(spec.seed)
        torch.manual_seed(spec.seed)
        if self.device.type == "cuda":
            torch.cuda.manual_seed_all(spec.seed)
        self.venv = venv
        self.obs_space, self.action_space = venv.single_observation_space, venv.single_action_space
        self.net = build_network(self.obs_space, self.action_space, train.policy_model).to(self.device)
        if self.net.nature_cnn:
            # oneDNN's (and cuDNN's) faster convolution layout: fp32 forward + backward of 256 Breakout
            # frames took 121 ms of CPU here against 176 ms in the default layout.
            self.net = self.net.to(memory_format=torch.channels_last)
        self.lr_fn, self.clip_fn, self.ent_fn = (schedule_fn(cfg.learning_rate), schedule_fn(cfg.clip_range),
                                                 schedule_fn(cfg.ent_coef))
        adam: dict[str, Any] = {"lr": self.lr_fn(1.0), "eps": ADAM_EPS}
        adam["fused"] = True  # one kernel for every parameter (CPU and CUDA)
        self.optimizer = torch.optim.Adam(self.net.parameters(), **adam)
        self.progress_remaining = 1.0
        self.ent_coef = self.ent_fn(1.0)
        self._autocast = None
        self._scaler = None
        if cfg.precision != "fp32":
            dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
            dev = self.device.type
            self._autocast = lambda: torch.autocast(device_type=dev, dtype=dtype)
            if cfg.precision == "fp16-amp":
                self._scaler = torch.amp.GradScaler(dev)
        self._forward, self._head = self.net, self.net.head
        if cfg.compile:
            self._forward, self._head = torch.compile(self.net), torch.compile(self.net.head)
        # bf16 on a CPU: the rollout runs a bf16 copy of the network, refreshed once per rollout (the
        # parameters do not change during one). Autocast would cast every weight at every step, which
        # cost more than bf16 saved; the copy's forward took 0.67 ms of CPU per step against fp32's
        # 1.27 ms (Breakout, 8 lanes, one thread, measured here).
        self._rollout_net = None
        if cfg.precision == "bf16" and self.device.type == "cpu" and self.net.nature_cnn:
            import copy

            self._rollout_net = copy.deepcopy(self.net).to(torch.bfloat16)
        n, t = venv.num_envs, cfg.n_steps
        obs_dtype = torch.uint8 if is_image(self.obs_space) else torch.float32
        kw = {"device": self.device}
        if self.net.nature_cnn and not self.net.transpose:
            # Channel-first frames are stored channels-last (the layout the convolutions run in): one
            # transposing copy per step here instead of a layout conversion per minibatch and epoch.
            c, h, w = self.obs_space.shape
            self.buf_obs = torch.zeros((t, n, h, w, c), dtype=obs_dtype, **kw).permute(0, 1, 4, 2, 3)
        else:
            self.buf_obs = torch.zeros((t, n, *self.obs_space.shape), dtype=obs_dtype, **kw)
        act_shape = () if self.net.discrete else tuple(self.action_space.shape)
        self.buf_actions = torch.zeros((t, n, *act_shape), dtype=torch.int64 if self.net.discrete else torch.float32, **kw)
        self.buf_logp = torch.zeros((t, n), **kw)
        self.buf_values = torch.zeros((t, n), **kw)
        self.buf_rewards = torch.zeros((t, n), **kw)  # shaped rewards as the env gave them
        self.buf_boot = torch.zeros((t, n), **kw)  # gamma * V(final obs) on truncated steps
        self.buf_dones = torch.zeros((t, n), **kw)
        self.timesteps = train.timesteps

    def begin(self, *, resumed: bool) -> None:
        """Reset the lanes, unless :meth:`restore` put them back mid-episode (``self._obs`` set)."""
        if resumed and self._obs is not None:
            return
        obs = self.venv.reset()
        self._obs = self.normaliser.reset(obs) if self.normaliser is not None else obs

    # -- phases ----------------------------------------------------------------------------------
    def _to_device(self, array: np.ndarray) -> Any:
        import torch

        t = torch.from_numpy(np.ascontiguousarray(array))
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)

    def collect(self) -> bool:
        """One rollout of ``n_steps`` per lane into the rollout tensors, then GAE (on CPU, on
        ``rollout_threads`` torch threads)."""
        import torch

        if self.device.type == "cpu" and self.rollout_threads != self.threads:
            torch.set_num_threads(self.rollout_threads)
            try:
                return self._collect()
            finally:
                torch.set_num_threads(self.threads)
        return self._collect()

    def _collect(self) -> bool:
        import contextlib

        import torch

        cfg, net = self.cfg, self.net
        gamma = cfg.gamma
        # bf16 autocast in the rollout only on CUDA; on a CPU bf16 runs the rollout on a bf16 copy of
        # the network instead (see setup).
        ctx = (self._autocast if self.device.type == "cuda" else None) or contextlib.nullcontext
        forward, value_fn = self._forward, net.value
        if self._rollout_net is not None:
            with torch.no_grad():
                for copy_p, p in zip(self._rollout_net.parameters(), net.parameters(), strict=True):
                    copy_p.copy_(p)
            forward, value_fn = self._rollout_net, self._rollout_net.value
        box = None if net.discrete else (self.action_space.low, self.action_space.high)
        norm = self.normaliser
        # The env's rewards before normalisation, for train/reward/shaped/* (as sb3.ppo reports them).
        raw_rewards = np.zeros((cfg.n_steps, self.venv.num_envs)) if norm is not None else None
        # MLPs: only the action head per step; values and log-probs of the whole rollout come from one
        # batched forward afterwards (the parameters do not change during a rollout). CNNs share the
        # convolutions between the heads, so they take both per step.
        batched = not net.nature_cnn
        obs = self._obs
        env_s = 0.0

        def act(t: int, sl: slice) -> np.ndarray:
            """Actions of lanes ``sl`` at step ``t`` (their observations into the rollout tensors)."""
            self.buf_obs[t, sl].copy_(self._to_device(obs[sl]))
            obs_t = self.buf_obs[t, sl]
            with ctx():
                if batched:
                    head = self._head(obs_t)
                else:
                    head, value = forward(obs_t)
                    self.buf_values[t, sl] = value.float()
            actions, logp = sample_actions(net, head)
            self.buf_actions[t, sl] = actions
            if not batched:
                self.buf_logp[t, sl] = logp
            a = actions.cpu().numpy()
            return a if box is None else np.clip(a, box[0], box[1])

        def record(t: int, sl: slice, res: Any) -> np.ndarray:
            """Step ``t``'s result of lanes ``sl``: rewards, ends, the bootstrap of truncated lanes;
            returns the lanes' next observations (normalised when the recipe normalises)."""
            done = res.terminated | res.truncated
            next_obs, reward = res.obs, res.reward
            if norm is not None:  # VecNormalize's order: statistics updated, then applied (all lanes)
                raw_rewards[t] = reward
                next_obs, reward = norm.step(next_obs, reward, done)
            self.buf_rewards[t, sl] = self._to_device(reward)
            self.buf_dones[t, sl] = self._to_device(done)
            boot = self.buf_boot[t, sl]
            boot.zero_()
            if res.episodes:
                truncated = [ep.lane for ep in res.episodes if res.truncated[ep.lane] and not res.terminated[ep.lane]]
                if truncated:
                    final = np.stack([res.final_obs[lane] for lane in truncated])
                    final = self._to_device(norm.normalize_obs(final) if norm is not None else final)
                    with ctx():
                        v = value_fn(final).float()
                    boot[torch.as_tensor(truncated, device=self.device)] = gamma * v
                for ep in res.episodes:
                    self.episodes.add(ep.as_json())  # raw and shaped returns: never normalised
            return next_obs

        groups = getattr(self.venv, "groups", None)
        with torch.no_grad():
            if groups is not None and len(groups) == 2 and self.venv.steps_in_background and norm is None:
                # Two lane groups (gradlab.envs.groups): group a's lanes step while group b's actions
                # are computed, and the other way round. Each lane sees the same sequence as in one env.
                # (Normalisation updates its statistics over all lanes at once: it takes the other path.)
                (ga, gb), (sa, sb) = groups, self.venv.slices
                obs = np.array(obs, copy=True)
                ga.step_async(act(0, sa))
                for t in range(cfg.n_steps):
                    actions_b = act(t, sb)
                    t0 = time.perf_counter()
                    res_a = ga.step_wait()
                    env_s += time.perf_counter() - t0
                    gb.step_async(actions_b)
                    obs[sa] = record(t, sa, res_a)
                    if t + 1 < cfg.n_steps:
                        actions_a = act(t + 1, sa)
                    t0 = time.perf_counter()
                    res_b = gb.step_wait()
                    env_s += time.perf_counter() - t0
                    if t + 1 < cfg.n_steps:
                        ga.step_async(actions_a)
                    obs[sb] = record(t, sb, res_b)
            else:
                everything = slice(None)
                for t in range(cfg.n_steps):
                    actions = act(t, everything)
                    t0 = time.perf_counter()
                    res = self.venv.step(actions)
                    env_s += time.perf_counter() - t0
                    obs = record(t, everything, res)
            self._obs = obs
            with ctx():
                if batched:
                    t_, n_ = self.buf_logp.shape
                    head, values = self._forward(self.buf_obs.flatten(0, 1))
                    logp, _ = log_prob_entropy(net, head, self.buf_actions.flatten(0, 1))
                    self.buf_logp.copy_(logp.view(t_, n_))
                    self.buf_values.copy_(values.float().view(t_, n_))
                _, last_values = forward(self._to_device(obs))
            adv, ret = compute_gae(self.buf_rewards + self.buf_boot, self.buf_values, self.buf_dones,
                                   last_values.float(), gamma, cfg.gae_lambda)
        self.advantages, self.returns = adv, ret
        steps = cfg.n_steps * self.venv.num_envs
        self.rollout = RolloutStats(env_seconds=env_s)
        self.rollout.add_rewards(raw_rewards.ravel() if norm is not None else self.buf_rewards.cpu().numpy().ravel())
        self.rollout.steps = steps
        self.num_timesteps += steps
        self.progress_remaining = 1.0 - float(self.num_timesteps) / float(self.timesteps)
        return True

    def update(self) -> dict[str, float]:
        """One PPO update on the collected rollout; returns the algorithm metrics (registered names)."""
        cfg = self.cfg
        lr = self.lr_fn(self.progress_remaining)
        clip = self.clip_fn(self.progress_remaining)
        self.ent_coef = float(self.ent_fn(self.progress_remaining))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        flat = {"obs": self.buf_obs.flatten(0, 1), "actions": self.buf_actions.flatten(0, 1),
                "old_log_prob": self.buf_logp.flatten(), "old_values": self.buf_values.flatten(),
                "advantages": self.advantages.flatten(), "returns": self.returns.flatten()}
        self.net.train()
        out = ppo_update(self.net, self.optimizer, flat, cfg, clip_range=clip, ent_coef=self.ent_coef,
                         autocast=self._autocast, scaler=self._scaler,
                         fast=ppo_mlp.applies(self.net, cfg.precision, cfg.compile), forward=self._forward)
        self.n_updates += int(out["epochs"])
        a = f"train/algorithm/{self.algorithm}"
        metrics = {
            f"{a}/update/approx_kl": out["approx_kl"], f"{a}/update/clip_fraction": out["clip_fraction"],
            f"{a}/update/clip_range": float(clip), f"{a}/update/policy_gradient_loss": out["pg_loss"],
            f"{a}/update/value_loss": out["value_loss"], f"{a}/update/loss": out["loss"],
            f"{a}/update/learning_rate": float(lr), f"{a}/update/count": float(self.n_updates),
            f"{a}/value/explained_variance": explained_variance(flat["old_values"], flat["returns"]),
            f"{a}/policy/entropy": out["entropy"], f"{a}/update/entropy_coef": self.ent_coef,
            f"{a}/update/epochs": out["epochs"], f"{a}/update/grad_norm": out["grad_norm"],
        }
        return metrics

    def rollout_metrics(self) -> dict[str, float]:
        return {**self.rollout.metrics(), **self.episodes.metrics()}

    # -- checkpoint files -----------------------------------------------------------------------
    def policy_files(self) -> tuple[dict[str, Any], Any]:
        """(tensors, PolicySpec) of the weights-only policy, as :func:`export_policy` gives for sb3.ppo."""
        from gradlab.checkpoints.policy import PolicySpec, space_to_spec

        net = self.net
        pm = self.spec.recipe.train.policy_model  # type: ignore[union-attr]
        tensors = {k: v.detach().cpu().contiguous().clone() for k, v in net.state_dict().items()}
        norm = None
        if self.normaliser is not None and self.normaliser.norm_obs:  # applied frozen by evaluation and play
            import torch

            from gradlab.checkpoints.policy import OBS_MEAN_KEY, OBS_VAR_KEY, ObsNormalization

            rms = self.normaliser.obs_rms
            tensors[OBS_MEAN_KEY] = torch.as_tensor(np.asarray(rms.mean, dtype=np.float64))
            tensors[OBS_VAR_KEY] = torch.as_tensor(np.asarray(rms.var, dtype=np.float64))
            norm = ObsNormalization(clip=self.normaliser.clip_obs, epsilon=self.normaliser.epsilon)
        obs_space = self.obs_space
        if net.transpose:
            from gymnasium import spaces

            s = obs_space.shape
            obs_space_net = spaces.Box(low=0, high=255, shape=(s[2], s[0], s[1]), dtype=np.uint8)
        else:
            obs_space_net = obs_space
        spec = PolicySpec(
            backend_id=self.id, algorithm=self.algorithm, observation_space=space_to_spec(obs_space),
            policy_observation_space=space_to_spec(obs_space_net), action_space=space_to_spec(self.action_space),
            extractor="nature_cnn" if net.nature_cnn else "flatten", features_dim=int(net.features_dim),
            net_arch=pm.net_arch, activation=pm.activation, share_features_extractor=net.share,
            normalize_images=True, transpose_image=bool(net.transpose), obs_normalization=norm)
        return tensors, spec

    def save(self, folder: Path) -> None:
        """Write ``policy.zip`` (an SB3 PPO zip), ``policy.safetensors``, ``policy_spec.json`` and ``resume/``.

        ``resume/`` also holds the lane state (``lanes.json``, ``lanes.npz``, ``last_obs.npy``;
        ``state.json``'s ``env_state`` is then ``lanes``) and, when the recipe normalises,
        ``vecnormalize.json`` (:mod:`gradlab.learn.ppo_state`).
        """
        from safetensors.torch import save_file

        from gradlab.checkpoints.policy import save_policy_files

        tensors, pspec = self.policy_files()
        save_policy_files(folder, tensors, pspec)
        self._write_sb3_zip(folder / POLICY_FILE, {k: v for k, v in tensors.items() if not k.startswith("gradlab.")})
        resume = folder / RESUME_DIR
        resume.mkdir()
        opt_tensors, opt_meta = _optimizer_state(self.optimizer)
        save_file(opt_tensors, str(resume / OPTIMIZER_FILE), metadata={"format": "gradlab.adam/1"})
        if self.normaliser is not None:
            (resume / VECNORMALIZE_FILE).write_text(json.dumps(self.normaliser.state()))
        env_state = "reset"
        why = save_lanes(resume, self.venv, self._obs)
        if why is None:
            env_state = LANES_SAVED
        elif not self._lanes_note:
            self._lanes_note = True  # not every vector env is plain data (subprocess lanes, emulators)
            logger.info("lane state not saved (%s); a resumed run resets its lanes", why)
        state = {
            "format": "gradlab.ppo.resume/1", "backend_id": self.id, "num_timesteps": int(self.num_timesteps),
            "total_timesteps": int(self.timesteps), "n_updates": int(self.n_updates),
            "progress_remaining": float(self.progress_remaining), "ent_coef": float(self.ent_coef),
            "env_state": env_state, "optimizer": opt_meta, "episodes": self.episodes.as_json(), "rng": rng_state(),
        }
        if self._scaler is not None:
            state["grad_scaler"] = {k: (float(v) if isinstance(v, float) else v) for k, v in self._scaler.state_dict().items()}
        (resume / STATE_FILE).write_text(json.dumps(state))

    def _write_sb3_zip(self, path: Path, tensors: dict[str, Any]) -> None:
        """An SB3 ``PPO`` zip of these weights (``PPO.load`` works on it), via a model built once over the spaces."""
        if getattr(self, "_sb3_model", None) is None:
            import gymnasium as gym
            from stable_baselines3 import PPO
            from stable_baselines3.common.vec_env import DummyVecEnv

            obs_space, act_space = self.obs_space, self.action_space

            class Spaces(gym.Env):
                observation_space, action_space = obs_space, act_space

            import torch

            pm = self.spec.recipe.train.policy_model  # type: ignore[union-attr]
            from stable_baselines3.common.torch_layers import FlattenExtractor, NatureCNN

            kwargs: dict[str, Any] = dict(net_arch=pm.net_arch, activation_fn={"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[pm.activation],
                                          share_features_extractor=pm.share_features_extractor,
                                          features_extractor_class=NatureCNN if self.net.nature_cnn else FlattenExtractor)
            if self.net.nature_cnn:
                kwargs["features_extractor_kwargs"] = {"features_dim": pm.features_dim}
            cfg = self.cfg
            with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SB3's batch_size advice is about its own rollout buffer
                self._sb3_model = PPO("MlpPolicy", DummyVecEnv([Spaces]), n_steps=cfg.n_steps, batch_size=cfg.batch_size,
                                      n_epochs=cfg.n_epochs, gamma=cfg.gamma, gae_lambda=cfg.gae_lambda,
                                      vf_coef=cfg.vf_coef, max_grad_norm=cfg.max_grad_norm, target_kl=cfg.target_kl,
                                      normalize_advantage=cfg.normalize_advantage, policy_kwargs=kwargs,
                                      device="cpu", verbose=0)
        model = self._sb3_model
        model.policy.load_state_dict(tensors, strict=True)
        model.num_timesteps = self.num_timesteps
        from gradlab.checkpoints import write_sb3_zip

        write_sb3_zip(model, path)  # deterministic, nothing of gradlab pickled (docs/ARCHITECTURE.md section 6)

    def warm_start(self, init: Any) -> None:
        """Start from a parent checkpoint's weights (``spec.init_from``); call after :meth:`setup`.

        The parent may be of either PPO backend (the weights-only policy has SB3's tensor names);
        with ``init.optimizer`` its Adam state is loaded too, which only a ``gradlab.ppo`` parent
        has in this backend's form. When both recipes normalise observations the parent's
        observation statistics are loaded too (as ``sb3.ppo`` does). Counters, schedules and RNG
        streams start fresh.

        Raises:
            IntegrityError: the parent fails verification or is not the recorded sha256.
            ContractViolation: the first tensor that is missing, extra or of another shape; an
                optimizer state asked of a parent that has none in this backend's form.
        """
        from safetensors.torch import load_file

        # Every file present is verified; the optimizer file is then required of a gradlab.ppo parent.
        path, parent = read_warm_start_parent(init, extra=[f"{RESUME_DIR}/{STATE_FILE}"] if init.optimizer else [])
        check_warm_start_tensors(self.net.state_dict(), parent, source=init.source)
        self.net.load_state_dict({k: v.to(self.device) for k, v in parent.items()}, strict=True)
        if init.optimizer:
            resume = path / RESUME_DIR
            state = json.loads((resume / STATE_FILE).read_text())
            if state.get("backend_id") != self.id:
                raise ContractViolation(f"{resume / STATE_FILE}: --init-optimizer needs a {self.id} parent's optimizer "
                                        f"state, found backend {state.get('backend_id')}")
            if not (resume / OPTIMIZER_FILE).is_file():
                raise ContractViolation(f"{resume / OPTIMIZER_FILE}: --init-optimizer needs the parent's optimizer state, missing")
            _load_optimizer_state(self.optimizer, load_file(str(resume / OPTIMIZER_FILE)), state["optimizer"])
        stats = path / RESUME_DIR / VECNORMALIZE_FILE
        if self.normaliser is not None and self.normaliser.norm_obs and stats.is_file():
            self.normaliser.load_observation_statistics(json.loads(stats.read_text()), stats)

    def restore(self, checkpoint: Path, *, allow_env_pickle: bool = False) -> bool:
        """Load parameters, optimizer, counters, RNG streams, episode windows, normalisation
        statistics and, when saved, the lane state from a checkpoint.

        Call after :meth:`setup` and before :meth:`begin`, with a checkpoint already verified
        against its manifest (the learner does). No pickle is read, whatever ``allow_env_pickle``
        says (kept for the learner's interface). A checkpoint without lane state (written before
        gradlab.ppo saved it, or of an env whose state is not plain data) resumes with new episodes.

        Returns:
            True when the lanes continue mid-episode, False when :meth:`begin` resets them.

        Raises:
            ContractViolation: the checkpoint is of another backend or its tensors do not fit; a
                normalising recipe's ``vecnormalize.json`` is missing or does not fit; a lane-state
                file is malformed or does not fit this env (each naming the file).
        """
        from safetensors.torch import load_file

        del allow_env_pickle
        resume = Path(checkpoint) / RESUME_DIR
        state = load_resume_policy(checkpoint, self.id, self.net)
        if self.normaliser is not None:
            path = resume / VECNORMALIZE_FILE
            if not path.is_file():
                raise ContractViolation(f"{path}: missing, but this recipe normalises observations or rewards")
            try:
                data = json.loads(path.read_text())
            except ValueError as e:
                raise ContractViolation(f"{path}: not JSON ({e})") from None
            self.normaliser.load(data, path)
        restored = False
        if state.get("env_state") == LANES_SAVED:
            self._obs = restore_lanes(resume, self.venv, obs_shape=tuple(self.obs_space.shape))
            restored = True
        else:
            self._obs = None  # begin() resets the lanes
        _load_optimizer_state(self.optimizer, load_file(str(resume / OPTIMIZER_FILE)), state["optimizer"])
        self.num_timesteps = int(state["num_timesteps"])
        self.n_updates = int(state["n_updates"])
        self.progress_remaining = float(state["progress_remaining"])
        self.ent_coef = float(state["ent_coef"])
        self.episodes = EpisodeStats.from_json(state["episodes"])
        if self._scaler is not None and "grad_scaler" in state:
            self._scaler.load_state_dict(state["grad_scaler"])
        set_rng_state(state["rng"])
        return restored

    def close(self) -> None:
        if self.venv is not None:
            self.venv.close()


def _optimizer_state(optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Adam's state as (tensors ``state.<param index>.<name>``, JSON: param groups without params)."""
    sd = optimizer.state_dict()
    tensors = {}
    for index, entry in sd["state"].items():
        for name, value in entry.items():
            tensors[f"state.{index}.{name}"] = value.detach().cpu().contiguous().clone()
    groups = [{k: v for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups}


def _load_optimizer_state(optimizer: Any, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
    import torch

    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = value  # load_state_dict moves them to the parameters' device
    groups = [dict(g) for g in meta["param_groups"]]
    for g in groups:
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
    optimizer.load_state_dict({"state": state, "param_groups": groups})
    # Moments in their parameter's memory layout (channels-last convolutions), as the fused step expects.
    for group in optimizer.param_groups:
        for p in group["params"]:
            entry = optimizer.state.get(p, {})
            for name, value in entry.items():
                if name != "step" and value.shape == p.shape:
                    entry[name] = torch.empty_like(p).copy_(value)
