"""The files rl-zoo3's ``push_to_hub`` writes into a Hugging Face repository, for ``gradlab publish``.

``python -m rl_zoo3.load_from_hub --algo ALGO --env ENV -orga OWNER -name NAME -f DIR`` downloads,
by these names (rl_zoo3/load_from_hub.py, 2.9): ``<algo>-<env>.zip`` (huggingface_sb3's
``ModelName.filename``), ``config.yml``, ``vec_normalize.pkl``, ``args.yml``, ``env_kwargs.yml``
and ``train_eval_metrics.zip``, and lays them out as a training run that ``rl_zoo3.enjoy`` plays.
A repository of a goal rl-zoo3 can play (:func:`gradlab.share.export.rl_zoo_files`) holds them
beside gradlab's own evidence, with what else ``push_to_hub`` writes: the zip's members unpacked
under ``<algo>-<env>/`` and huggingface_sb3's ``results.json``.

``vec_normalize.pkl`` is in every such repository: the recipe's statistics when it normalises,
else a pass-through ``VecNormalize`` (``norm_obs`` and ``norm_reward`` false) that ``enjoy`` never
applies (``config.yml`` has no ``normalize``). rl-zoo3 2.9 treats a missing one as "no
normalisation" only for ``requests``' ``HTTPError``, which huggingface_hub 1.0 and later no longer
raise, so without the file its ``load_from_hub`` stops.

``train_eval_metrics.zip`` holds ``evaluations.npz`` in SB3's ``EvalCallback`` form (``timesteps``
(1,) int64, ``results`` and ``ep_lengths`` (1, n_episodes) float64 / int64) of the published
evaluation. Both zips have fixed timestamps, so the bytes depend only on their content.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

from gradlab.checkpoints.sb3zip import ZIP_DATE_TIME

#: rl-zoo3's name for the normalisation statistics in a hub repository (its log folders say vecnormalize.pkl).
VEC_NORMALIZE = "vec_normalize.pkl"
TRAIN_EVAL_METRICS = "train_eval_metrics.zip"


def env_name(env_id: str) -> str:
    """huggingface_sb3's ``EnvironmentName``: ``/`` becomes ``-``, a ``module:`` prefix is dropped.

    Raises:
        ValueError: more than one ``:`` (huggingface_sb3 refuses it too).
    """
    name = env_id.replace("/", "-")
    if ":" in name:
        parts = name.split(":")
        if len(parts) != 2:
            raise ValueError(f"environment id {env_id!r}: more than one ':'")
        name = parts[1]
    return name


def model_name(algo: str, env_id: str) -> str:
    """huggingface_sb3's ``ModelName``: ``<algo>-<env name>`` (the zip is ``<model name>.zip``)."""
    return f"{algo}-{env_name(env_id)}"


def _fixed_zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, mode="w") as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=ZIP_DATE_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            info.create_system = 3
            archive.writestr(info, data)
    return buf.getvalue()


def evaluations_npz(result: Any) -> bytes:
    """SB3 ``EvalCallback``'s ``evaluations.npz`` of one evaluation result (deterministic bytes)."""
    import numpy as np

    arrays = {"timesteps": np.asarray([result.checkpoint_step], dtype=np.int64),
              "results": np.asarray([[row.return_ for row in result.episodes]], dtype=np.float64),
              "ep_lengths": np.asarray([[row.length for row in result.episodes]], dtype=np.int64)}
    members = {}
    for key, array in arrays.items():
        npy = io.BytesIO()
        np.lib.format.write_array(npy, array, allow_pickle=False)
        members[f"{key}.npy"] = npy.getvalue()
    return _fixed_zip(members)


def write_zoo_repo_files(out: Path, *, checkpoint: Path, spec: Any, result: Any, algo: str, created_at: str,
                         stats: dict[str, Any] | None) -> str | None:
    """Write rl-zoo3's repository files into ``out`` (see the module docstring), or say why not.

    Args:
        out: the repository folder (the SB3 zip ``<model name>.zip`` already in it).
        checkpoint: the verified checkpoint folder. spec: its run spec. result: the published
            :class:`~gradlab.evaluation.result.EvalResult`. algo: ``ppo`` or ``a2c``.
        created_at: ISO time for ``results.json``'s ``eval_datetime`` (the checkpoint's: an
            evaluation record holds no clock). stats: the checkpoint's ``vecnormalize.json`` or None.

    Returns:
        None when written; else why rl-zoo3 cannot play the run (nothing written).
    """
    from gradlab.share.export import rl_zoo_files, write_vecnormalize

    files, why = rl_zoo_files(spec, checkpoint_run_id=spec.run_id)
    if why is not None:
        return why
    for name in ("config.yml", "args.yml", "env_kwargs.yml"):
        (out / name).write_text(files[name])
    write_vecnormalize(spec.environment, stats, out / VEC_NORMALIZE)
    (out / TRAIN_EVAL_METRICS).write_bytes(_fixed_zip({"evaluations.npz": evaluations_npz(result)}))
    name = model_name(algo, spec.environment.env_id)
    unpacked = out / name
    unpacked.mkdir()
    with zipfile.ZipFile(Path(checkpoint) / "policy.zip") as archive:  # bytes copied, nothing unpickled
        for member in archive.namelist():
            if "/" in member or member.startswith("."):
                continue
            (unpacked / member).write_bytes(archive.read(member))
    agg = result.aggregates
    (out / "results.json").write_text(json.dumps({
        "mean_reward": agg["eval/episode/return/mean"], "std_reward": agg["eval/episode/return/std"],
        "is_deterministic": result.policy == "deterministic", "n_eval_episodes": result.completed,
        "eval_datetime": created_at}))
    return None
