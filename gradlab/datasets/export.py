"""``gradlab dataset export``: a dataset in other tools' layouts, read from a verified local copy.

* **Minari** (``minari`` on PyPI): one Minari dataset ``gradlab/<name>-v0`` under ``--out`` (Minari's
  ``MINARI_DATASETS_PATH``), built with ``minari.create_dataset_from_buffers``: per episode its
  seed, observations ``(T + 1, ...)``, actions ``(T, ...)``, shaped rewards, terminations and
  truncations; the observation and action spaces of the recording; the agent as ``algorithm_name``
  and the provenance in its description. ``minari.load_dataset(id)`` reads it (with
  ``MINARI_DATASETS_PATH`` set to the folder). ``env_spec`` (what ``recover_environment()`` makes) is
  filled when the recorded environment is a plain gymnasium one (:func:`minari_env_spec`): provider
  ``gymnasium``, no observation preprocessing, the goal's episode cap as ``max_episode_steps``. For
  any other goal it is left empty and the description says why: the env is not registered in
  gymnasium (the built-in ``gradlab`` provider, ``vizdoom``, ``retro``), or gradlab's preprocessing
  (ALE's, frame stacks, normalised observations) makes the policy's observations other than what
  the registered env returns. The task program's reward and termination rules are gradlab's: a
  recovered env gives the provider's native rewards.
* **Hugging Face datasets**: a folder ``data/train-00000-of-00001.parquet`` (one row per step, the
  column names of the ``gymrec`` package's datasets: ``episode_id`` (16 bytes), ``seed``,
  ``observations``, ``actions``, ``rewards``, ``terminations``, ``truncations``, ``infos``,
  ``collector``, plus gradlab's ``episode_index``, ``step``, ``raw_rewards``; ``infos`` is JSON with
  the step's fired ``events`` and, under an action profile, the ``native_action``), ``README.md`` (the
  dataset card, :func:`gradlab.datasets.hub.dataset_card`) and ``gradlab_manifest.json``;
  ``datasets.load_dataset(folder)`` reads it. gymrec stores rendered frames as images in
  ``observations``; gradlab's observations are the policy's arrays (frames stay MP4 files).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.contracts.dataset import DatasetManifest
from gradlab.datasets.store import load_steps
from gradlab.errors import ConfigError

FORMATS = ("minari", "hf")
HF_SHARD = "data/train-00000-of-00001.parquet"


def minari_id(manifest: DatasetManifest) -> str:
    return f"gradlab/{manifest.name}-v0"


def episode_uuid(manifest: DatasetManifest, index: int) -> bytes:
    """A stable 16-byte episode id: uuid5 of the dataset's sha256 and the episode index."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"gradlab-dataset:{manifest.sha256}:{index}").bytes


def minari_env_spec(manifest: DatasetManifest) -> tuple[Any, str | None]:
    """The gymnasium ``EnvSpec`` a Minari dataset of ``manifest`` can recover, or None and why not.

    Returns:
        ``(EnvSpec, None)`` for a plain gymnasium env (see the module docstring), else ``(None, reason)``.
    """
    import dataclasses

    import gymnasium as gym

    from gradlab.contracts.environment import EnvironmentSpec

    env = EnvironmentSpec.model_validate(manifest.environment)
    if env.provider != "gymnasium":
        return None, (f"provider {env.provider!r}: {env.env_id} is made by gradlab's {env.provider} provider, "
                      "not registered in gymnasium, so no env_spec")
    if env.preprocessing.get("frame_stack", 1) != 1 or env.preprocessing.get("normalize_observation", False):
        return None, (f"{env.env_id}: the recorded observations went through gradlab's preprocessing "
                      f"{env.preprocessing}, which the registered env does not apply, so no env_spec")
    try:
        spec = gym.spec(env.env_id)
    except gym.error.Error as e:
        return None, f"{env.env_id}: not registered in gymnasium ({e}), so no env_spec"
    args = dict(env.provider_args)
    cap = env.task.termination.max_episode_steps or args.pop("max_episode_steps", None) or spec.max_episode_steps
    args.pop("max_episode_steps", None)
    return dataclasses.replace(spec, kwargs={**spec.kwargs, **args}, max_episode_steps=cap), None


