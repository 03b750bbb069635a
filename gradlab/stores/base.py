"""The object-store interface shared by every backend, and the rules every backend obeys."""

from __future__ import annotations

import hashlib
import logging
from abc import ABC, abstractmethod

from gradlab.errors import ContractViolation, IntegrityError

logger = logging.getLogger(__name__)


def validate_key(key: str) -> str:
    """Return ``key`` if it is a safe relative object key.

    A key is ``/``-separated, relative, with no empty, ``.`` or ``..`` segment and no segment that
    starts with ``.`` (those names are reserved for a backend's temporary and lock files).

    Raises:
        ContractViolation: the key is empty, absolute, or has a forbidden segment.
    """
    if not isinstance(key, str) or not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise ContractViolation(f"object key {key!r}: expected a relative '/'-separated key")
    for part in key.split("/"):
        if not part or part.startswith("."):
            raise ContractViolation(
                f"object key {key!r}: segment {part!r} is empty or starts with '.' (reserved)"
            )
    return key


def sha256_hex(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


class ObjectStore(ABC):
    """A flat key → bytes store with create-only writes and compare-and-swap.

    Every object is immutable once written except those updated through :meth:`put_if_match`
    (the run index and leases). Keys are relative ``/``-separated paths (:func:`validate_key`).

    Errors every method may raise: ``NotFound`` (missing key, reads only), ``Conflict``
    (create-only met different bytes, compare-and-swap lost), ``StoreUnavailable`` (transient:
    the server could not be reached or answered 5xx; a retry may succeed), ``ContractViolation``
    (bad key).
    """

    #: The store's URL as given to :func:`gradlab.stores.open_store`, without a trailing slash.
    base_url: str

    @abstractmethod
    def put_create_only(self, key: str, data: bytes) -> str:
        """Write ``data`` at ``key`` only if no object is there yet.

        Returns:
            The object's etag (opaque; compare only for equality).

        Raises:
            Conflict: an object with different bytes already exists at ``key``. An existing object
                with identical bytes is success (so a retried write is idempotent).
        """

    @abstractmethod
    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        """Compare-and-swap: replace ``key`` only if its current etag is ``etag``.

        ``etag=None`` means the key must not exist yet.

        Returns:
            The new etag.

        Raises:
            Conflict: the current etag differs (another writer won the race): re-read and retry.
        """

    @abstractmethod
    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        """The object's bytes and its current etag.

        Raises:
            NotFound: no object at ``key``.
        """

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object exists at ``key``."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Every key that starts with ``prefix`` (a plain string prefix, as in S3), sorted."""

    @abstractmethod
    def url(self, key: str) -> str:
        """The full URL of ``key`` (``file:///...`` or ``s3://bucket/prefix/key``)."""

    def get(self, key: str) -> bytes:
        """The object's bytes.

        Raises:
            NotFound: no object at ``key``.
        """
        return self.get_with_etag(key)[0]

    def put_verified(self, key: str, data: bytes) -> str:
        """Create-only upload, then re-read the object and compare sha256 with ``data``.

        ETags are never used as checksums (R2 multipart ETags are not MD5s; docs/ARCHITECTURE.md, field notes).

        Returns:
            The object's etag.

        Raises:
            Conflict: different bytes already exist at ``key``.
            IntegrityError: the bytes read back differ from the bytes written.
        """
        etag = self.put_create_only(key, data)
        expected = sha256_hex(data)
        found = sha256_hex(self.get(key))
        if found != expected:
            raise IntegrityError(f"{self.url(key)}: wrote sha256 {expected}, read back sha256 {found}")
        return etag

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"
