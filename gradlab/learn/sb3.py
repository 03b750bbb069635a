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
loader; ``policy.zip`` is not read at all (the model is rebuilt from the recipe).
"""

from __future__ import annotations

import base64
import json
import logging
import random
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.checkpoints.manifest import POLICY_FILE, RESUME_DIR, WEIGHTS_FILE
from gradlab.contracts.recipe import A2CConfig, PPOConfig, RecipeTrain
from gradlab.contracts.run_spec import RunSpec
from gradlab.errors import ConfigError, ContractViolation
from gradlab.learn.schedules import schedule_fn

logger = logging.getLogger(__name__)

WINDOW = 100
"""Episodes in the rolling windows of the training episode metrics."""

LANES_SAVED = "lanes"
"""``state.json``'s ``env_state`` when ``lanes.json``/``lanes.npz`` hold the lane state."""


@dataclass
class EpisodeStats:
    """Rolling training-episode statistics (saved in resume state so curves continue)."""

    count: int = 0
    returns: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    raw_returns: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    lengths: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    successes: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    outcomes: dict[str, int] = field(default_factory=lambda: {"success": 0, "failure": 0, "timeout": 0, "ended": 0})
    reasons: dict[str, int] = field(default_factory=dict)

    def add(self, record: dict[str, Any]) -> None:
        self.count += 1
        self.returns.append(float(record["return"]))
        self.raw_returns.append(float(record.get("raw_return", record["return"])))
        self.lengths.append(int(record["length"]))
        outcome = str(record.get("outcome", "ended"))
        self.successes.append(outcome == "success")
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        reason = str(record.get("reason") or outcome)
        self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def as_json(self) -> dict[str, Any]:
        return {"count": self.count, "returns": list(self.returns), "raw_returns": list(self.raw_returns),
                "lengths": list(self.lengths), "successes": list(self.successes), "outcomes": dict(self.outcomes),
                "reasons": dict(self.reasons)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpisodeStats:
        s = cls(count=int(data["count"]), outcomes=dict(data["outcomes"]), reasons=dict(data["reasons"]))
        s.returns.extend(data["returns"])
        s.raw_returns.extend(data["raw_returns"])
        s.lengths.extend(data["lengths"])
        s.successes.extend(data["successes"])
        return s

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"train/episode/count": float(self.count)}
        if self.returns:
            out["train/episode/return/shaped/mean"] = float(np.mean(self.returns))
            out["train/episode/return/raw/mean"] = float(np.mean(self.raw_returns))
            out["train/episode/length/mean"] = float(np.mean(self.lengths))
            out["train/outcome/success/window_100/rate"] = float(np.mean(self.successes))
        for outcome, n in self.outcomes.items():
            out[f"train/outcome/{outcome}/count"] = float(n)
        for reason, n in self.reasons.items():
            out[f"train/episode/reason/{_segment(reason)}/count"] = float(n)
        return out


def _segment(text: str) -> str:
    """A reason as one metric path segment (``/`` and spaces replaced)."""
    return "".join(c if (c.isalnum() or c in "_.-:") else "_" for c in text) or "unknown"


@dataclass
class RolloutStats:
    """Per-rollout accumulators filled by the step callback.

    The step callback only keeps each step's reward array (one float64 copy, ``(n_envs,)``); the
    reward statistics are computed once per rollout in :meth:`metrics` (four array reductions per
    env step cost more than the rest of the callback).
    """

    steps: int = 0
    env_seconds: float = 0.0
    chunks: list = field(default_factory=list)

    def add_rewards(self, r: np.ndarray) -> None:
        """Record one env step's rewards, (n_envs,) float (copied as float64)."""
        r = np.array(r, dtype=np.float64)
        self.steps += r.size
        self.chunks.append(r)

    def metrics(self) -> dict[str, float]:
        """``train/reward/shaped/{mean,std,min,max}`` over the rollout's rewards (population std)."""
        if not self.steps:
            return {}
        r = np.concatenate(self.chunks).ravel()
        mean = float(r.sum()) / self.steps
        var = max(float(np.dot(r, r)) / self.steps - mean * mean, 0.0)
        return {"train/reward/shaped/mean": mean, "train/reward/shaped/std": float(np.sqrt(var)),
                "train/reward/shaped/min": float(r.min()), "train/reward/shaped/max": float(r.max())}


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


