"""``gradlab export``: a checkpoint in rl-zoo3's layout, or as plain stable-baselines3 files.

rl-zoo3 layout (what ``python -m rl_zoo3.enjoy --algo ALGO --env ENV -f DIR`` reads, exp id 1)::

    DIR/<algo>/<env>_1/<env>.zip                 the checkpoint's policy.zip (byte-identical)
    DIR/<algo>/<env>_1/<env>/config.yml          hyperparameters as rl-zoo3 saves them after training
    DIR/<algo>/<env>_1/<env>/hyperparams.yml     the same as a --conf-file for python -m rl_zoo3.train
    DIR/<algo>/<env>_1/<env>/args.yml            algo, env, seed, env_kwargs (as rl-zoo3 saves them)
    DIR/<algo>/<env>_1/<env>/env_kwargs.yml      the provider arguments (gym.make keyword arguments)
    DIR/<algo>/<env>_1/<env>/vecnormalize.pkl    VecNormalize statistics, when the recipe normalises
    DIR/gradlab_export.json                      provenance: run, step, sha256 of every file, hashes

SB3 layout (``--format sb3``)::

    DIR/policy.zip, DIR/vecnormalize.pkl (when normalised), DIR/gradlab_export.json

rl-zoo3 builds its environment with ``gym.make(env_id, **env_kwargs)`` and its own wrappers, so
only goals whose episode *is* the gymnasium env's own can be played there: provider
``gymnasium``, no preprocessing, no task events, native reward unscaled and unclipped, and no
extra step limit (:func:`rl_zoo_problem`). ``vecnormalize.pkl`` is built here from the
checkpoint's JSON statistics (``resume/vecnormalize.json``), never from a pickle read back.

Hyperparameters are written in rl-zoo3's own forms (:func:`rl_zoo_hyperparameters`), so
``python -m rl_zoo3.train --algo ALGO --env ENV --conf-file .../hyperparams.yml`` trains the
recipe again and saves a ``config.yml`` identical to the exported one. A goal rl-zoo3 cannot play
or a recipe it cannot express (a linear schedule that does not end at 0, a scheduled ``ent_coef``)
is refused for ``--format rl-zoo`` before anything is written, naming why and ``--format sb3``:
an export never gives less than its format promises. ALE goals are among them: rl-zoo3's Atari
path (``AtariWrapper`` over a ``NoFrameskip`` env, or its ``env_wrapper`` settings over an ALE v5
env) is not gradlab's provider step for step (gradlab's own frame pipeline, task program and
episode ends), so its ``enjoy`` would play another game than the one gradlab evaluated.
"""

from __future__ import annotations

import json
import shutil
from collections import OrderedDict
from pathlib import Path
from typing import Any

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.errors import ContractViolation


def rl_zoo_problem(environment: EnvironmentSpec) -> str | None:
    """Why rl-zoo3 cannot rebuild this environment's episodes, or None when it can."""
    from gradlab.contracts.task import Reward

    task = environment.task
    if environment.provider == "ale":
        return ("rl-zoo3 plays Atari through its own wrappers (AtariWrapper's frame skip, resize and life-loss ends, "
                "or env_wrapper settings over ALE v5), not gradlab's ALE frame pipeline and task program step for step, "
                "so its enjoy would not play the game gradlab evaluated")
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


#: rl-zoo3 turns these from ``lin_<initial>`` / a number into schedules (``ExperimentManager._preprocess_schedules``).
_ZOO_SCHEDULES = ("learning_rate", "clip_range", "clip_range_vf")
#: gradlab.ppo's own config keys: how to compute, not SB3 hyperparameters.
_GRADLAB_ONLY = ("precision", "compile", "threads")


