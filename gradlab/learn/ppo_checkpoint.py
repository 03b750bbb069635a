"""``gradlab.ppo``'s checkpoint files: what :meth:`PPOBackend.save` writes and ``restore`` and ``warm_start`` read.

The same bundle as ``sb3.ppo``'s (docs/ARCHITECTURE.md section 6): the weights-only policy
(``policy.safetensors`` + ``policy_spec.json``, SB3's tensor names, the observation statistics as
``gradlab.obs_rms.*`` tensors when the recipe normalises observations) and ``policy.zip`` (an SB3
``PPO`` zip of the same weights, so ``PPO.load`` works on it). Resume state (``resume/``), never
pickle:

* ``state.json``: counters, the schedules' progress, the entropy coefficient, every RNG stream,
  the episode windows, Adam's hyperparameters (its param groups) and, for ``fp16-amp``, the grad
  scaler's state;
* ``optimizer.safetensors``: Adam's moments and step counts by parameter index
  (``state.<index>.<name>``);
* as ``sb3.ppo`` writes them, the lane state (``lanes.json`` + ``lanes.npz`` + ``last_obs.npy``: a
  resumed run continues the same episodes) and the normalisation statistics
  (``vecnormalize.json``): :mod:`gradlab.learn.ppo_state`;
* with ``train.curriculum.archive``, ``curriculum.json`` and the archived states
  (``states/<sha256>.bin``): :mod:`gradlab.learn.ppo_curriculum`.

Each function takes the set-up :class:`gradlab.learn.ppo.PPOBackend` as ``b``.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.checkpoints.manifest import POLICY_FILE, RESUME_DIR
from gradlab.errors import ContractViolation
from gradlab.learn.ppo_state import VECNORMALIZE_FILE, read_required_json, restore_lanes, save_lanes
from gradlab.learn.resume_state import LANES_SAVED, load_resume_policy, rng_state, set_rng_state
from gradlab.learn.stats import EpisodeStats
from gradlab.learn.warm_start import check_warm_start_tensors, read_warm_start_parent

logger = logging.getLogger(__name__)

OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "state.json"


def policy_files(b: Any) -> tuple[dict[str, Any], Any]:
    """(tensors, PolicySpec) of the weights-only policy, as :func:`gradlab.checkpoints.policy.export_policy`
    gives for sb3.ppo.

    Returns:
        ({SB3 tensor name: CPU tensor, plus ``gradlab.obs_rms.mean``/``var`` (float64, the
        observation shape) when observations are normalised}, the :class:`PolicySpec`).
    """
    from gradlab.checkpoints.policy import PolicySpec, space_to_spec

    net = b.net
    pm = b.spec.recipe.train.policy_model  # type: ignore[union-attr]
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in net.state_dict().items()}
    norm = None
    if b.normaliser is not None and b.normaliser.norm_obs:  # applied frozen by evaluation and play
        import torch

        from gradlab.checkpoints.policy import OBS_MEAN_KEY, OBS_VAR_KEY, ObsNormalization

        rms = b.normaliser.obs_rms
        tensors[OBS_MEAN_KEY] = torch.as_tensor(np.asarray(rms.mean, dtype=np.float64))
        tensors[OBS_VAR_KEY] = torch.as_tensor(np.asarray(rms.var, dtype=np.float64))
        norm = ObsNormalization(clip=b.normaliser.clip_obs, epsilon=b.normaliser.epsilon)
    obs_space = b.obs_space
    if net.transpose:
        from gymnasium import spaces

        s = obs_space.shape
        obs_space_net = spaces.Box(low=0, high=255, shape=(s[2], s[0], s[1]), dtype=np.uint8)
    else:
        obs_space_net = obs_space
    spec = PolicySpec(
        backend_id=b.id, algorithm=b.algorithm, observation_space=space_to_spec(b.env_obs_space),
        policy_observation_space=space_to_spec(obs_space_net), action_space=space_to_spec(b.action_space),
        extractor="nature_cnn" if net.nature_cnn else "flatten", features_dim=int(net.features_dim),
        net_arch=pm.net_arch, activation=pm.activation, share_features_extractor=net.share,
        normalize_images=not b.normalized_image, transpose_image=bool(net.transpose), obs_normalization=norm)
    return tensors, spec


def save(b: Any, folder: Path) -> None:
    """Write ``policy.zip`` (an SB3 PPO zip), ``policy.safetensors``, ``policy_spec.json`` and ``resume/``.

    ``resume/`` also holds the lane state (``lanes.json``, ``lanes.npz``, ``last_obs.npy``;
    ``state.json``'s ``env_state`` is then ``lanes``) and, when the recipe normalises,
    ``vecnormalize.json`` (:mod:`gradlab.learn.ppo_state`).
    """
    from safetensors.torch import save_file

    from gradlab.checkpoints.policy import save_policy_files

    tensors, pspec = policy_files(b)
    save_policy_files(folder, tensors, pspec)
    _write_sb3_zip(b, folder / POLICY_FILE, {k: v for k, v in tensors.items() if not k.startswith("gradlab.")})
    resume = folder / RESUME_DIR
    resume.mkdir()
    opt_tensors, opt_meta = _optimizer_state(b.optimizer)
    save_file(opt_tensors, str(resume / OPTIMIZER_FILE), metadata={"format": "gradlab.adam/1"})
    if b.normaliser is not None:
        (resume / VECNORMALIZE_FILE).write_text(json.dumps(b.normaliser.state()))
    env_state = "reset"
    why = save_lanes(resume, b.venv, b._obs)
    if why is None:
        env_state = LANES_SAVED
    elif not b._lanes_note:
        b._lanes_note = True  # not every vector env is plain data (subprocess lanes, emulators)
        logger.info("lane state not saved (%s); a resumed run resets its lanes", why)
    state = {
        "format": "gradlab.ppo.resume/1", "backend_id": b.id, "num_timesteps": int(b.num_timesteps),
        "total_timesteps": int(b.timesteps), "n_updates": int(b.n_updates),
        "progress_remaining": float(b.progress_remaining), "ent_coef": float(b.ent_coef),
        "env_state": env_state, "optimizer": opt_meta, "episodes": b.episodes.as_json(), "rng": rng_state(),
    }
    if b.curriculum is not None:  # resume/curriculum.json + resume/states/ (gradlab.learn.ppo_curriculum)
        b.curriculum.save(resume)
    if b._scaler is not None:
        state["grad_scaler"] = {k: (float(v) if isinstance(v, float) else v) for k, v in b._scaler.state_dict().items()}
    (resume / STATE_FILE).write_text(json.dumps(state))


def _write_sb3_zip(b: Any, path: Path, tensors: dict[str, Any]) -> None:
    """An SB3 ``PPO`` zip of these weights (``PPO.load`` works on it), via a model built once over the spaces.

    The model is built from the recipe as ``sb3.ppo`` builds its own (:mod:`gradlab.learn.sb3_model`:
    the same schedules, ``policy_kwargs`` and hyperparameters), and carries this run's ``n_envs``,
    budget and progress, so its saved attributes are those of an ``sb3.ppo`` run of the recipe.
    ``_last_obs`` stays None: SB3 that continues training from it resets its env first.
    """
    from collections import deque

    if getattr(b, "_sb3_model", None) is None:
        import gymnasium as gym
        import torch
        from stable_baselines3 import PPO
        from stable_baselines3.common.vec_env import DummyVecEnv

        from gradlab.learn.sb3_model import sb3_algorithm_kwargs, sb3_policy_kwargs

        obs_space, act_space = b.obs_space, b.action_space

        class Spaces(gym.Env):
            observation_space, action_space = obs_space, act_space

        pm = b.spec.recipe.train.policy_model  # type: ignore[union-attr]
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SB3's batch_size advice is about its own rollout buffer
            # One lane of spaces (SB3 allocates its rollout buffer per lane); n_envs is set below.
            model = PPO("MlpPolicy", DummyVecEnv([Spaces]), **sb3_algorithm_kwargs(b.cfg),
                        policy_kwargs=sb3_policy_kwargs(pm, nature_cnn=b.net.nature_cnn,
                                                        normalize_images=not b.normalized_image),
                        device="cpu", verbose=0)
        model.n_envs = int(b.venv.num_envs)
        model.ep_info_buffer, model.ep_success_buffer = (deque(maxlen=model._stats_window_size),
                                                           deque(maxlen=model._stats_window_size))
        b._sb3_model = model
    model = b._sb3_model
    model.policy.load_state_dict(tensors, strict=True)
    model.num_timesteps = int(b.num_timesteps)
    model._total_timesteps = int(b.timesteps)
    model._n_updates = int(b.n_updates)
    model._current_progress_remaining = float(b.progress_remaining)
    model.ent_coef = float(b.ent_coef)
    from gradlab.checkpoints import write_sb3_zip

    write_sb3_zip(model, path)  # deterministic, nothing of gradlab pickled (docs/ARCHITECTURE.md section 6)


def warm_start(b: Any, init: Any) -> None:
    """Start from a parent checkpoint's weights (``spec.init_from``); call after ``b.setup``.

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
    check_warm_start_tensors(b.net.state_dict(), parent, source=init.source)
    b.net.load_state_dict({k: v.to(b.device) for k, v in parent.items()}, strict=True)
    if init.optimizer:
        resume = path / RESUME_DIR
        state = json.loads((resume / STATE_FILE).read_text())
        if state.get("backend_id") != b.id:
            raise ContractViolation(f"{resume / STATE_FILE}: --init-optimizer needs a {b.id} parent's optimizer "
                                    f"state, found backend {state.get('backend_id')}")
        if not (resume / OPTIMIZER_FILE).is_file():
            raise ContractViolation(f"{resume / OPTIMIZER_FILE}: --init-optimizer needs the parent's optimizer state, missing")
        _load_optimizer_state(b.optimizer, load_file(str(resume / OPTIMIZER_FILE)), state["optimizer"])
    stats = path / RESUME_DIR / VECNORMALIZE_FILE
    if b.normaliser is not None and b.normaliser.norm_obs and stats.is_file():
        b.normaliser.load_observation_statistics(json.loads(stats.read_text()), stats)


def restore(b: Any, checkpoint: Path) -> bool:
    """Load parameters, optimizer, counters, RNG streams, episode windows, normalisation
    statistics and, when saved, the lane state from a checkpoint.

    Call after ``b.setup`` and before ``b.begin``, with a checkpoint already verified against its
    manifest (the learner does). No pickle is read. A checkpoint without lane state (written
    before gradlab.ppo saved it, or of an env whose state is not plain data) resumes with new
    episodes.

    Returns:
        True when the lanes continue mid-episode, False when ``b.begin`` resets them.

    Raises:
        ContractViolation: the checkpoint is of another backend or its tensors do not fit; a
            normalising recipe's ``vecnormalize.json`` is missing or does not fit; a lane-state
            file is malformed or does not fit this env (each naming the file).
        IntegrityError: an archived state blob of the curriculum is corrupted (naming it).
    """
    from safetensors.torch import load_file

    resume = Path(checkpoint) / RESUME_DIR
    state = load_resume_policy(checkpoint, b.id, b.net)
    if b.normaliser is not None:
        path = resume / VECNORMALIZE_FILE
        b.normaliser.load(read_required_json(path, "this recipe normalises observations or rewards"), path)
    restored = False
    if state.get("env_state") == LANES_SAVED:
        b._obs = restore_lanes(resume, b.venv, obs_shape=tuple(b.obs_space.shape))
        restored = True
    else:
        b._obs = None  # begin() resets the lanes
    _load_optimizer_state(b.optimizer, load_file(str(resume / OPTIMIZER_FILE)), state["optimizer"])
    b.num_timesteps = int(state["num_timesteps"])
    b.n_updates = int(state["n_updates"])
    b.progress_remaining = float(state["progress_remaining"])
    b.ent_coef = float(state["ent_coef"])
    b.episodes = EpisodeStats.from_json(state["episodes"])
    if b.curriculum is not None:
        b.curriculum.restore(resume, lanes_restored=restored)
    if b._scaler is not None and "grad_scaler" in state:
        b._scaler.load_state_dict(state["grad_scaler"])
    set_rng_state(state["rng"])
    return restored


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
    """Load :func:`_optimizer_state`'s tensors and JSON into ``optimizer`` (moments in their parameter's layout)."""
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
