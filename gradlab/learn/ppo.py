"""The ``gradlab.ppo`` backend: PPO written for gradlab's vector env, tensors end to end.

:class:`PPOBackend` is the loop the learner drives (setup → begin → collect → update →
save/restore), with the same interface (:class:`gradlab.learn.backend.Backend`), metric names and
checkpoint bundle as :class:`gradlab.learn.sb3.SB3Backend` (docs/ARCHITECTURE.md section 5). Read
top to bottom: :meth:`PPOBackend.setup` builds the network (:mod:`gradlab.learn.ppo_net`), Adam
and the rollout tensors; :meth:`PPOBackend.collect` is one rollout and its GAE
(:mod:`gradlab.learn.ppo_rollout`); :meth:`PPOBackend.update` one PPO update
(:mod:`gradlab.learn.ppo_update`, hand-written MLP gradients in :mod:`gradlab.learn.ppo_mlp`);
save, restore and warm start read and write the checkpoint files
(:mod:`gradlab.learn.ppo_checkpoint`, lane state and normalisation in :mod:`gradlab.learn.ppo_state`).

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

The random streams are used as SB3 uses them: torch's generator samples the actions, NumPy's global
generator draws each epoch's minibatch order (:func:`gradlab.learn.ppo_update.sb3_permutation`),
so from the same seed ``gradlab.ppo`` trains the same run as ``sb3.ppo`` until floating-point
rounding makes a sample differ (``tests/learn/test_ppo_rollout_parity.py``).

What differs is speed: the rollout lives in preallocated ``(n_steps, n_envs)`` tensors written in
place, the policy step is a few tensor operations (no distribution objects), and losses stay on
the device until the update ends.

Resume state (``resume/`` in a checkpoint), never pickle: ``state.json`` (counters, schedules'
progress, every RNG stream, episode windows, optimizer hyperparameters) and
``optimizer.safetensors`` (Adam's moments and step counts by parameter index), and, as
``sb3.ppo`` writes them, the lane state (``lanes.json`` + ``lanes.npz`` + ``last_obs.npy``: a
resumed run continues the same episodes) and the normalisation statistics (``vecnormalize.json``,
``train.normalize`` with VecNormalize's rules): :mod:`gradlab.learn.ppo_checkpoint`.

``train.curriculum.archive`` (docs/ARCHITECTURE.md section 12a): a share of episodes starts from
states archived from the run's own episodes, prioritised by the mean |A_t| of their last
trajectories; :mod:`gradlab.learn.ppo_curriculum`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.contracts.recipe import GradlabPPOConfig
from gradlab.contracts.run_spec import RunSpec
from gradlab.errors import ConfigError
from gradlab.learn import ppo_checkpoint, ppo_mlp
from gradlab.learn.backend_config import validate_backend_config
from gradlab.learn.ppo_net import build_network, is_image
from gradlab.learn.ppo_rollout import collect_rollout
from gradlab.learn.ppo_state import Normaliser
from gradlab.learn.ppo_update import explained_variance, ppo_update, sb3_permutation
from gradlab.learn.sb3_model import normalized_image_space, normalizes_images
from gradlab.learn.schedules import schedule_fn
from gradlab.learn.stats import EpisodeStats, RolloutStats

logger = logging.getLogger(__name__)

BACKEND_ID = "gradlab.ppo"
ALGORITHM = "ppo"
ADAM_EPS = 1e-5
"""SB3's ``ActorCriticPolicy`` Adam epsilon (``optimizer_kwargs["eps"] = 1e-5``)."""

