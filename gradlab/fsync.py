"""Durability helpers shared by the file store and the checkpoint writer."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """fsync a directory, so a rename or link inside it survives a crash (POSIX)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: a temporary file in the same folder, fsynced, then
    ``os.replace``d over ``path`` and the folder fsynced. ``path`` is the old bytes or the new ones,
    never a partial file (a full disk leaves the old one and removes the temporary one).

    Raises:
        OSError: the write failed (``ENOSPC`` on a full disk names ``path``'s temporary file).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)
