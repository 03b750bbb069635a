"""The stable-baselines3 backends: ``sb3.ppo`` and ``sb3.a2c``.

One class drives both algorithms through SB3's own phases, so the learner owns the loop:
``collect_rollouts`` (one rollout of ``n_steps`` per lane) then ``train`` (one update), with the
learner reading its stop flag, writing metrics and checkpoints in between. Bootstrap follows SB3:
on a truncated step (``infos[i]["TimeLimit.truncated"]``) the reward gets ``gamma * V(final obs)``
from the true final observation; a terminated step is never bootstrapped.

Resume state (``resume/`` in a checkpoint): ``state.json`` (counters, every RNG stream,
episode windows), ``optimizer.pt`` (optimizer state dict, loaded with ``weights_only=True``),
``vecnormalize.json`` (normalisation statistics, if any), and, when the vector env's state is
plain data (:mod:`gradlab.learn.lane_state`), ``lanes.json`` + ``lanes.npz`` + ``last_obs.npy``
so the lanes continue mid-episode exactly. The policy parameters come from
``policy.safetensors``. Resume reads no pickle (docs/ARCHITECTURE.md section 6): JSON, npz with
``allow_pickle=False``, safetensors, and the optimizer state dict through torch's weights-only
loader; ``policy.zip`` is not read at all (the model is rebuilt from the recipe). The pieces both
training backends share (:mod:`gradlab.learn.stats`, :mod:`gradlab.learn.resume_state`,
:mod:`gradlab.learn.warm_start`) are their own modules; the registry that builds this class by id
is :mod:`gradlab.learn.backend`.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.checkpoints.manifest import POLICY_FILE, RESUME_DIR
from gradlab.contracts.recipe import PPOConfig
from gradlab.contracts.run_spec import RunSpec
from gradlab.errors import ConfigError, ContractViolation
from gradlab.learn.backend_config import validate_backend_config
from gradlab.learn.resume_state import (
    LANES_SAVED,
    load_resume_policy,
    load_vecnormalize_state,
    rng_state,
    set_rng_state,
    vecnormalize_state,
)
from gradlab.learn.sb3_model import normalizes_images, sb3_algorithm_kwargs, sb3_policy_kwargs
from gradlab.learn.schedules import schedule_fn
from gradlab.learn.stats import EpisodeStats, RolloutStats
from gradlab.learn.warm_start import check_warm_start_tensors, read_warm_start_parent

logger = logging.getLogger(__name__)

ALGORITHMS: dict[str, str] = {"sb3.ppo": "ppo", "sb3.a2c": "a2c"}
"""This module's backend ids → algorithm names (the ``{algorithm}`` metric segment)."""


def make_training_env(spec: RunSpec) -> Any:
    """The SB3 ``VecEnv`` an ``sb3.*`` backend trains on: gradlab's vector env (task program applied).

    Returns:
        A :class:`gradlab.envs.sb3.SB3VecEnv` over ``spec.environment``'s lanes, seeded from ``spec.seed``;
        a goal with starts draws one per episode with the recipe's ``train.starts`` weights.
    """
    from gradlab.envs import make_vector_env
    from gradlab.envs.groups import draw_training_starts
    from gradlab.envs.sb3 import SB3VecEnv

    venv = make_vector_env(spec.environment, seed=spec.seed)
    return SB3VecEnv(draw_training_starts(venv, spec.recipe.train.start_weights(spec.goal.eval.starts), seed=spec.seed))


def _make_callback_class() -> type:
    from stable_baselines3.common.callbacks import BaseCallback

    class _StepCallback(BaseCallback):
        """Collects rewards and finished episodes each env step (no `locals()` logic beyond reading)."""

        def __init__(self, backend: SB3Backend):
            super().__init__(verbose=0)
            self.backend = backend

        def _on_step(self) -> bool:
            b = self.backend
            rewards = self.locals["rewards"]
            if b.vecnormalize is not None:
                rewards = b.vecnormalize.get_original_reward()
            b.rollout.add_rewards(rewards)
            source = b._episode_source
            if source is not None:
                for ep in source.pop_episodes():
                    b.episodes.add(ep.as_json())
                return True
            dones = self.locals["dones"]
            if dones.any():
                infos = self.locals["infos"]
                for i in np.flatnonzero(dones):
                    info = infos[i]
                    rec = info.get("gradlab_episode")
                    if rec is None and "episode" in info:
                        ep = info["episode"]
                        rec = {"return": ep["r"], "raw_return": ep["r"], "length": ep["l"],
                               "outcome": "timeout" if info.get("TimeLimit.truncated") else "ended",
                               "reason": "time_limit" if info.get("TimeLimit.truncated") else "terminated"}
                    if rec is not None:
                        b.episodes.add(rec)
            return True

    return _StepCallback


