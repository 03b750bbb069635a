"""``s3://bucket/prefix`` object store over botocore (Cloudflare R2 in production, moto in tests).

The S3 client is used directly (botocore, the library under both boto3 and s3fs, already a
dependency through s3fs/aiobotocore) rather than through s3fs, because s3fs loses information on
conditional writes: a lost ``If-Match`` surfaces from s3fs as ``OSError(EINVAL)`` while the client
gives a clean HTTP 412 (docs/ARCHITECTURE.md, field notes). Conditional writes:

- create-only: ``PutObject`` with ``If-None-Match: *``. 412 (or 409, which some stores answer to a
  concurrent create: "lost the race") → re-read; identical bytes are success, different bytes are a
  ``Conflict``.
- compare-and-swap: ``PutObject`` with ``If-Match: <etag>``; 412, 409 or 404 → ``Conflict``.

Connection failures, timeouts and 5xx answers become :class:`~gradlab.errors.StoreUnavailable`
(transient) after botocore's own bounded retries, so callers retry only those. The endpoint URL
comes from ``GRADLAB_S3_ENDPOINT_URL`` (or the ``[stores] endpoint_url`` setting); keys come from
the ``[stores]`` secret references of the config file (resolved when the store is opened, handed to
the client, written nowhere), else the standard AWS environment variables or credential files.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, NoReturn
from urllib.parse import urlparse

from gradlab.errors import ConfigError, Conflict, ContractViolation, NotFound, StoreUnavailable
from gradlab.stores.base import ObjectStore, sha256_hex, validate_key

logger = logging.getLogger(__name__)

_CLIENTS: dict[tuple[str | None, str, str], Any] = {}
_CLIENTS_LOCK = threading.Lock()

#: Seconds to wait between re-reads when a 409 says another creator is mid-write.
_RACE_REREAD_DELAY_S = 0.05
_RACE_REREAD_TRIES = 40


def _client(endpoint_url: str | None, credentials: dict[str, str] | None = None) -> Any:
    """A cached, thread-safe botocore S3 client for ``endpoint_url``.

    ``credentials`` (``aws_access_key_id``, ``aws_secret_access_key``, optional
    ``aws_session_token``: resolved secret references, :func:`gradlab.stores.s3_credentials`) go to
    ``create_client``; None lets botocore find credentials itself. The cache is keyed by a sha256 of
    the credentials, so the values are held only by the client.
    """
    import hashlib

    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    ident = hashlib.sha256(repr(sorted((credentials or {}).items())).encode()).hexdigest() if credentials else ""
    key = (endpoint_url, region, ident)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            import botocore.session
            from botocore.config import Config

            # One inner retry (backoff <= 1 s) absorbs a stale pooled connection after a server
            # restart; longer outages surface as StoreUnavailable for the caller's task retries.
            config = Config(
                retries={"max_attempts": 2, "mode": "standard"},
                connect_timeout=3,
                read_timeout=30,
                # R2 and other S3-protocol stores do not all accept the newer default checksums.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            )
            session = botocore.session.get_session()
            client = session.create_client("s3", endpoint_url=endpoint_url, region_name=region, config=config,
                                           **(credentials or {}))
            _CLIENTS[key] = client
        return client


def _status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None) or {}
    return response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class S3Store(ObjectStore):
    """An :class:`ObjectStore` in an S3 bucket under an optional prefix."""

    def __init__(self, url: str, *, endpoint_url: str | None = None, credentials: dict[str, str] | None = None):
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ContractViolation(f"{url}: expected s3://bucket[/prefix]")
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.base_url = f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self.endpoint_url = endpoint_url
        self._s3 = _client(endpoint_url, credentials)

    # -- helpers -------------------------------------------------------------------------------
    def _object_key(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._object_key(key)}"

    def _raise(self, exc: Exception, key: str, op: str) -> NoReturn:
        """Translate a botocore exception into gradlab's errors."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        where = self.url(key) if key else self.base_url
        if isinstance(exc, NoCredentialsError | PartialCredentialsError):
            raise ConfigError(
                f"{where}: {op}: no S3 credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or [stores] s3_access_key_id_ref and s3_secret_ref in the config file)"
            ) from exc
        if isinstance(exc, ClientError):
            status = _status(exc)
            code = _code(exc)
            if status is not None and status >= 500 or code in ("SlowDown", "ServiceUnavailable", "InternalError"):
                raise StoreUnavailable(
                    f"{where}: {op}: server error {status} {code} from {self.endpoint_url or 'AWS'}"
                ) from exc
            if status in (401, 403):
                raise ConfigError(
                    f"{where}: {op}: access denied ({status} {code}); check the S3 credentials and bucket policy"
                ) from exc
            if status == 404 or code in ("NoSuchKey", "404", "NotFound"):
                if code == "NoSuchBucket":
                    raise NotFound(f"{where}: {op}: bucket {self.bucket!r} does not exist") from exc
                raise NotFound(f"{where}: no such object") from exc
            raise ContractViolation(f"{where}: {op}: unexpected answer {status} {code}: {exc}") from exc
        if isinstance(exc, BotoCoreError):
            raise StoreUnavailable(
                f"{where}: {op}: cannot reach {self.endpoint_url or 'AWS S3'}: {type(exc).__name__}: {exc}"
            ) from exc
        raise exc

    def _conditional_put(self, key: str, data: bytes, **condition: str) -> str | None:
        """PutObject with a condition. Returns the new etag, or None when the condition failed."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self._s3.put_object(Bucket=self.bucket, Key=self._object_key(key), Body=data, **condition)
        except ClientError as exc:
            status = _status(exc)
            if status in (409, 412) or _code(exc) in ("PreconditionFailed", "ConditionalRequestConflict"):
                return None
            if status == 404 and "IfMatch" in condition:
                return None
            self._raise(exc, key, "put")
        except BotoCoreError as exc:
            self._raise(exc, key, "put")
        return str(response["ETag"])

    # -- writes --------------------------------------------------------------------------------
    def put_create_only(self, key: str, data: bytes) -> str:
        for _ in range(_RACE_REREAD_TRIES):
            etag = self._conditional_put(key, data, IfNoneMatch="*")
            if etag is not None:
                return etag
            try:
                existing, existing_etag = self.get_with_etag(key)
            except NotFound:
                # 409 from a store whose competing create has not completed: re-read shortly.
                time.sleep(_RACE_REREAD_DELAY_S)
                continue
            if existing != data:
                raise Conflict(
                    f"{self.url(key)}: create-only write refused: an object with different bytes exists "
                    f"(existing sha256 {sha256_hex(existing)}, new sha256 {sha256_hex(data)})"
                )
            logger.debug("%s: identical object already exists", self.url(key))
            return existing_etag
        raise Conflict(f"{self.url(key)}: create-only write kept losing to a create that never completed")

    def put_if_match(self, key: str, data: bytes, etag: str | None) -> str:
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
        new_etag = self._conditional_put(key, data, **condition)
        if new_etag is None:
            raise Conflict(f"{self.url(key)}: compare-and-swap lost: expected etag {etag}")
        return new_etag

    # -- reads ---------------------------------------------------------------------------------
    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self._s3.get_object(Bucket=self.bucket, Key=self._object_key(key))
            data = response["Body"].read()
        except (ClientError, BotoCoreError) as exc:
            self._raise(exc, key, "get")
        return data, str(response["ETag"])

    def exists(self, key: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._s3.head_object(Bucket=self.bucket, Key=self._object_key(key))
        except ClientError as exc:
            if _status(exc) == 404:
                return False
            self._raise(exc, key, "head")
        except BotoCoreError as exc:
            self._raise(exc, key, "head")
        return True

    def list(self, prefix: str = "") -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        if prefix.startswith("/"):
            raise ContractViolation(f"list prefix {prefix!r}: expected a relative prefix")
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        strip = len(self.prefix) + 1 if self.prefix else 0
        keys: list[str] = []
        try:
            paginator = self._s3.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
                keys.extend(item["Key"][strip:] for item in page.get("Contents", []))
        except (ClientError, BotoCoreError) as exc:
            self._raise(exc, "", f"list {prefix!r}")
        return sorted(keys)
