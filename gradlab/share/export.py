"""``gradlab export``: a checkpoint in rl-zoo3's layout, or as plain stable-baselines3 files.

rl-zoo3 layout (what ``python -m rl_zoo3.enjoy --algo ALGO --env ENV -f DIR`` reads, exp id 1)::

    DIR/<algo>/<env>_1/<env>.zip                 the checkpoint's policy.zip (byte-identical)
    DIR/<algo>/<env>_1/<env>/config.yml          hyperparameters, with "normalize" when normalised
    DIR/<algo>/<env>_1/<env>/args.yml            algo, env, seed, env_kwargs (as rl-zoo3 saves them)
    DIR/<algo>/<env>_1/<env>/env_kwargs.yml      the provider arguments (gym.make keyword arguments)
    DIR/<algo>/<env>_1/<env>/vecnormalize.pkl    VecNormalize statistics, when the recipe normalises
    DIR/gradlab_export.json                      provenance: run, step, sha256 of every file, hashes

SB3 layout (``--format sb3``, and the fallback when rl-zoo3 cannot build the environment)::

    DIR/policy.zip, DIR/vecnormalize.pkl (when normalised), DIR/gradlab_export.json

rl-zoo3 builds its environment with ``gym.make(env_id, **env_kwargs)`` and its own wrappers, so
only goals whose episode *is* the gymnasium env's own can be played there: provider
``gymnasium``, no preprocessing, no task events, native reward unscaled and unclipped, and no
extra step limit (:func:`rl_zoo_problem`). ``vecnormalize.pkl`` is built here from the
checkpoint's JSON statistics (``resume/vecnormalize.json``), never from a pickle read back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.errors import ContractViolation


def rl_zoo_problem(environment: EnvironmentSpec) -> str | None:
    """Why rl-zoo3 cannot rebuild this environment's episodes, or None when it can."""
    from gradlab.contracts.task import Reward

    task = environment.task
    if environment.provider != "gymnasium":
        return f"provider '{environment.provider}' is not a gymnasium registry env rl-zoo3 can gym.make"
    neutral = {"frame_stack": 1, "normalize_observation": False}
    active = sorted(k for k, v in environment.preprocessing.items() if neutral.get(k, None) != v)
    if active:
        return f"preprocessing {active} is gradlab's, rl-zoo3 would not apply it"
    if task.events or task.signals:
        return "the task program's events change the episode's end or reward"
    if task.reward != Reward():
        return "the task program transforms the reward"
    if task.termination.max_episode_steps is not None:
        return "the task program adds a step limit"
    return None


def write_vecnormalize(environment: EnvironmentSpec, stats: dict[str, Any], path: Path) -> None:
    """Write SB3's ``vecnormalize.pkl`` with ``stats`` (the checkpoint's ``vecnormalize.json``)."""
    import numpy as np
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from gradlab.envs import make_vector_env

    probe = make_vector_env(environment.model_copy(update={"n_envs": 1}), seed=0)
    obs_space, act_space = probe.single_observation_space, probe.single_action_space
    probe.close()
    import gymnasium as gym

    class _Spaces(gym.Env):
        def __init__(self) -> None:
            self.observation_space, self.action_space = obs_space, act_space

    vn = VecNormalize(DummyVecEnv([_Spaces]), norm_obs=bool(stats["norm_obs"]), norm_reward=bool(stats["norm_reward"]),
                      clip_obs=float(stats["clip_obs"]), clip_reward=float(stats["clip_reward"]), gamma=float(stats["gamma"]),
                      epsilon=float(stats["epsilon"]))
    for name in ("obs_rms", "ret_rms") if vn.norm_obs else ("ret_rms",):  # no obs_rms without norm_obs
        rms = getattr(vn, name)
        rms.mean = np.asarray(stats[name]["mean"], dtype=np.float64)
        rms.var = np.asarray(stats[name]["var"], dtype=np.float64)
        rms.count = float(stats[name]["count"])
    vn.training = False
    vn.save(str(path))