def rl_zoo_hyperparameters(train: Any, environment: EnvironmentSpec, *, image: bool) -> tuple[dict[str, Any], str | None]:
    """A recipe as rl-zoo3 hyperparameters, in the forms its ``hyperparams/<algo>.yml`` files use.

    Args:
        train: the recipe's :class:`~gradlab.contracts.recipe.RecipeTrain`.
        environment: the run's training environment (``n_envs``).
        image: whether the observations are images (``policy_model.extractor: auto`` then means
            the Nature CNN, rl-zoo3's ``CnnPolicy``).

    Returns:
        (hyperparameters, None), or ({}, why) when rl-zoo3 has no form for one of them. The keys:
        ``n_envs``, ``n_timesteps`` (the budget), ``policy`` (``MlpPolicy`` or ``CnnPolicy``),
        ``policy_kwargs`` as the Python expression rl-zoo3 evaluates (``dict(net_arch=[64, 64],
        activation_fn=nn.Tanh, ...)``), ``normalize`` when the recipe normalises (``true``, or
        ``"dict(norm_obs=..., norm_reward=..., clip_obs=...)"`` when not both with clip 10), and the
        backend's hyperparameters under SB3's names: a linear schedule to 0 is ``lin_<initial>``
        (rl-zoo3's ``SimpleLinearSchedule``: ``initial * progress_remaining``), a constant a float;
        a None (SB3's default) is left out, as rl-zoo3 rejects ``clip_range_vf: null``.
    """
    from gradlab.contracts.recipe import LinearSchedule

    cfg = train.backend.typed_config()
    hp: dict[str, Any] = {"n_envs": environment.n_envs, "n_timesteps": train.timesteps}
    for key in type(cfg).model_fields:
        value = getattr(cfg, key)
        if key in _GRADLAB_ONLY or value is None:
            continue
        if isinstance(value, LinearSchedule):
            where = f"train.backend.config.{key}"
            if key not in _ZOO_SCHEDULES:
                return {}, f"{where}: rl-zoo3 takes a schedule only for {', '.join(_ZOO_SCHEDULES)}"
            if value.final != 0.0:
                return {}, f"{where}: linear from {value.initial} to {value.final}, but rl-zoo3's lin_<initial> ends at 0"
            value = f"lin_{float(value.initial)!r}"
        hp[key] = value
    pm = train.policy_model
    cnn = pm.extractor == "nature_cnn" or (pm.extractor == "auto" and image)
    hp["policy"] = "CnnPolicy" if cnn else "MlpPolicy"
    activation = {"tanh": "nn.Tanh", "relu": "nn.ReLU"}[pm.activation]  # rl-zoo3 evaluates with torch.nn as nn
    kwargs = [f"net_arch={pm.net_arch!r}", f"activation_fn={activation}", f"ortho_init={pm.ortho_init}",
              f"share_features_extractor={pm.share_features_extractor}"]
    if cnn:
        kwargs.append(f"features_extractor_kwargs=dict(features_dim={pm.features_dim})")
    hp["policy_kwargs"] = f"dict({', '.join(kwargs)})"
    norm = train.normalize
    if norm.observation or norm.reward:  # rl-zoo3 adds gamma=hp["gamma"] itself, as gradlab does
        plain = norm.observation and norm.reward and norm.clip_observation == 10.0
        hp["normalize"] = True if plain else (f"dict(norm_obs={norm.observation}, norm_reward={norm.reward}, "
                                              f"clip_obs={float(norm.clip_observation)!r})")
    return hp, None


def _spaces(environment: EnvironmentSpec) -> tuple[Any, Any]:
    """(single observation space, single action space) of one lane of ``environment``."""
    from gradlab.envs import make_vector_env

    probe = make_vector_env(environment.model_copy(update={"n_envs": 1}), seed=0)
    try:
        return probe.single_observation_space, probe.single_action_space
    finally:
        probe.close()


def write_vecnormalize(environment: EnvironmentSpec, stats: dict[str, Any] | None, path: Path) -> None:
    """Write SB3's ``vecnormalize.pkl`` with ``stats`` (the checkpoint's ``vecnormalize.json``).

    ``stats`` None writes a pass-through one: ``norm_obs`` and ``norm_reward`` false, SB3's initial
    statistics (for rl-zoo3's hub loader, which needs the file; :mod:`gradlab.share.zoo_repo`).
    """
    import numpy as np
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    obs_space, act_space = _spaces(environment)
    import gymnasium as gym

    class _Spaces(gym.Env):
        def __init__(self) -> None:
            self.observation_space, self.action_space = obs_space, act_space

    if stats is None:
        vn = VecNormalize(DummyVecEnv([_Spaces]), norm_obs=False, norm_reward=False)
        vn.training = False
        vn.save(str(path))
        return
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


#: Backend id -> the SB3 algorithm its ``policy.zip`` loads with (both PPO backends write an SB3 PPO zip).
SB3_ALGORITHMS = {"sb3.ppo": "ppo", "sb3.a2c": "a2c", "gradlab.ppo": "ppo"}