def _timed_vec_env_class() -> type:
    from stable_baselines3.common.vec_env import VecEnvWrapper

    class TimedVecEnv(VecEnvWrapper):
        """Adds the wall time spent inside the wrapped env's step to ``stats.env_seconds``."""

        def __init__(self, venv: Any, backend: SB3Backend):
            super().__init__(venv)
            self._backend = backend
            self._t0 = 0.0

        def reset(self) -> Any:
            return self.venv.reset()

        def step_async(self, actions: np.ndarray) -> None:
            self._t0 = time.perf_counter()
            self.venv.step_async(actions)

        def step_wait(self) -> Any:
            out = self.venv.step_wait()
            self._backend.rollout.env_seconds += time.perf_counter() - self._t0
            return out

    return TimedVecEnv




class SB3Backend:
    """One SB3 on-policy algorithm (PPO or A2C) driven phase by phase.

    Attributes:
        id: ``sb3.ppo`` or ``sb3.a2c``. algorithm: ``ppo`` or ``a2c``.
        model: the SB3 model (after :meth:`setup`).
        episodes: rolling episode statistics. rollout: the current rollout's accumulators.
    """

    def __init__(self, backend_id: str):
        if backend_id not in ALGORITHMS:
            raise ConfigError(f"train.backend.id: expected one of {', '.join(ALGORITHMS)}, found {backend_id!r}")
        self.id = backend_id
        self.algorithm = ALGORITHMS[backend_id]
        self.model: Any = None
        self.vecnormalize: Any = None
        self.episodes = EpisodeStats()
        self.rollout = RolloutStats()
        self._callback: Any = None
        self._ent_fn: Any = None
        self._env_observation_space: Any = None
        self._transpose_image = False
        self._last_update: dict[str, float] = {}
        self._episode_source: Any = None
        self._lanes_note = False
        self.spec: RunSpec | None = None

    @staticmethod
    def make_env(spec: RunSpec) -> Any:
        """The SB3 ``VecEnv`` to train on (gradlab's vector env behind ``SB3VecEnv``)."""
        return make_training_env(spec)

    # -- construction ------------------------------------------------------------------------
    def setup(self, spec: RunSpec, venv: Any, *, device: str = "auto") -> None:
        """Build the SB3 model over an SB3 ``VecEnv`` (gradlab's ``SB3VecEnv`` in the learner).

        Seeds Python, NumPy and torch from ``spec.seed`` (the env's lanes are seeded by the env);
        SB3's own ``seed=`` is not used because it would re-seed the lanes.

        Raises:
            ConfigError: an invalid backend config or a Nature CNN on non-image observations.
        """
        import torch
        from stable_baselines3 import A2C, PPO
        from stable_baselines3.common.logger import Logger
        from stable_baselines3.common.preprocessing import is_image_space
        from stable_baselines3.common.utils import set_random_seed
        from stable_baselines3.common.vec_env import VecNormalize

        torch.distributions.Distribution.set_default_validate_args(False)
        self.spec = spec
        train = spec.recipe.train
        cfg = validate_backend_config(train, venv.num_envs)
        self._env_observation_space = venv.observation_space
        venv = _timed_vec_env_class()(venv, self)
        if train.normalize.observation or train.normalize.reward:
            venv = VecNormalize(venv, norm_obs=train.normalize.observation, norm_reward=train.normalize.reward,
                                clip_obs=train.normalize.clip_observation, gamma=cfg.gamma)
            self.vecnormalize = venv
        pm = train.policy_model
        image = is_image_space(self._env_observation_space, check_channels=False)
        extractor = pm.extractor if pm.extractor != "auto" else ("nature_cnn" if image else "mlp")
        if extractor == "nature_cnn" and not image:
            raise ConfigError(f"train.policy_model.extractor: nature_cnn needs image observations (uint8, 3 dims), "
                              f"found {self._env_observation_space}")
        normalized_image = normalizes_images(self._env_observation_space, train.normalize)
        policy_kwargs = sb3_policy_kwargs(pm, nature_cnn=extractor == "nature_cnn", normalize_images=not normalized_image)
        if device == "auto":
            device = train.device
        if device == "auto":
            device = "cuda" if (extractor == "nature_cnn" and torch.cuda.is_available()) else "cpu"
        set_random_seed(spec.seed, using_cuda=device.startswith("cuda"))
        self._ent_fn = schedule_fn(cfg.ent_coef)
        algorithm = PPO if isinstance(cfg, PPOConfig) else A2C
        model = algorithm("MlpPolicy", venv, **sb3_algorithm_kwargs(cfg), policy_kwargs=policy_kwargs, device=device,
                          verbose=0)
        model.set_logger(Logger(folder=None, output_formats=[]))
        from stable_baselines3.common.vec_env import VecTransposeImage

        self._transpose_image = isinstance(model.env, VecTransposeImage)
        self.model = model
        self._callback = _make_callback_class()(self)
        inner = self._inner_env()
        self._episode_source = inner if hasattr(inner, "pop_episodes") else None

    def begin(self, *, resumed: bool) -> None:
        """SB3's ``_setup_learn`` for the remaining budget (resets the env unless resumed with env state)."""
        total = self.spec.recipe.train.timesteps  # type: ignore[union-attr]
        remaining = max(total - self.model.num_timesteps, 0)
        if resumed:
            self.model._setup_learn(remaining, self._callback, reset_num_timesteps=False, progress_bar=False)
        else:
            self.model._setup_learn(total, self._callback, reset_num_timesteps=True, progress_bar=False)
        self._callback.on_training_start(locals(), globals())

    @property
    def num_timesteps(self) -> int:
        return int(self.model.num_timesteps)

    # -- phases ------------------------------------------------------------------------------
    def collect(self) -> bool:
        """One rollout of ``n_steps`` per lane into SB3's rollout buffer (advantages computed)."""
        self.rollout = RolloutStats()
        m = self.model
        ok = m.collect_rollouts(m.env, self._callback, m.rollout_buffer, n_rollout_steps=m.n_steps)
        m._update_current_progress_remaining(m.num_timesteps, m._total_timesteps)
        return ok

    def update(self) -> dict[str, float]:
        """One update on the collected rollout; returns the algorithm metrics (registered names)."""
        m = self.model
        m.ent_coef = float(self._ent_fn(m._current_progress_remaining))
        m.train()
        values = dict(m.logger.name_to_value)
        m.logger.dump(step=m.num_timesteps)  # clears the values (no output formats)
        a = f"train/algorithm/{self.algorithm}"
        mapping = {
            "train/approx_kl": f"{a}/update/approx_kl",
            "train/clip_fraction": f"{a}/update/clip_fraction",
            "train/clip_range": f"{a}/update/clip_range",
            "train/policy_gradient_loss": f"{a}/update/policy_gradient_loss",
            "train/policy_loss": f"{a}/update/policy_gradient_loss",
            "train/value_loss": f"{a}/update/value_loss",
            "train/loss": f"{a}/update/loss",
            "train/learning_rate": f"{a}/update/learning_rate",
            "train/n_updates": f"{a}/update/count",
            "train/explained_variance": f"{a}/value/explained_variance",
        }
        out = {new: float(values[old]) for old, new in mapping.items() if old in values}
        if "train/entropy_loss" in values:
            out[f"{a}/policy/entropy"] = -float(values["train/entropy_loss"])
        out[f"{a}/update/entropy_coef"] = m.ent_coef
        self._last_update = out
        return out

    def rollout_metrics(self) -> dict[str, float]:
        return {**self.rollout.metrics(), **self.episodes.metrics()}

    # -- checkpoint files --------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        """Write ``policy.zip``, ``policy.safetensors``, ``policy_spec.json`` and ``resume/`` into ``folder``."""
        import torch

        from gradlab.checkpoints.policy import export_policy, save_policy_files
        from gradlab.checkpoints.sb3zip import write_sb3_zip

        m = self.model
        write_sb3_zip(m, folder / POLICY_FILE)
        vn = self.vecnormalize
        tensors, pspec = export_policy(
            m, backend_id=self.id, algorithm=self.algorithm, policy_model=self.spec.recipe.train.policy_model,  # type: ignore[union-attr]
            env_observation_space=self._env_observation_space, transpose_image=self._transpose_image,
            obs_rms=vn.obs_rms if (vn is not None and vn.norm_obs) else None,
            obs_clip=vn.clip_obs if vn is not None else 10.0, obs_epsilon=vn.epsilon if vn is not None else 1e-8,
        )
        save_policy_files(folder, tensors, pspec)
        resume = folder / RESUME_DIR
        resume.mkdir()
        torch.save(m.policy.optimizer.state_dict(), resume / "optimizer.pt")
        if vn is not None:
            (resume / "vecnormalize.json").write_text(json.dumps(vecnormalize_state(vn)))
        from gradlab.learn import lane_state

        env_state = "reset"
        inner = self._inner_env()
        if lane_state.save(resume, inner):
            np.save(resume / "last_obs.npy", np.asarray(m._last_obs), allow_pickle=False)
            env_state = LANES_SAVED
        elif not self._lanes_note:
            self._lanes_note = True  # not every vector env is plain data (subprocess lanes, emulators)
            logger.info("lane state not saved (%s); a resumed run resets its lanes", lane_state.unsupported_reason(inner))
        state = {
            "format": "gradlab.resume/1",
            "backend_id": self.id,
            "num_timesteps": int(m.num_timesteps),
            "total_timesteps": int(m._total_timesteps),
            "n_updates": int(m._n_updates),
            "progress_remaining": float(m._current_progress_remaining),
            "ent_coef": float(m.ent_coef),
            "env_state": env_state,
            "last_episode_starts": np.asarray(m._last_episode_starts, dtype=bool).tolist(),
            "episodes": self.episodes.as_json(),
            "rng": rng_state(),
        }
        (resume / "state.json").write_text(json.dumps(state))

    def warm_start(self, init: Any) -> None:
        """Start from a parent checkpoint's weights (``spec.init_from``); call after :meth:`setup`.

        Loads ``policy.safetensors`` (and with ``init.optimizer`` the optimizer state, and the
        observation statistics when both recipes normalise); counters, schedules and RNG streams
        start fresh, as in a new run.

        Raises:
            IntegrityError: the parent fails verification or is not the recorded sha256.
            ContractViolation: the first tensor (in this policy's order) that is missing from the
                parent, has another shape, or is extra in the parent.
        """
        import torch

        path, parent = read_warm_start_parent(init, extra=[f"{RESUME_DIR}/optimizer.pt"] if init.optimizer else [])
        check_warm_start_tensors(self.model.policy.state_dict(), parent, source=init.source)
        self.model.policy.load_state_dict(parent, strict=True)
        if init.optimizer:
            opt = path / RESUME_DIR / "optimizer.pt"
            if not opt.is_file():
                raise ContractViolation(f"{opt}: --init-optimizer needs the parent's optimizer state, missing")
            try:
                self.model.policy.optimizer.load_state_dict(
                    torch.load(opt, map_location=self.model.device, weights_only=True))
            except (ValueError, KeyError, RuntimeError) as e:
                raise ContractViolation(f"{opt}: the parent's optimizer state does not fit this recipe's optimizer: {e}") from None
        stats = path / RESUME_DIR / "vecnormalize.json"
        vn = self.vecnormalize
        if vn is not None and vn.norm_obs and stats.is_file():
            data = json.loads(stats.read_text())
            if data.get("norm_obs"):
                vn.obs_rms.mean = np.asarray(data["obs_rms"]["mean"], dtype=np.float64)
                vn.obs_rms.var = np.asarray(data["obs_rms"]["var"], dtype=np.float64)
                vn.obs_rms.count = float(data["obs_rms"]["count"])

    def _inner_env(self) -> Any:
        """The env below SB3's and gradlab's wrappers (the gradlab ``SB3VecEnv``)."""
        env = self.model.env
        from stable_baselines3.common.vec_env import VecEnvWrapper

        while isinstance(env, VecEnvWrapper):
            env = env.venv
        return env

    def restore(self, checkpoint: Path) -> bool:
        """Load parameters, optimizer, counters, RNG streams and statistics from a checkpoint.

        Call after :meth:`setup` (same spec) and before :meth:`begin`, with a checkpoint already
        verified (against its publication receipt when it came from a store). Nothing is
        unpickled: the lane state is assigned into the freshly built env
        (:func:`gradlab.learn.lane_state.restore`).

        Returns:
            True when the lanes continue mid-episode from the saved env state.

        Raises:
            ContractViolation: the checkpoint is of another backend or its tensors do not fit.
        """
        import torch

        m = self.model
        resume = Path(checkpoint) / RESUME_DIR
        state = load_resume_policy(checkpoint, self.id, m.policy)
        m.policy.optimizer.load_state_dict(torch.load(resume / "optimizer.pt", map_location=m.device, weights_only=True))
        m.num_timesteps = int(state["num_timesteps"])
        m._n_updates = int(state["n_updates"])
        m._current_progress_remaining = float(state["progress_remaining"])
        m.ent_coef = float(state["ent_coef"])
        self.episodes = EpisodeStats.from_json(state["episodes"])
        if self.vecnormalize is not None:
            path = resume / "vecnormalize.json"
            if not path.is_file():
                raise ContractViolation(f"{path}: missing, but this recipe normalises observations or rewards")
            load_vecnormalize_state(self.vecnormalize, json.loads(path.read_text()))
        restored = False
        if state.get("env_state") == LANES_SAVED:
            from gradlab.learn import lane_state

            lane_state.restore(resume, self._inner_env())
            m._last_obs = np.load(resume / "last_obs.npy", allow_pickle=False)
            m._last_episode_starts = np.asarray(state["last_episode_starts"], dtype=bool)
            restored = True
        else:
            m._last_obs = None  # begin() resets the lanes
        set_rng_state(state["rng"])
        return restored

    def close(self) -> None:
        if self.model is not None and self.model.env is not None:
            self.model.env.close()
