"""Immutable, content-addressed checkpoints (docs/ARCHITECTURE.md section 6).

Folder layout: ``<run_dir>/checkpoints/<step:012d>-<sha16>/`` with ``policy.zip`` (SB3),
``policy.safetensors`` + ``policy_spec.json`` (weights only), ``resume/`` (optimizer, RNG
streams, counters, normalisation statistics) and ``manifest.json`` (sha256 and size per file).

Public names:
    verify_checkpoint(path) -> CheckpointManifest: every file's sha256 checked; IntegrityError names the file.
    verify_against_publication(path, files): every file checked against the publication receipt's hashes.
    read_manifest(path) -> CheckpointManifest: the manifest without hash checks.
    load_policy(path) -> Policy: weights-only policy, no unpickling.
    write_checkpoint(...): the atomic writer (``.partial`` → fsync → rename).
    list_checkpoints(run_dir), latest_checkpoint(run_dir): a run's complete checkpoints.
    is_trusted, require_trust, load_sb3_model: trust rules for pickle-based files.
    write_sb3_zip(model, path): the one writer of ``policy.zip`` (self-contained, deterministic).
    CheckpointManifest, Policy, PolicySpec: the models.
    resolve.resolve_checkpoint(ref) -> resolve.ResolvedCheckpoint: the verified local folder and run
        spec that ``RUN_ID[:STEP]`` or a folder names (downloaded from the model store when needed).

Importing this package does not import torch.
"""

from gradlab.checkpoints.bundle import (
    CHECKPOINTS_DIR,
    file_sha256,
    latest_checkpoint,
    list_checkpoints,
    read_manifest,
    verify_against_publication,
    verify_checkpoint,
    write_checkpoint,
)
from gradlab.checkpoints.manifest import CheckpointManifest, FileEntry, checkpoint_dir_name
from gradlab.checkpoints.policy import Policy, PolicySpec, load_policy
from gradlab.checkpoints.sb3zip import write_sb3_zip
from gradlab.checkpoints.trust import is_trusted, load_sb3_model, require_trust

__all__ = [
    "CHECKPOINTS_DIR", "CheckpointManifest", "FileEntry", "Policy", "PolicySpec", "checkpoint_dir_name",
    "file_sha256", "is_trusted", "latest_checkpoint", "list_checkpoints", "load_policy", "load_sb3_model",
    "read_manifest", "require_trust", "verify_against_publication", "verify_checkpoint", "write_checkpoint",
    "write_sb3_zip",
]
