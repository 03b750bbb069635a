"""Reading a shared repository's files as untrusted input (docs/SECURITY.md, "Shared repositories").

A repository snapshot comes from elsewhere: its ``gradlab.json`` names the files to check, and a
hostile one could name ``../../secret``, an absolute path, or ship a symlink that leaves the
snapshot. :func:`confined` resolves a listed name only inside the snapshot's storage (for
huggingface_hub's cache, the repository's own folder, whose ``blobs/`` its snapshot links into),
refusing anything else by name before it is opened. :func:`read_index` and :func:`read_json`
turn malformed JSON or a missing key into one error naming the file and the key path.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gradlab.errors import IntegrityError

SHA256 = r"^[0-9a-f]{64}$"


class RepoIndex(BaseModel):
    """The keys of ``gradlab.json`` a loader relies on (others are kept as they are)."""

    model_config = ConfigDict(extra="allow")

    format: str
    run_id: str
    goal_id: str
    step: int = Field(ge=0)
    checkpoint_sha256: str = Field(pattern=SHA256)
    goal_contract_sha256: str = Field(pattern=SHA256)
    recipe_sha256: str = Field(pattern=SHA256)
    files: dict[str, str] = Field(description="Relative POSIX path -> sha256 of every other file.")


def storage_root(folder: Path) -> Path:
    """Where a snapshot's files may resolve to: the repository's cache folder for huggingface_hub's
    layout (``<cache>/models--OWNER--NAME/snapshots/<commit>`` links into ``../../blobs``), else the
    folder itself."""
    folder = Path(folder).absolute()
    if folder.parent.name == "snapshots":
        return folder.parent.parent.resolve()
    return folder.resolve()


def confined(folder: Path, rel: Any, *, listed_in: str) -> Path:
    """``folder / rel`` once ``rel`` is a plain relative name whose file (symlinks followed) stays in
    :func:`storage_root`; nothing is opened before that.

    Raises:
        IntegrityError: ``rel`` is not a string, is absolute, has ``..``, a backslash or a NUL, or
            resolves outside the snapshot (named, with where it was listed).
    """
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
        raise IntegrityError(f"{folder}: {listed_in} names the file {rel!r}: expected a relative path; not read")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts or "." in rel.split("/") or "" in rel.split("/"):
        raise IntegrityError(f"{folder}: {listed_in} names the file {rel!r}, outside the repository snapshot; not read")
    path = Path(folder) / rel
    try:
        inside = path.resolve(strict=False).is_relative_to(storage_root(folder))
    except (OSError, RuntimeError):  # a symlink loop
        inside = False
    if not inside:
        raise IntegrityError(f"{path}: a link leaving the repository snapshot ({listed_in} lists {rel!r}); not read")
    return path


def _key_error(file: Path, e: ValidationError) -> IntegrityError:
    err = e.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err["loc"]) or "<root>"
    return IntegrityError(f"{file}: {where}: {err['msg']}")


def read_json(folder: Path, rel: str, *, listed_in: str) -> Any:
    """The JSON document at ``rel`` of a snapshot (confined first).

    Raises:
        IntegrityError: confined's refusals; missing; not JSON (the file and the parser's reason).
    """
    path = confined(folder, rel, listed_in=listed_in)
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise IntegrityError(f"{path}: missing from the repository") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IntegrityError(f"{path}: not valid JSON ({str(e).splitlines()[0]})") from None
    except OSError as e:
        raise IntegrityError(f"{path}: cannot read it ({e.strerror or e})") from None


def read_index(folder: Path, name: str, *, required: tuple[str, ...]) -> dict[str, Any]:
    """The snapshot's index ``name`` (``gradlab.json``), validated: the keys of :class:`RepoIndex`,
    every listed name confined, and each of ``required`` listed (so it is hashed before use).

    Raises:
        IntegrityError: naming the file and the key path (or the refused file name).
    """
    file = Path(folder) / name
    data = read_json(folder, name, listed_in="the repository")
    try:
        index = RepoIndex.model_validate(data)
    except ValidationError as e:
        raise _key_error(file, e) from None
    for rel in index.files:
        confined(folder, rel, listed_in=name)
    for rel in required:
        if rel not in index.files:
            raise IntegrityError(f"{file}: files: {rel} is not listed (every file a loader reads must be)")
    return data


def validated(model: Any, data: Any, file: Path) -> Any:
    """``model.model_validate(data)`` with a validation error as one line naming ``file`` and the key path."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _key_error(file, e) from None