def rng_state() -> dict[str, Any]:
    """Python's, NumPy's global and torch's (CPU, and CUDA when initialised) RNG states as JSON data."""
    import torch

    py = random.getstate()
    np_state = np.random.get_state()
    state = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = [base64.b64encode(s.numpy().tobytes()).decode("ascii") for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the RNG states :func:`rng_state` returned (CUDA's only when CUDA is available)."""
    import torch

    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(torch.from_numpy(np.frombuffer(base64.b64decode(state["torch"]), dtype=np.uint8).copy()))
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([
            torch.from_numpy(np.frombuffer(base64.b64decode(s), dtype=np.uint8).copy()) for s in state["torch_cuda"]
        ])


def validate_backend_config(train: RecipeTrain, n_envs: int) -> PPOConfig | A2CConfig:
    """The backend's typed config, with the checks SB3 would only make after compute starts.

    Raises:
        ConfigError: naming ``train.backend.config.<key>``, what was expected and what was found.
    """
    cfg = train.backend.typed_config()
    problems = []
    rollout = cfg.n_steps * n_envs
    if rollout < 2:
        problems.append(f"train.backend.config.n_steps: n_steps * n_envs must be > 1, found {cfg.n_steps} * {n_envs}")
    if isinstance(cfg, PPOConfig):
        if cfg.batch_size > rollout:
            problems.append(f"train.backend.config.batch_size: expected at most n_steps * n_envs = {rollout}, "
                            f"found {cfg.batch_size}")
        if cfg.normalize_advantage and cfg.batch_size < 2:
            problems.append("train.backend.config.batch_size: expected > 1 with normalize_advantage, found 1")
    if problems:
        raise ConfigError("\n".join(problems))
    return cfg


class SB3Backend:
    """One SB3 on-policy algorithm (PPO or A2C) driven phase by phase.

    Attributes:
        id: ``sb3.ppo`` or ``sb3.a2c``. algorithm: ``ppo`` or ``a2c``.
        model: the SB3 model (after :meth:`setup`).
        episodes: rolling episode statistics. rollout: the current rollout's accumulators.
    """

    def __init__(self, backend_id: str):
        if backend_id not in BACKENDS:
            raise ConfigError(f"train.backend.id: expected one of {', '.join(BACKENDS)}, found {backend_id!r}")
        self.id = backend_id
        self.algorithm = BACKENDS[backend_id]
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
        from gradlab.learn.learner import make_training_env

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
        from stable_baselines3.common.torch_layers import FlattenExtractor, NatureCNN
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
        policy_kwargs: dict[str, Any] = dict(
            net_arch=pm.net_arch, activation_fn={"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[pm.activation],
            ortho_init=pm.ortho_init, share_features_extractor=pm.share_features_extractor,
        )
        if extractor == "nature_cnn":
            policy_kwargs.update(features_extractor_class=NatureCNN, features_extractor_kwargs={"features_dim": pm.features_dim})
        else:
            policy_kwargs.update(features_extractor_class=FlattenExtractor)
        if device == "auto":
            device = train.device
        if device == "auto":
            device = "cuda" if (extractor == "nature_cnn" and torch.cuda.is_available()) else "cpu"
        set_random_seed(spec.seed, using_cuda=device.startswith("cuda"))
        self._ent_fn = schedule_fn(cfg.ent_coef)
        common = dict(learning_rate=schedule_fn(cfg.learning_rate), n_steps=cfg.n_steps, gamma=cfg.gamma,
                      gae_lambda=cfg.gae_lambda, ent_coef=self._ent_fn(1.0), vf_coef=cfg.vf_coef,
                      max_grad_norm=cfg.max_grad_norm, normalize_advantage=cfg.normalize_advantage,
                      policy_kwargs=policy_kwargs, device=device, verbose=0)
        if isinstance(cfg, PPOConfig):
            model = PPO("MlpPolicy", venv, batch_size=cfg.batch_size, n_epochs=cfg.n_epochs,
                        clip_range=schedule_fn(cfg.clip_range), clip_range_vf=cfg.clip_range_vf,
                        target_kl=cfg.target_kl, **common)
        else:
            model = A2C("MlpPolicy", venv, rms_prop_eps=cfg.rms_prop_eps, use_rms_prop=cfg.use_rms_prop, **common)
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




def policy_tensors(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint folder's weights-only policy tensors (SB3's names), without gradlab's own entries."""
    from safetensors.torch import load_file

    return {k: v for k, v in load_file(str(Path(checkpoint) / WEIGHTS_FILE)).items() if not k.startswith("gradlab.")}


def load_resume_policy(checkpoint: Path, backend_id: str, module: Any) -> dict[str, Any]:
    """Read ``resume/state.json`` of a ``backend_id`` checkpoint and load its policy into ``module``.

    Returns:
        The parsed ``state.json``.

    Raises:
        ContractViolation: the checkpoint is of another backend, or its tensors do not fit ``module``.
    """
    state_file = Path(checkpoint) / RESUME_DIR / "state.json"
    state = json.loads(state_file.read_text())
    if state.get("backend_id") != backend_id:
        raise ContractViolation(f"{state_file}: backend expected {backend_id}, found {state.get('backend_id')}")
    try:
        module.load_state_dict(policy_tensors(checkpoint), strict=True)
    except RuntimeError as e:
        raise ContractViolation(f"{Path(checkpoint) / WEIGHTS_FILE}: does not fit this recipe's policy: {e}") from None
    return state

def read_warm_start_parent(init: Any, *, extra: list[str]) -> tuple[Path, dict[str, Any]]:
    """The verified parent checkpoint folder of a warm start and its policy tensors (SB3's names).

    Every file the warm start reads (the weights-only policy, its spec, ``extra`` resume files) and
    every other file present is checked against the parent's manifest, and the manifest's policy
    sha256 against the one recorded in the run spec (``init.checkpoint_sha256``). A published
    repository's ``checkpoint/`` holds only the weights-only files (the rest was verified against
    its ``gradlab.json`` at download).

    Returns:
        (folder, {tensor name: tensor}) without gradlab's own entries.

    Raises:
        IntegrityError: a needed file is missing, a file differs from the manifest, or the parent is
            not the recorded sha256.
    """

    from gradlab.checkpoints.bundle import file_sha256, read_manifest
    from gradlab.checkpoints.manifest import POLICY_SPEC_FILE
    from gradlab.errors import IntegrityError

    path = Path(init.path)
    manifest = read_manifest(path)
    needed = [WEIGHTS_FILE, POLICY_SPEC_FILE, *extra]
    present = [rel for rel in manifest.files if (path / rel).is_file()]
    for rel in sorted(set(needed) | set(present)):
        entry = manifest.files.get(rel)
        if entry is None or not (path / rel).is_file():
            raise IntegrityError(f"{path / rel}: needed for the warm start but not in the checkpoint")
        digest = file_sha256(path / rel)
        if digest != entry.sha256:
            raise IntegrityError(f"{path / rel}: sha256 expected {entry.sha256}, found {digest}")
    if manifest.sha256 != init.checkpoint_sha256:
        raise IntegrityError(f"{path}: --init-from expected policy sha256 {init.checkpoint_sha256}, found {manifest.sha256}")
    return path, policy_tensors(path)

def check_warm_start_tensors(own: dict[str, Any], parent: dict[str, Any], *, source: str) -> None:
    """Refuse a parent whose tensors do not fit this policy, naming the first mismatching tensor.

    Args:
        own: this recipe's policy state dict (name -> tensor), in module order.
        parent: the parent checkpoint's tensors (gradlab's own ``gradlab.*`` entries removed).

    Raises:
        ContractViolation: ``--init-from SOURCE: tensor NAME: ...`` for the first tensor of ``own``
            missing from ``parent`` or of another shape, else the first extra tensor of ``parent``.
    """
    for name, tensor in own.items():
        if name not in parent:
            raise ContractViolation(f"--init-from {source}: tensor {name}: this recipe's policy has it "
                                    f"{tuple(tensor.shape)}, the parent checkpoint has no such tensor (another architecture)")
        if tuple(parent[name].shape) != tuple(tensor.shape):
            raise ContractViolation(f"--init-from {source}: tensor {name}: shape expected {tuple(tensor.shape)} "
                                    f"(this recipe's policy), found {tuple(parent[name].shape)} in the parent checkpoint")
    extra = [name for name in parent if name not in own]
    if extra:
        raise ContractViolation(f"--init-from {source}: tensor {extra[0]}: in the parent checkpoint but not in this "
                                "recipe's policy (another architecture)")


def vecnormalize_state(vn: Any) -> dict[str, Any]:
    """A ``VecNormalize``'s (or :class:`gradlab.learn.ppo_state.Normaliser`'s) statistics and settings
    as JSON data: ``resume/vecnormalize.json`` of both PPO backends."""

    def rms(r: Any) -> dict[str, Any]:
        return {"mean": np.asarray(r.mean).tolist(), "var": np.asarray(r.var).tolist(), "count": float(r.count)}

    # VecNormalize has no obs_rms when only rewards are normalised: null then.
    return {"obs_rms": rms(vn.obs_rms) if vn.norm_obs else None, "ret_rms": rms(vn.ret_rms),
            "returns": np.asarray(vn.returns).tolist(),
            "clip_obs": vn.clip_obs, "clip_reward": vn.clip_reward, "gamma": vn.gamma, "epsilon": vn.epsilon,
            "norm_obs": vn.norm_obs, "norm_reward": vn.norm_reward}


def load_vecnormalize_state(vn: Any, data: dict[str, Any]) -> None:
    """Assign :func:`vecnormalize_state`'s statistics back (float64 arrays; settings come from the recipe)."""
    for name in ("obs_rms", "ret_rms") if vn.norm_obs else ("ret_rms",):
        r = getattr(vn, name)
        r.mean = np.asarray(data[name]["mean"], dtype=np.float64)
        r.var = np.asarray(data[name]["var"], dtype=np.float64)
        r.count = float(data[name]["count"])
    vn.returns = np.asarray(data["returns"], dtype=np.float64)


BACKENDS: dict[str, str] = {"sb3.ppo": "ppo", "sb3.a2c": "a2c"}
"""Registered backend ids → algorithm names (the ``{algorithm}`` metric segment)."""


def registered_backends() -> list[str]:
    """Backend ids, for tests parametrized over every backend (``sb3.*`` and ``gradlab.ppo``)."""
    return [*BACKENDS, "gradlab.ppo"]


def make_backend(backend_id: str) -> Any:
    """The backend object for ``train.backend.id`` (:class:`SB3Backend` or ``gradlab.ppo``'s ``PPOBackend``).

    Raises:
        ConfigError: an unknown id, naming ``train.backend.id``.
    """
    if backend_id == "gradlab.ppo":
        from gradlab.learn.ppo import PPOBackend

        return PPOBackend(backend_id)
    return SB3Backend(backend_id)
