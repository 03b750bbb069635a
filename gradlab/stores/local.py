"""``file://`` object store: a folder on a local disk, crash-safe and safe across processes.

Create-only: the bytes go to a temp file in the target's directory, which is fsynced, then
``os.link(tmp, dst)`` publishes it (``link`` fails if ``dst`` exists, atomically, which ``rename``
would not), the temp file is unlinked and the directory fsynced. A reader therefore sees either no
object or the whole object. Compare-and-swap takes an exclusive ``fcntl.flock`` on a per-key lock
file around read-compare-replace, and replaces with ``os.replace`` inside one directory.
The etag of a file object is the hex sha256 of its bytes. fsspec's local ``pipe_file(mode="create")``
is not atomic (docs/ARCHITECTURE.md, field notes), hence plain ``os`` calls here.
"""

from __future__ import annotations

import fcntl
import logging
import os
import uuid
from pathlib import Path
from urllib.parse import unquote, urlparse

from gradlab.errors import Conflict, ContractViolation, NotFound
from gradlab.fsync import fsync_dir
from gradlab.stores.base import ObjectStore, sha256_hex, validate_key

logger = logging.getLogger(__name__)

_TMP_SUFFIX = ".tmp"
_LOCK_SUFFIX = ".lock"


def path_from_file_url(url: str) -> Path:
    """The local folder named by a ``file://`` URL (or a plain path).

    Raises:
        ContractViolation: the URL names a remote host.
    """
    if "://" not in url:
        return Path(url).expanduser().resolve()
    parsed = urlparse(url)
    if parsed.scheme != "file":
        raise ContractViolation(f"{url}: expected a file:// URL")
    if parsed.netloc not in ("", "localhost"):
        raise ContractViolation(f"{url}: file URLs with a host ({parsed.netloc!r}) are not supported")
    return Path(unquote(parsed.path)).resolve()



def _write_tmp(directory: Path, name: str, data: bytes, mode: int = 0o644) -> Path:
    tmp = directory / f".{name}.{uuid.uuid4().hex}{_TMP_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


class FileStore(ObjectStore):
    """An :class:`ObjectStore` in a local folder (see the module docstring for the guarantees)."""

    def __init__(self, url: str, *, shared: bool | None = None):
        """Args: shared: False: folders 0700 and files 0600 (chmod'ed, whatever the umask); True:
        0755 / 0644 less the umask; None: the ``shared_permissions`` setting."""
        self.root = path_from_file_url(url)
        self.base_url = self.root.as_uri()
        if shared is None:
            from gradlab.errors import ConfigError
            from gradlab.settings import load_settings

            try:
                shared = load_settings().shared_permissions
            except ConfigError:  # a broken config is reported by whoever reads it; stay private
                shared = False
        self.shared = shared
        self._file_mode = 0o644 if shared else 0o600
        self._dir_mode = 0o755 if shared else 0o700

    # -- paths ---------------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    def url(self, key: str) -> str:
        return self._path(key).as_uri()

    def _prepare_dir(self, path: Path) -> None:
        parent = path.parent
        if parent.is_dir():
            return
        missing = []
        folder = parent
        while not folder.exists():
            missing.append(folder)
            folder = folder.parent
        for folder in reversed(missing):
            try:
                os.mkdir(folder, self._dir_mode)
            except FileExistsError:
                continue
            if not self.shared:
                os.chmod(folder, self._dir_mode)  # whatever the umask
        for folder in missing:  # make the new directory entries durable
            fsync_dir(folder.parent)

    # -- writes --------------------------------------------------------------------------------
    def put_create_only(self, key: str, data: bytes) -> str:
        path = self._path(key)
        self._prepare_dir(path)
        tmp = _write_tmp(path.parent, path.name, data, self._file_mode)
        try:
            os.link(tmp, path)
        except FileExistsError:
            existing = self._read(path, key)
            if existing != data:
                raise Conflict(
                    f"{self.url(key)}: create-only write refused: an object with different bytes exists "
                    f"(existing sha256 {sha256_hex(existing)}, new sha256 {sha256_hex(data)})"
                ) from None
            logger.debug("%s: identical object already exists", self.url(key))
            return sha256_hex(existing)
        finally:
            os.unlink(tmp)
        fsync_dir(path.parent)
        return sha256_hex(data)

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        path = self._path(key)
        self._prepare_dir(path)
        lock_path = path.parent / f".{path.name}{_LOCK_SUFFIX}"
        with os.fdopen(os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, self._file_mode), "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                try:
                    current: str | None = sha256_hex(path.read_bytes())
                except FileNotFoundError:
                    current = None
                if current != etag:
                    raise Conflict(
                        f"{self.url(key)}: compare-and-swap lost: expected etag {etag}, found {current}"
                    )
                tmp = _write_tmp(path.parent, path.name, data, self._file_mode)
                try:
                    if etag is None:
                        os.link(tmp, path)
                    else:
                        os.replace(tmp, path)
                except FileExistsError:
                    raise Conflict(f"{self.url(key)}: compare-and-swap lost: the object was created") from None
                finally:
                    if tmp.exists():
                        os.unlink(tmp)
                fsync_dir(path.parent)
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
        return sha256_hex(data)

    # -- reads ---------------------------------------------------------------------------------
    def _read(self, path: Path, key: str) -> bytes:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise NotFound(f"{self.url(key)}: no such object") from None
        except IsADirectoryError:
            raise NotFound(f"{self.url(key)}: is a folder, not an object") from None
        except NotADirectoryError:
            raise NotFound(f"{self.url(key)}: no such object (a parent is an object)") from None

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        data = self._read(self._path(key), key)
        return data, sha256_hex(data)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        if prefix.startswith("/"):
            raise ContractViolation(f"list prefix {prefix!r}: expected a relative prefix")
        folder = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        if not folder.is_dir():
            return []
        keys: list[str] = []
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel = os.path.relpath(dirpath, self.root)
            for name in filenames:
                if name.startswith("."):
                    continue
                key = name if rel == "." else f"{Path(rel).as_posix()}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