def export_checkpoint(checkpoint: Path, spec: Any, out: Path, *, fmt: str,
                      force: bool = False) -> tuple[str, list[Path], str | None]:
    """Export a verified checkpoint folder.

    Args:
        checkpoint: the checkpoint folder (verified here first).
        spec: its run's :class:`~gradlab.contracts.run_spec.RunSpec`.
        out: the output folder (created). ``sb3``: it must be new or empty; rl-zoo: its run folder
            ``<algo>/<env>_1`` must not exist (other runs' folders beside it are kept).
        fmt: ``rl-zoo`` or ``sb3``.
        force: replace what is there instead: the whole ``sb3`` folder, only when it holds an
            earlier export (``gradlab_export.json``), or the rl-zoo run folder; no file is left over.

    Returns:
        (format written, files written, why rl-zoo3 was not possible or None).

    Raises:
        IntegrityError: the checkpoint fails verification. ContractViolation: an unknown format,
        a backend without an SB3 zip, ``out`` is a file, or the destination is taken (above).
    """
    import yaml

    from gradlab.checkpoints import file_sha256, verify_checkpoint

    if fmt not in ("rl-zoo", "sb3"):
        raise ContractViolation(f"--format: expected rl-zoo or sb3, found {fmt!r}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ContractViolation(f"--out {out}: expected a folder, found a file")
    manifest = verify_checkpoint(checkpoint)
    # Both PPO backends write an SB3 zip (gradlab.ppo's holds the same policy under SB3's names).
    algo = {"sb3.ppo": "ppo", "sb3.a2c": "a2c", "gradlab.ppo": "ppo"}.get(manifest.backend_id)
    if algo is None:
        raise ContractViolation(f"{checkpoint}: backend {manifest.backend_id} has no stable-baselines3 zip to export")
    env = spec.environment
    train = spec.recipe.train
    stats_file = Path(checkpoint) / "resume" / "vecnormalize.json"
    stats = json.loads(stats_file.read_text()) if stats_file.is_file() else None
    if (train.normalize.observation or train.normalize.reward) and stats is None:
        raise ContractViolation(f"{stats_file}: missing, but the recipe normalises (the export would play without it)")
    why = rl_zoo_problem(env) if fmt == "rl-zoo" else None
    written = "sb3" if (fmt == "sb3" or why) else "rl-zoo"
    out = Path(out)
    if written == "rl-zoo":
        run_folder = out / algo / f"{env.env_id}_1"
        if run_folder.exists():
            if not force:
                raise ContractViolation(f"--out {out}: {run_folder} exists (an earlier export); pass --force to "
                                        "replace it")
            shutil.rmtree(run_folder)
        meta = run_folder / env.env_id
        meta.mkdir(parents=True, exist_ok=True)
        zip_path = run_folder / f"{env.env_id}.zip"
        config: dict[str, Any] = {"n_envs": env.n_envs, "n_timesteps": train.timesteps, "policy": "MlpPolicy",
                                  **train.backend.typed_config().model_dump(mode="json")}
        for key in ("precision", "compile", "threads"):  # gradlab.ppo's own keys: not SB3 hyperparameters
            config.pop(key, None)
        if stats is not None:
            config["normalize"] = {"norm_obs": bool(stats["norm_obs"]), "norm_reward": bool(stats["norm_reward"])}
        args = {"algo": algo, "env": env.env_id, "seed": spec.seed, "env_kwargs": dict(env.provider_args) or None,
                "n_timesteps": train.timesteps}
        files = {meta / "config.yml": config, meta / "args.yml": args, meta / "env_kwargs.yml": dict(env.provider_args)}
        for path, data in files.items():
            path.write_text(yaml.safe_dump(data, sort_keys=True))
        vec_path = meta / "vecnormalize.pkl"
    else:
        if out.is_dir() and any(out.iterdir()):
            if not force:
                raise ContractViolation(f"--out {out}: expected a new or empty folder, found files in it; pass "
                                        "--force to replace it")
            if not (out / "gradlab_export.json").is_file():
                raise ContractViolation(f"--out {out}: not an earlier export (no gradlab_export.json): not "
                                        "replaced, even with --force")
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        zip_path = out / "policy.zip"
        files = {}
        vec_path = out / "vecnormalize.pkl"
    shutil.copyfile(Path(checkpoint) / "policy.zip", zip_path)
    paths = [zip_path, *files]
    if stats is not None:
        write_vecnormalize(env, stats, vec_path)
        paths.append(vec_path)
    provenance = {
        "format": "gradlab.export/1", "layout": written, "run_id": manifest.run_id, "step": manifest.step,
        "checkpoint_sha256": manifest.sha256, "goal_id": spec.goal_id, "recipe_id": spec.recipe_id,
        "env_id": env.env_id, "algorithm": algo, **spec.hashes,
        "files": {p.relative_to(out).as_posix(): file_sha256(p) for p in paths},
    }
    (out / "gradlab_export.json").write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")
    return written, [*paths, out / "gradlab_export.json"], why
