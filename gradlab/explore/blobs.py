"""Provider-state blobs addressed by content: ``<folder>/<sha256>.bin``.

A search backend's checkpoint keeps every archived provider state (``VectorEnv.capture_lane``
bytes) once, named by its sha256, under ``resume/states/``; the checkpoint manifest lists each
file with its hash like any other, and :func:`read_blob` checks the bytes against the name again
before a state is restored, so a corrupted blob is refused naming it (docs/ARCHITECTURE.md
section 12a).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

from gradlab.errors import IntegrityError, NotFound

SUFFIX = ".bin"


def blob_sha256(data: bytes) -> str:
    """Hex sha256 of ``data`` (the blob's address)."""
    return hashlib.sha256(data).hexdigest()


def write_blobs(folder: Path, blobs: Mapping[str, bytes], keep: Iterable[str] | None = None) -> list[str]:
    """Write ``blobs`` (sha256 -> bytes) into ``folder`` as ``<sha256>.bin``.

    Args:
        folder: created if missing.
        blobs: the blobs by address; each address must be the sha256 of its bytes.
        keep: write only these addresses (the ones still referenced); None = all.

    Returns:
        The addresses written, sorted.

    Raises:
        IntegrityError: an address is not its bytes' sha256.
    """
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(blobs if keep is None else set(keep))
    for sha in names:
        data = blobs[sha]
        if blob_sha256(data) != sha:
            raise IntegrityError(f"provider state blob {sha}: its bytes hash to {blob_sha256(data)}")
        (folder / f"{sha}{SUFFIX}").write_bytes(data)
    return names


def read_blob(folder: Path, sha256: str) -> bytes:
    """The blob ``sha256`` from ``folder``, checked against its address.

    Raises:
        NotFound: no such file. IntegrityError: the file's bytes hash to something else (naming
            the file and both hashes).
    """
    path = folder / f"{sha256}{SUFFIX}"
    if not path.is_file():
        raise NotFound(f"{path}: provider state blob missing")
    data = path.read_bytes()
    found = blob_sha256(data)
    if found != sha256:
        raise IntegrityError(f"{path}: provider state blob is corrupted: sha256 expected {sha256}, found {found}")
    return data
