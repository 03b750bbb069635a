"""The checkpoint manifest: what a checkpoint holds and the hashes it was made under."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MANIFEST_FILE = "manifest.json"
POLICY_FILE = "policy.zip"
WEIGHTS_FILE = "policy.safetensors"
POLICY_SPEC_FILE = "policy_spec.json"
RESUME_DIR = "resume"
#: The bundle's schema: every file a checkpoint may hold besides ``manifest.json``, whichever backend
#: wrote it (docs/ARCHITECTURE.md section 6): the SB3 zip, the weights-only policy, and the resume
#: state (counters and RNG streams, the optimizer as torch's weights-only file or safetensors,
#: normalisation and early-stop statistics, the lane state).
BUNDLE_FILES = frozenset({
    POLICY_FILE, WEIGHTS_FILE, POLICY_SPEC_FILE,
    *(f"{RESUME_DIR}/{name}" for name in ("state.json", "optimizer.pt", "optimizer.safetensors", "vecnormalize.json",
                                          "early_stop.json", "lanes.json", "lanes.npz", "last_obs.npy",
                                          # the search backends' and the archive curriculum's state
                                          # (docs/ARCHITECTURE.md section 12a)
                                          "search.json", "archive.json", "curriculum.json")),
})
#: The one family of names beside :data:`BUNDLE_FILES`: provider state blobs, named by their sha256.
BUNDLE_BLOB = re.compile(rf"^{RESUME_DIR}/states/[0-9a-f]{{64}}\.bin$")


def is_bundle_file(name: str) -> bool:
    """Whether a checkpoint folder may hold ``name`` (a relative POSIX path): one of
    :data:`BUNDLE_FILES`, ``manifest.json`` or a state blob ``resume/states/<sha256>.bin``."""
    return name in BUNDLE_FILES or name == MANIFEST_FILE or BUNDLE_BLOB.match(name) is not None


class FileEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size_bytes: int = Field(ge=0)


class CheckpointManifest(BaseModel):
    """``manifest.json`` of a checkpoint (docs/ARCHITECTURE.md section 6).

    ``sha256`` is the checkpoint's identity: the sha256 of the policy file (``policy.zip`` for sb3
    backends). ``files`` maps every other file's POSIX path inside the checkpoint folder
    (``resume/state.json``...) to its sha256 and size; ``manifest.json`` itself is not listed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["gradlab.checkpoint/1"] = "gradlab.checkpoint/1"
    run_id: str
    step: int = Field(ge=0, description="Env steps (num_timesteps) at the checkpoint.")
    purpose: Literal["periodic", "final"]
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the policy file.")
    policy_file: str = POLICY_FILE
    files: dict[str, FileEntry]
    goal_contract_sha256: str
    recipe_sha256: str
    environment_sha256: str
    backend_id: str
    backend_config_sha256: str
    versions: dict[str, str]
    created_at: str
    init_from_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$",
                                         description="A warm-started run's parent checkpoint sha256 (lineage).")

    @property
    def sha16(self) -> str:
        return self.sha256[:16]

    @property
    def dir_name(self) -> str:
        return checkpoint_dir_name(self.step, self.sha256)

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files.values())


def checkpoint_dir_name(step: int, sha256: str) -> str:
    """``<step:012d>-<sha16>``: the step zero-padded to 12 digits so names sort by step."""
    return f"{step:012d}-{sha256[:16]}"