#: Largest bf16 copy of a rollout's frames that :meth:`PPOBackend.update` makes (bytes).
PRECAST_BYTES = 256 * 2**20


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
        self.curriculum: Any = None

    @staticmethod
    def make_env(spec: RunSpec) -> Any:
        """gradlab's vector env for the run (task program applied, lane seeds from ``spec.seed``):
        two lane groups where the provider steps lanes in the background (ale-py), so the rollout
        overlaps one group's env step with the other's forward pass (:mod:`gradlab.envs.groups`).
        A goal with starts draws one per episode with the recipe's ``train.starts`` weights."""
        from gradlab.envs.groups import draw_training_starts, make_lane_groups

        return draw_training_starts(make_lane_groups(spec.environment, seed=spec.seed, groups=2),
                                    spec.recipe.train.start_weights(spec.goal.eval.starts), seed=spec.seed)

    # -- construction ------------------------------------------------------------------------
    def setup(self, spec: RunSpec, venv: Any, *, device: str = "auto") -> None:
        """Build network, optimizer and rollout tensors over ``venv`` (a gradlab ``VectorEnv``;
        an ``SB3VecEnv`` is unwrapped). Seeds Python, NumPy and torch from ``spec.seed``.

        Raises:
            ConfigError: an invalid config (naming ``train.backend.config.<key>``), observation
                channel-last frames to normalise (``train.normalize.observation``), an unsupported space,
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
        self.env_obs_space = venv.single_observation_space
        self.normalized_image = normalizes_images(self.env_obs_space, train.normalize)
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
        # The network's observations: the env's, or their normalised frames (float32, unscaled).
        self.obs_space = (normalized_image_space(self.env_obs_space, train.normalize.clip_observation)
                          if self.normalized_image else self.env_obs_space)
        self.action_space = venv.single_action_space
        self.curriculum = None
        if train.archive_curriculum is not None:
            from gradlab.learn.ppo_curriculum import ArchiveCurriculumRunner

            self.curriculum = ArchiveCurriculumRunner(spec, venv)
        self.net = build_network(self.obs_space, self.action_space, train.policy_model,
                                 normalized_image=self.normalized_image).to(self.device)
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
        if self.curriculum is not None:
            self.curriculum.begin()

    # -- phases ----------------------------------------------------------------------------------
    def collect(self) -> bool:
        """One rollout of ``n_steps`` per lane into the rollout tensors, then GAE
        (:func:`gradlab.learn.ppo_rollout.collect_rollout`; on CPU, on ``rollout_threads`` torch
        threads); counts its env steps."""
        import torch

        if self.device.type == "cpu" and self.rollout_threads != self.threads:
            torch.set_num_threads(self.rollout_threads)
            try:
                collect_rollout(self)
            finally:
                torch.set_num_threads(self.threads)
        else:
            collect_rollout(self)
        self.num_timesteps += self.rollout.steps
        self.progress_remaining = 1.0 - float(self.num_timesteps) / float(self.timesteps)
        return True

    def update(self) -> dict[str, float]:
        """One PPO update on the collected rollout; returns the algorithm metrics (registered names)."""
        import torch

        cfg = self.cfg
        lr = self.lr_fn(self.progress_remaining)
        clip = self.clip_fn(self.progress_remaining)
        self.ent_coef = float(self.ent_fn(self.progress_remaining))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        obs = self.buf_obs.flatten(0, 1)
        if self._rollout_net is not None and obs.dtype == torch.uint8 and obs.numel() * 2 <= PRECAST_BYTES:
            # bf16 on a CPU: cast the rollout's frames once per update (exact: every uint8 value is a
            # bf16 number), not each minibatch's at every epoch (Breakout, 256 frames, one thread:
            # gather 0.46 ms from bf16 against 0.19 ms + 1.74 ms of cast from uint8).
            obs = obs.to(torch.bfloat16)
        flat = {"obs": obs, "actions": self.buf_actions.flatten(0, 1),
                "old_log_prob": self.buf_logp.flatten(), "old_values": self.buf_values.flatten(),
                "advantages": self.advantages.flatten(), "returns": self.returns.flatten()}
        self.net.train()
        n_steps, n_envs = self.buf_logp.shape
        out = ppo_update(self.net, self.optimizer, flat, cfg, clip_range=clip, ent_coef=self.ent_coef,
                         permutations=lambda _epoch: sb3_permutation(n_steps, n_envs, self.device),
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
        """The rollout's reward and episode metrics; with an archive curriculum ``train/episode/*``
        count target-origin episodes only, plus ``train/curriculum/archive/*`` and the returns by origin."""
        out = {**self.rollout.metrics(), **self.episodes.metrics()}
        if self.curriculum is not None:
            out.update(self.curriculum.metrics(self.episodes))
        return out

    # -- checkpoint files (gradlab.learn.ppo_checkpoint) ------------------------------------------
    def policy_files(self) -> tuple[dict[str, Any], Any]:
        """(tensors, PolicySpec) of the weights-only policy (:func:`gradlab.learn.ppo_checkpoint.policy_files`)."""
        return ppo_checkpoint.policy_files(self)

    def save(self, folder: Path) -> None:
        """Write ``policy.zip``, ``policy.safetensors``, ``policy_spec.json`` and ``resume/`` into
        ``folder`` (:func:`gradlab.learn.ppo_checkpoint.save`)."""
        ppo_checkpoint.save(self, folder)

    def warm_start(self, init: Any) -> None:
        """Start from a parent checkpoint's weights (``spec.init_from``); call after :meth:`setup`
        (:func:`gradlab.learn.ppo_checkpoint.warm_start`, which names the errors)."""
        ppo_checkpoint.warm_start(self, init)

    def restore(self, checkpoint: Path, *, allow_env_pickle: bool = False) -> bool:
        """Continue from a verified checkpoint; call after :meth:`setup` and before :meth:`begin`
        (:func:`gradlab.learn.ppo_checkpoint.restore`, which names the errors). No pickle is read,
        whatever ``allow_env_pickle`` says (kept for the learner's interface).

        Returns:
            True when the lanes continue mid-episode, False when :meth:`begin` resets them.
        """
        del allow_env_pickle
        return ppo_checkpoint.restore(self, checkpoint)

    def close(self) -> None:
        if self.venv is not None:
            self.venv.close()