def export_minari(manifest: DatasetManifest, folder: Path, out: Path) -> str:
    """Write the Minari dataset under ``out``; returns its dataset id.

    Raises:
        ConfigError: a Minari dataset of that id is already in ``out``.
    """
    from gradlab.datasets.plan import space_from_json

    out = Path(out).resolve()
    dataset_id = minari_id(manifest)
    if (out / dataset_id).exists():
        raise ConfigError(f"{out / dataset_id}: a Minari dataset {dataset_id} exists already (choose another --out)")
    import minari
    from minari.data_collector import EpisodeBuffer

    buffers = []
    for episode in manifest.episodes:
        steps = load_steps(folder, episode)
        buffers.append(EpisodeBuffer(id=episode.index, seed=episode.seed, observations=steps["observations"],
                                     actions=steps["actions"], rewards=steps["rewards"].astype(np.float64).tolist(),
                                     terminations=steps["terminated"].tolist(), truncations=steps["truncated"].tolist()))
    agent = manifest.agent
    env_spec, no_spec = minari_env_spec(manifest)
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(out)
    try:
        minari.create_dataset_from_buffers(
            dataset_id=dataset_id, buffer=buffers, env=env_spec, algorithm_name=f"gradlab:{agent.kind}",
            author="gradlab", code_permalink=None,
            observation_space=space_from_json(manifest.observation_space),
            action_space=space_from_json(manifest.action_space),
            description=f"gradlab dataset {manifest.name} ({manifest.sha256}) of goal {manifest.goal_id}: "
                        + json.dumps({"agent": agent.model_dump(mode="json"), "environment_sha256": manifest.environment_sha256,
                                      "goal_contract_sha256": manifest.goal_contract_sha256}, sort_keys=True)
                        + (f". No env_spec: {no_spec}." if no_spec else ""),
            data_format="hdf5",
        )
    finally:
        if old is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = old
    return dataset_id


def hf_columns(manifest: DatasetManifest, folder: Path) -> dict[str, list[Any]]:
    """One row per step (see the module docstring)."""
    cols: dict[str, list[Any]] = {k: [] for k in (
        "episode_id", "episode_index", "seed", "step", "observations", "actions", "rewards", "raw_rewards",
        "terminations", "truncations", "infos", "collector", "gradlab_version")}
    version = manifest.versions.get("gradlab", "unknown")
    for episode in manifest.episodes:
        steps = load_steps(folder, episode)
        names = [str(n) for n in steps["event_names"]]
        eid = episode_uuid(manifest, episode.index)
        for t in range(episode.length):
            cols["episode_id"].append(eid)
            cols["episode_index"].append(episode.index)
            cols["seed"].append(episode.seed)
            cols["step"].append(t)
            cols["observations"].append(np.asarray(steps["observations"][t]).tolist())
            cols["actions"].append(np.asarray(steps["actions"][t]).tolist())
            cols["rewards"].append(float(steps["rewards"][t]))
            cols["raw_rewards"].append(float(steps["raw_rewards"][t]))
            cols["terminations"].append(bool(steps["terminated"][t]))
            cols["truncations"].append(bool(steps["truncated"][t]))
            fired = [n for n, on in zip(names, steps["events"][t], strict=True) if on]
            info: dict[str, Any] = {"events": fired}
            if "native_actions" in steps:  # an action profile: what the provider was sent
                info["native_action"] = np.asarray(steps["native_actions"][t]).tolist()
            cols["infos"].append(json.dumps(info))
            cols["collector"].append(f"gradlab:{manifest.agent.kind}")
            cols["gradlab_version"].append(version)
    return cols


def export_hf(manifest: DatasetManifest, folder: Path, out: Path, *, summary: dict[str, Any]) -> Path:
    """Write the Hugging Face dataset folder ``out`` (created; must be absent or empty); returns it.

    Raises:
        ConfigError: ``out`` exists and is not an empty folder.
    """
    import shutil

    from datasets import Dataset

    from gradlab.datasets.hub import dataset_card

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: expected a new or empty folder")
    columns = hf_columns(manifest, folder)  # reads every episode first: a bad one writes nothing
    existed = out.exists()
    try:
        (out / "data").mkdir(parents=True, exist_ok=True)
        Dataset.from_dict(columns).to_parquet(str(out / HF_SHARD))
        (out / "gradlab_manifest.json").write_text(json.dumps(manifest.as_json(), sort_keys=True, indent=1))
        (out / "README.md").write_text(dataset_card(manifest, summary))
    except BaseException:
        if existed:  # it was empty: leave it empty
            for child in out.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        else:
            shutil.rmtree(out, ignore_errors=True)
        raise
    return out
