"""Writing and verifying checkpoint folders.

A checkpoint is written into ``checkpoints/.partial-<step>-<nonce>/``; every file is fsynced, the
manifest (sha256 and size of every file) written and fsynced, then the folder is renamed to
``checkpoints/<step:012d>-<sha16>/`` and the parent folder fsynced. A crash at any point leaves
either no checkpoint or a complete one; leftover ``.partial-*`` folders are ignored by readers
and removed by the next writer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import secrets
import shutil
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gradlab.checkpoints.manifest import (
    BUNDLE_FILES,
    MANIFEST_FILE,
    POLICY_FILE,
    CheckpointManifest,
    FileEntry,
    checkpoint_dir_name,
    is_bundle_file,
)
from gradlab.errors import Conflict, IntegrityError, NotFound
from gradlab.fsync import fsync_dir
from gradlab.version import __version__

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
_DIR_RE = re.compile(r"^(\d{12})-([0-9a-f]{16})$")
_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)



def versions(provider: str | None = None) -> dict[str, str]:
    """Versions recorded in a manifest: gradlab, python, torch, SB3, gymnasium, numpy, provider."""
    from importlib import metadata

    out = {"gradlab": __version__, "python": platform.python_version()}
    for dist in ("torch", "stable-baselines3", "gymnasium", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    if provider:
        dist = {"ale": "ale-py", "vizdoom": "vizdoom", "retro": "stable-retro", "gymnasium": "gymnasium",
                "gradlab": "gradlab"}.get(provider)
        version = None
        if dist:
            try:
                version = metadata.version(dist)
            except metadata.PackageNotFoundError:
                version = None
        out[f"provider:{provider}"] = version or "unknown"
    return out


def write_checkpoint(
    checkpoints_dir: Path,
    *,
    step: int,
    write_files: Callable[[Path], None],
    manifest_fields: dict,
) -> tuple[Path, CheckpointManifest]:
    """Write one checkpoint atomically.

    Args:
        checkpoints_dir: ``<run_dir>/checkpoints``; created if missing.
        step: env steps at the checkpoint.
        write_files: called with the partial folder; writes ``policy.zip`` and every other file.
        manifest_fields: the manifest's remaining fields (run_id, purpose, hashes, backend_id,
            backend_config_sha256, versions); ``step``, ``sha256``, ``files`` and ``created_at``
            are filled here.

    Returns:
        (final folder, manifest).

    Raises:
        NotFound: ``write_files`` wrote no ``policy.zip``.
        Conflict: a different checkpoint with the same folder name already exists.
    """
    checkpoints_dir.mkdir(parents=True, exist_ok=True)
    for stale in checkpoints_dir.glob(".partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    partial = checkpoints_dir / f".partial-{step:012d}-{secrets.token_hex(4)}"
    partial.mkdir()
    try:
        write_files(partial)
        if not (partial / POLICY_FILE).is_file():
            raise NotFound(f"{partial}: the backend wrote no {POLICY_FILE}")
        files: dict[str, FileEntry] = {}
        for path in sorted(p for p in partial.rglob("*") if p.is_file()):
            rel = path.relative_to(partial).as_posix()
            if rel == MANIFEST_FILE:
                continue
            _fsync_file(path)
            files[rel] = FileEntry(sha256=file_sha256(path), size_bytes=path.stat().st_size)
        for folder in sorted({p.parent for p in partial.rglob("*")} | {partial}, key=lambda p: -len(p.parts)):
            fsync_dir(folder)
        manifest = CheckpointManifest(
            step=step, sha256=files[POLICY_FILE].sha256, files=files,
            created_at=datetime.now(UTC).isoformat(), **manifest_fields,
        )
        manifest_path = partial / MANIFEST_FILE
        manifest_path.write_text(json.dumps(manifest.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
        _fsync_file(manifest_path)
        fsync_dir(partial)
        final = checkpoints_dir / manifest.dir_name
        if final.exists():
            raise Conflict(f"{final}: a checkpoint with this step and policy hash already exists")
        os.rename(partial, final)
        fsync_dir(checkpoints_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    logger.info("checkpoint %s written (%d files, %d bytes)", final, len(files), manifest.size_bytes)
    return final, manifest


def read_manifest(path: Path) -> CheckpointManifest:
    """Parse ``<path>/manifest.json`` without checking file hashes.

    Raises:
        NotFound: no checkpoint folder or no manifest there.
        IntegrityError: the manifest is not valid JSON or does not match the manifest schema.
    """
    path = Path(path)
    mpath = path / MANIFEST_FILE
    if not mpath.is_file():
        raise NotFound(f"{path}: not a checkpoint (no {MANIFEST_FILE})")
    try:
        return CheckpointManifest.model_validate_json(mpath.read_bytes())
    except ValidationError as e:
        raise IntegrityError(f"{mpath}: not a valid checkpoint manifest: {e.errors(include_url=False)[0]['msg']}") from None


def verify_checkpoint(path: Path) -> CheckpointManifest:
    """Check every file of a checkpoint against its manifest before anything is loaded.

    Checks: the manifest parses; every listed file exists with its size and sha256; no unlisted
    file is present; the manifest's ``sha256`` is the policy file's; the folder name is
    ``<step:012d>-<sha16>`` of the manifest (when it has that form).

    Returns:
        The manifest.

    Raises:
        NotFound: no such checkpoint.
        IntegrityError: the first mismatch, naming the file, the expected and the found value.
    """
    path = Path(path)
    manifest = read_manifest(path)
    for rel, entry in sorted(manifest.files.items()):
        fpath = path / rel
        if not fpath.is_file():
            raise IntegrityError(f"{fpath}: listed in the manifest but missing")
        size = fpath.stat().st_size
        if size != entry.size_bytes:
            raise IntegrityError(f"{fpath}: size expected {entry.size_bytes} bytes, found {size}")
        digest = file_sha256(fpath)
        if digest != entry.sha256:
            raise IntegrityError(f"{fpath}: sha256 expected {entry.sha256}, found {digest}")
    present = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {MANIFEST_FILE}
    extra = sorted(present - set(manifest.files))
    if extra:
        raise IntegrityError(f"{path / extra[0]}: file not listed in the manifest")
    policy = manifest.files.get(manifest.policy_file)
    if policy is None or policy.sha256 != manifest.sha256:
        raise IntegrityError(f"{path / MANIFEST_FILE}: sha256 {manifest.sha256} is not the hash of {manifest.policy_file}")
    m = _DIR_RE.match(path.name)
    if m and path.name != checkpoint_dir_name(manifest.step, manifest.sha256):
        raise IntegrityError(f"{path}: folder name expected {manifest.dir_name} (manifest step and sha256), "
                             f"found {path.name}")
    return manifest


def check_bundle_files(path: Path) -> list[str]:
    """The files of a checkpoint folder, each checked to be one of the bundle's schema
    (:data:`gradlab.checkpoints.manifest.BUNDLE_FILES` and ``manifest.json``): what a publication of
    it may upload. Symlinks and anything else planted there are refused, whatever the manifest lists.

    Returns:
        The relative POSIX paths of its files, sorted.

    Raises:
        IntegrityError: a file (or link) outside the schema, named.
    """
    path = Path(path)
    names = []
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path).as_posix()
        if p.is_symlink() or (p.is_file() and not is_bundle_file(rel)):
            raise IntegrityError(f"{p}: not a file a checkpoint holds (the bundle's files: "
                                 f"{', '.join(sorted(BUNDLE_FILES))}, resume/states/<sha256>.bin); "
                                 "refusing to publish the folder")
        if p.is_file():
            names.append(rel)
    return names


def verify_against_publication(path: Path, files: Mapping[str, Any], *, what: str = "publication") -> CheckpointManifest:
    """Check a checkpoint folder byte for byte against its publication receipt's file list.

    The receipt (control store) is the authority, not the folder's own ``manifest.json``: every
    file of the folder, ``manifest.json`` included, must be listed with its sha256 and size, and
    every listed file must be present. Then the manifest's own checks run
    (:func:`verify_checkpoint`).

    Args:
        path: the checkpoint folder.
        files: the publication's ``files`` (relative POSIX path → an object with ``sha256`` and
            ``size_bytes``, e.g. :class:`gradlab.receipts.models.FileEntry`).
        what: how errors name the authority.

    Returns:
        The manifest.

    Raises:
        NotFound: no such checkpoint.
        IntegrityError: the first difference, naming the file and both hashes (or what is missing
            or extra).
    """
    path = Path(path)
    if not path.is_dir():
        raise NotFound(f"{path}: no checkpoint folder")
    present = {p.relative_to(path).as_posix(): p for p in sorted(path.rglob("*")) if p.is_file()}
    # The manifest last: a rewritten manifest is named only when no data file differs.
    for rel, entry in sorted(files.items(), key=lambda kv: (kv[0] == MANIFEST_FILE, kv[0])):
        fpath = present.get(rel)
        if fpath is None:
            raise IntegrityError(f"{path / rel}: listed in the {what} but missing")
        digest = file_sha256(fpath)
        if digest != entry.sha256:
            raise IntegrityError(f"{fpath}: sha256 expected {entry.sha256} ({what}), found {digest}")
    extra = sorted(set(present) - set(files))
    if extra:
        raise IntegrityError(f"{path / extra[0]}: file not listed in the {what}")
    return verify_checkpoint(path)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint folders of a run, by step (``.partial-*`` folders are skipped)."""
    folder = Path(run_dir) / CHECKPOINTS_DIR
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and _DIR_RE.match(p.name) and (p / MANIFEST_FILE).is_file()]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The highest-step complete checkpoint of a run (verified), or None."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(path)
        except IntegrityError as e:
            logger.warning("skipping checkpoint that fails verification: %s", e)
            continue
        return path
    return None