def rl_zoo_files(spec: Any, *, checkpoint_run_id: str) -> tuple[dict[str, str], str | None]:
    """The files rl-zoo3 saves beside a trained model, for a run spec, or why it cannot play the run.

    Args:
        spec: the run's :class:`~gradlab.contracts.run_spec.RunSpec`.
        checkpoint_run_id: the run id named in ``hyperparams.yml``'s header comment.

    Returns:
        ({name: text}, None) with ``config.yml`` (as rl-zoo3's ``ExperimentManager._save_config``
        writes it: ``yaml.dump`` of a key-sorted ``OrderedDict``), ``hyperparams.yml`` (the same as a
        ``--conf-file``), ``args.yml`` (algo, env, seed, env_kwargs, n_timesteps) and
        ``env_kwargs.yml``; or ({}, why) when rl-zoo3 cannot build the goal's episodes
        (:func:`rl_zoo_problem`) or express the recipe (:func:`rl_zoo_hyperparameters`).
    """
    import yaml

    env, train = spec.environment, spec.recipe.train
    why = rl_zoo_problem(env)
    if why is not None:
        return {}, why
    from stable_baselines3.common.preprocessing import is_image_space

    image = train.policy_model.extractor == "auto" and is_image_space(_spaces(env)[0], check_channels=False)
    hyperparams, why = rl_zoo_hyperparameters(train, env, image=image)
    if why is not None:
        return {}, why
    algo = SB3_ALGORITHMS[train.backend.id]
    args = {"algo": algo, "env": env.env_id, "seed": spec.seed, "env_kwargs": dict(env.provider_args) or None,
            "n_timesteps": train.timesteps}
    return {
        "config.yml": yaml.dump(OrderedDict(sorted(hyperparams.items()))),
        "hyperparams.yml": (f"# rl-zoo3 hyperparameters of gradlab run {checkpoint_run_id} ({spec.goal_id}/{spec.recipe_id}), "
                            f"its hyperparams/{algo}.yml form:\n# python -m rl_zoo3.train --algo {algo} --env {env.env_id} "
                            f"--conf-file <this file>\n" + yaml.safe_dump({env.env_id: hyperparams}, sort_keys=True)),
        "args.yml": yaml.safe_dump(args, sort_keys=True),
        "env_kwargs.yml": yaml.safe_dump(dict(env.provider_args), sort_keys=True),
    }, None


def export_checkpoint(checkpoint: Path, spec: Any, out: Path, *, fmt: str,
                      force: bool = False) -> tuple[str, list[Path]]:
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
        (format written, files written).

    Raises:
        IntegrityError: the checkpoint fails verification. ContractViolation: an unknown format,
        a backend without an SB3 zip, ``out`` is a file, the destination is taken (above), or
        ``rl-zoo`` for a goal rl-zoo3 cannot play or a recipe it cannot express (the message says
        why and to use ``--format sb3``); nothing is written then.
    """
    from gradlab.checkpoints import file_sha256, verify_checkpoint

    if fmt not in ("rl-zoo", "sb3"):
        raise ContractViolation(f"--format: expected rl-zoo or sb3, found {fmt!r}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ContractViolation(f"--out {out}: expected a folder, found a file")
    manifest = verify_checkpoint(checkpoint)
    algo = SB3_ALGORITHMS.get(manifest.backend_id)
    if algo is None:
        raise ContractViolation(f"{checkpoint}: backend {manifest.backend_id} has no stable-baselines3 zip to export")
    env = spec.environment
    train = spec.recipe.train
    stats_file = Path(checkpoint) / "resume" / "vecnormalize.json"
    stats = json.loads(stats_file.read_text()) if stats_file.is_file() else None
    if (train.normalize.observation or train.normalize.reward) and stats is None:
        raise ContractViolation(f"{stats_file}: missing, but the recipe normalises (the export would play without it)")
    if fmt == "rl-zoo":
        zoo, why = rl_zoo_files(spec, checkpoint_run_id=manifest.run_id)
        if why is not None:
            raise ContractViolation(f"--format rl-zoo: rl-zoo3 cannot play goal {spec.goal_id} "
                                    f"({env.provider}:{env.env_id}): {why}; nothing written; use --format sb3 (the "
                                    f"stable-baselines3 zip; gradlab.make_env({spec.goal_id!r}) builds the goal's env for it)")
        run_folder = out / algo / f"{env.env_id}_1"
        if run_folder.exists():
            if not force:
                raise ContractViolation(f"--out {out}: {run_folder} exists (an earlier export); pass --force to "
                                        "replace it")
            shutil.rmtree(run_folder)
        meta = run_folder / env.env_id
        meta.mkdir(parents=True, exist_ok=True)
        zip_path = run_folder / f"{env.env_id}.zip"
        files = []
        for name in ("config.yml", "hyperparams.yml", "args.yml", "env_kwargs.yml"):
            (meta / name).write_text(zoo[name])
            files.append(meta / name)
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
        files = []
        vec_path = out / "vecnormalize.pkl"
    shutil.copyfile(Path(checkpoint) / "policy.zip", zip_path)
    paths = [zip_path, *files]
    if stats is not None:
        write_vecnormalize(env, stats, vec_path)
        paths.append(vec_path)
    provenance = {
        "format": "gradlab.export/1", "layout": fmt, "run_id": manifest.run_id, "step": manifest.step,
        "checkpoint_sha256": manifest.sha256, "goal_id": spec.goal_id, "recipe_id": spec.recipe_id,
        "env_id": env.env_id, "algorithm": algo, **spec.hashes,
        "files": {p.relative_to(out).as_posix(): file_sha256(p) for p in paths},
    }
    (out / "gradlab_export.json").write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")
    return fmt, [*paths, out / "gradlab_export.json"]
