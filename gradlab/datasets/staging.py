"""Staging folders: which recording owns one, and removing those its recording left behind.

A recording writes its chunks under ``<home>/datasets/staging/<recording_id>/`` until it publishes
(docs/ARCHITECTURE.md section 12). When it starts, :func:`claim_staging` makes that folder its own:
it takes an exclusive ``flock`` on ``recording.lock`` in it, held for as long as the recording runs
(the kernel drops it when the process ends, SIGKILL included), and only then writes
``recording.json`` = ``{name, recording_id, epoch}``, ``epoch`` being one more than that of every
other staged recording of the same dataset name (claims are serialised by ``staging/.claims.lock``).

:func:`clean_stale` removes a folder only when it provably belongs to a dead or superseded recording
of that name: its ``recording.json`` names the dataset, its epoch is lower than the caller's, and its
lock can be taken (no process holds it: the recording has ended). A live recording's folder (lock
held), a newer one, another name's, and a folder without ``recording.json`` (not provably anyone's)
are left alone. The recording's own id and epoch decide, never a pid.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

CLAIM_FILE = "recording.json"
LOCK_FILE = "recording.lock"
CLAIMS_LOCK = ".claims.lock"


@dataclass
class StagingClaim:
    """A recording's hold on its staging folder; :meth:`release` (or the process's end) lets it go."""

    folder: Path
    name: str
    recording_id: str
    epoch: int
    lock: IO[bytes] | None

    def release(self) -> None:
        if self.lock is not None:
            self.lock.close()  # closing the only descriptor drops the flock
            self.lock = None


def _read_claim(folder: Path) -> dict | None:
    try:
        doc = json.loads((folder / CLAIM_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("epoch"), int) or not isinstance(doc.get("name"), str):
        return None
    return doc


@contextlib.contextmanager
def _claims_lock(root: Path):
    root.mkdir(parents=True, exist_ok=True)
    with open(root / CLAIMS_LOCK, "ab") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def claim_staging(staging_dir: Path, *, name: str, recording_id: str) -> StagingClaim:
    """Make ``staging_dir`` (``<root>/<recording_id>``) the running recording's, then remove the stale
    folders of the same dataset name (:func:`clean_stale`).

    Raises:
        OSError: the folder cannot be created or locked.
    """
    folder = Path(staging_dir)
    root = folder.parent
    with _claims_lock(root):
        epoch = 1 + max((c["epoch"] for c in (_read_claim(p) for p in root.iterdir() if p.is_dir())
                         if c is not None and c["name"] == name), default=0)
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / LOCK_FILE, "ab")  # noqa: SIM115 - held until release or the process's end
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        tmp = folder / (CLAIM_FILE + ".part")
        tmp.write_text(json.dumps({"name": name, "recording_id": recording_id, "epoch": epoch}))
        os.replace(tmp, folder / CLAIM_FILE)
    claim = StagingClaim(folder=folder, name=name, recording_id=recording_id, epoch=epoch, lock=lock)
    clean_stale(root, name=name, epoch=epoch)
    return claim


def clean_stale(root: Path, *, name: str, epoch: int) -> list[Path]:
    """Remove the staging folders under ``root`` of dead or superseded recordings of ``name`` with an
    epoch below ``epoch`` (see the module docstring); returns those removed."""
    removed: list[Path] = []
    if not Path(root).is_dir():
        return removed
    for folder in sorted(Path(root).iterdir()):
        claim = _read_claim(folder) if folder.is_dir() else None
        if claim is None or claim["name"] != name or claim["epoch"] >= epoch:
            continue
        try:
            lock = open(folder / LOCK_FILE, "ab")  # noqa: SIM115
        except OSError:
            continue
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its recording is still running
            shutil.rmtree(folder, ignore_errors=True)
        logger.info("removed the staging folder %s of ended recording %s (epoch %d) of dataset %s",
                    folder, claim.get("recording_id"), claim["epoch"], name)
        removed.append(folder)
    return removed
