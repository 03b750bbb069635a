"""The dataset store: publishing a recording, reading a dataset back, checking its files.

Layout (``gradlab.stores.keys``): a recording's files (one step shard per chunk,
:mod:`gradlab.datasets.shard`, and one MP4 per episode with frames) go create-only (and verified:
re-read and hashed) under ``datasets/<name>/recordings/<recording_id>/``; the manifest is written last,
create-only, at ``datasets/<name>/manifest.json``. A dataset exists once its manifest does, so a
recording killed at any point leaves no dataset (only unreferenced files under its own recording
id), and a retry, a new recording id, writes beside them. Reads trust nothing: every file is checked
against the manifest's sha256 before it is opened (``np.load(..., allow_pickle=False)`` only).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gradlab.contracts.dataset import DatasetEpisode, DatasetFile, DatasetManifest
from gradlab.datasets.plan import ChunkResult, RecordingPlan
from gradlab.errors import Conflict, ContractViolation, IntegrityError, NotFound
from gradlab.stores import ObjectStore, keys, sha256_hex


def dataset_exists(store: ObjectStore, name: str) -> bool:
    return store.exists(keys.dataset_manifest(name))


def check_exactly_once(plan: RecordingPlan, results: Sequence[ChunkResult]) -> list[dict[str, Any]]:
    """Every planned episode in exactly one chunk's rows, with its planned seed and start.

    Returns:
        The rows, sorted by index.

    Raises:
        ContractViolation: an episode missing, repeated, or recorded with another seed/start than planned.
    """
    planned = {e.index: e for e in plan.episodes}
    seen: dict[int, int] = {}
    rows = []
    for result in results:
        for row in result.rows:
            index = int(row["index"])
            if index in seen:
                raise ContractViolation(f"dataset {plan.name}: episode {index} recorded twice "
                                        f"(chunks {seen[index]} and {result.chunk})")
            ident = planned.get(index)
            if ident is None or (row["seed"], row.get("start")) != (ident.seed, ident.start):
                raise ContractViolation(f"dataset {plan.name}: episode {index} is not the planned one")
            seen[index] = result.chunk
            rows.append(row)
    missing = sorted(set(planned) - set(seen))
    if missing:
        raise ContractViolation(f"dataset {plan.name}: {len(missing)} planned episodes were not recorded "
                                f"(first: {missing[:5]})")
    return sorted(rows, key=lambda r: r["index"])


def publish_dataset(store: ObjectStore, plan: RecordingPlan, results: Sequence[ChunkResult], *,
                    created_at: str, cleanup: bool = True) -> DatasetManifest:
    """Store a finished recording: its files (verified), then its manifest (create-only, last).

    Raises:
        ContractViolation: the chunks did not record every planned episode exactly once.
        IntegrityError: a staged file differs from what its chunk reported.
        Conflict: a dataset of that name exists already.
    """
    from gradlab.checkpoints.bundle import versions
    from gradlab.contracts.environment import EnvironmentSpec
    from gradlab.contracts.experiments import environment_sha256, goal_contract_sha256
    from gradlab.contracts.goal import Goal
    from gradlab.contracts.hashing import sha256_json

    if dataset_exists(store, plan.name):
        raise Conflict(f"{store.url(keys.dataset_manifest(plan.name))}: dataset {plan.name!r} exists already "
                       "(datasets are immutable: record under another name)")
    rows = check_exactly_once(plan, results)
    files: dict[str, DatasetFile] = {}
    written: dict[int, list[str | None]] = {}
    offsets: dict[int, list[int]] = {}
    for result in results:
        for rel, entry in sorted(result.files.items()):
            data = (Path(result.folder) / rel).read_bytes()
            if sha256_hex(data) != entry["sha256"]:
                raise IntegrityError(f"{Path(result.folder) / rel}: changed since its chunk recorded it")
            store.put_verified(keys.dataset_file(plan.name, plan.recording_id, rel), data)
            files[rel] = DatasetFile(sha256=entry["sha256"], size_bytes=len(data))
        written.update({int(i): w for i, w in result.written.items()})
        offsets.update({int(i): o for i, o in result.offsets.items()})
    goal = Goal.model_validate(plan.goal)
    environment = EnvironmentSpec.model_validate(plan.environment)
    episodes = [DatasetEpisode(index=r["index"], seed=r["seed"], start=r.get("start"), return_=r["return"],
                               raw_return=r["raw_return"], length=r["length"], outcome=r["outcome"], reason=r["reason"],
                               steps_file=written[r["index"]][0], step_offset=offsets[r["index"]][0],
                               observation_offset=offsets[r["index"]][1], frames_file=written[r["index"]][1])
                for r in rows]
    manifest = DatasetManifest(
        name=plan.name, recording_id=plan.recording_id, goal_id=goal.goal_id, goal=plan.goal,
        environment=plan.environment, goal_contract_sha256=goal_contract_sha256(goal),
        environment_sha256=environment_sha256(environment),
        episode_plan_sha256=sha256_json([e.model_dump(mode="json") for e in plan.episodes]),
        determinism=plan.determinism, agent=plan.agent, episodes=episodes, frames=plan.frames,
        observation_space=results[0].spaces["observation"], action_space=results[0].spaces["action"],
        native_action_space=results[0].spaces.get("native_action"), files=files, versions=versions(environment.provider), created_at=created_at,
    )
    body = json.dumps(manifest.as_json(), sort_keys=True, separators=(",", ":")).encode()
    try:
        store.put_create_only(keys.dataset_manifest(plan.name), body)
    except Conflict:
        raise Conflict(f"{store.url(keys.dataset_manifest(plan.name))}: another recording stored dataset "
                       f"{plan.name!r} first") from None
    if cleanup:
        shutil.rmtree(plan.staging_dir, ignore_errors=True)
    return manifest


def read_dataset(store: ObjectStore, name: str) -> DatasetManifest:
    """The dataset's manifest.

    Raises:
        NotFound: no dataset of that name (naming where it was looked for).
        ContractViolation: the manifest is not a dataset manifest (naming the first bad key path).
    """
    from pydantic import ValidationError

    key = keys.dataset_manifest(name)
    try:
        raw = store.get(key)
    except NotFound:
        raise NotFound(f"dataset {name!r}: no {store.url(key)} (see `gradlab dataset list`)") from None
    try:
        manifest = DatasetManifest.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as e:
        first = e.errors()[0] if isinstance(e, ValidationError) else {"loc": (), "msg": str(e)}
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise ContractViolation(f"{store.url(key)}: {where}: {first['msg']}") from None
    if manifest.name != name:  # a copied manifest would name (and read) another dataset's files
        raise ContractViolation(f"{store.url(key)}: name: expected {name!r} (the dataset's folder), "
                                f"found {manifest.name!r}")
    return manifest


def list_datasets(store: ObjectStore) -> list[str]:
    """Names of the datasets in the store (those with a manifest), sorted."""
    return sorted(k.split("/")[1] for k in store.list("datasets/") if k.count("/") == 2 and k.endswith("/manifest.json"))


def check_files(store: ObjectStore, manifest: DatasetManifest) -> list[str]:
    """Every manifest file against its sha256 and size.

    Returns:
        One problem line per bad file (its URL, expected and found), empty when all check out.
    """
    problems = []
    for rel, entry in sorted(manifest.files.items()):
        key = keys.dataset_file(manifest.name, manifest.recording_id, rel)
        try:
            data = store.get(key)
        except NotFound:
            problems.append(f"{store.url(key)}: listed in the manifest but missing")
            continue
        digest = sha256_hex(data)
        if digest != entry.sha256 or len(data) != entry.size_bytes:
            problems.append(f"{store.url(key)}: sha256 expected {entry.sha256}, found {digest}")
    return problems


def fetch_dataset(store: ObjectStore, manifest: DatasetManifest, cache: Path) -> Path:
    """A local, verified copy of the dataset's files: ``<cache>/<name>/<sha16>/`` (reused while it verifies).

    Raises:
        IntegrityError: a stored file differs from the manifest (naming it).
    """
    from gradlab.checkpoints.bundle import file_sha256

    folder = Path(cache) / manifest.name / manifest.sha256[:16]
    for rel, entry in sorted(manifest.files.items()):
        path = folder / rel
        if path.is_file() and file_sha256(path) == entry.sha256:
            continue
        key = keys.dataset_file(manifest.name, manifest.recording_id, rel)
        data = store.get(key)
        if sha256_hex(data) != entry.sha256:
            raise IntegrityError(f"{store.url(key)}: sha256 expected {entry.sha256}, found {sha256_hex(data)}")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".part")
        tmp.write_bytes(data)
        tmp.replace(path)
    (folder / "manifest.json").write_text(json.dumps(manifest.as_json(), sort_keys=True, indent=1))
    return folder


_SHARDS: list[Any] = []  # the process's ShardCache, made on first use (importing this module imports no numpy)


def load_steps(folder: Path, episode: DatasetEpisode) -> dict[str, Any]:
    """One episode's arrays from a verified local copy (:func:`fetch_dataset`); never unpickles.

    Returns:
        The keys and shapes of :mod:`gradlab.contracts.dataset` for this episode alone (``T`` =
        ``episode.length``): ``actions`` (T, ...), ``rewards``/``raw_rewards`` (T,) float32,
        ``terminated``/``truncated`` (T,) bool, ``events`` (T, E) bool, ``event_names`` (E,) str,
        ``observations`` (T + 1, ...), and ``native_actions`` (T, ...) when the environment has an
        action profile. Format 2 arrays are views into the chunk's shard, which is
        decompressed once while consecutive calls read the same shard; copy before writing to them.

    Raises:
        ContractViolation: the shard holds fewer rows than the episode's offsets and length say.
    """
    from gradlab.datasets.shard import NATIVE_FIELD, STEP_FIELDS, ShardCache

    path = Path(folder) / episode.steps_file
    if not _SHARDS:
        _SHARDS.append(ShardCache())
    arrays = _SHARDS[0].get(path)
    if episode.step_offset is None or episode.observation_offset is None:  # format 1: the episode's own file
        return dict(arrays)
    s, o, n = episode.step_offset, episode.observation_offset, episode.length
    out = {k: arrays[k][s:s + n] for k in (*STEP_FIELDS, NATIVE_FIELD) if k in arrays}
    out["observations"] = arrays["observations"][o:o + n + 1]
    out["event_names"] = arrays["event_names"]
    short = [k for k, v in out.items() if k != "event_names" and len(v) != (n + 1 if k == "observations" else n)]
    if short:
        raise ContractViolation(f"{path}: {', '.join(short)}: episode {episode.index} needs rows "
                                f"{s}..{s + n - 1} (observations {o}..{o + n}), the shard has fewer")
    return out
