"""Object stores: one interface over ``file://`` and ``s3://`` URLs, create-only and compare-and-swap.

Public names:
    open_store(url, *, endpoint_url=None, settings=None) -> ObjectStore: a store for one URL.
    s3_credentials(settings): the S3 client credentials from `[stores]` secret references.
    open_stores(settings=None) -> Stores: the three logical stores (control, eval, model).
    open_dataset_store(settings=None) -> ObjectStore: the fourth, ``dataset`` (recorded episodes).
    ObjectStore: the interface (``put_create_only``, ``put_if_match``, ``get``, ``get_with_etag``,
        ``exists``, ``list``, ``put_verified``, ``url``). FileStore, S3Store: the backends.
    keys: the key of every receipt and bundle.

Shipped defaults: four ``file://`` folders under ``$GRADLAB_HOME/stores/{control,eval,model,dataset}``,
overridable by ``GRADLAB_{CONTROL,EVAL,MODEL,DATASET}_STORE_URL`` (``s3://bucket/prefix`` with
``GRADLAB_S3_ENDPOINT_URL`` for Cloudflare R2). Errors: ``NotFound``, ``Conflict`` (create-only met
different bytes, or compare-and-swap lost), ``StoreUnavailable`` (transient: retry only this).

Key layout (``<step>`` is zero-padded to 12 digits, ``<sha16>`` the first 16 hex of the policy
file's sha256; every object is create-only except those marked CAS)::

    control store
      runs/<run_id>/run.json                                   RunRecord
      runs/<run_id>/spec.json                                  the resolved RunSpec JSON
      runs/<run_id>/lease.json                                 Lease (CAS; the writer lease)
      runs/<run_id>/attempts/<attempt_id>/attempt.json         Attempt
      runs/<run_id>/attempts/<attempt_id>/terminal.json        TerminalReceipt
      runs/<run_id>/publications/<step>-<sha16>.json           CheckpointPublication
      runs/<run_id>/stop.json                                  StopRequest (first one wins)
      runs/<run_id>/promotion.json                             Promotion (exactly one per run)
    eval store
      runs/<run_id>/evaluations/<intent_key>/intent.json       EvaluationIntent
      runs/<run_id>/evaluations/<intent_key>/result.json       EvaluationRecord
      baselines/<goal_id>/<baseline>-<manifest sha16>.json     EvalResult of a random/noop policy
    model store
      runs/<run_id>/checkpoints/<step>-<sha16>/<file>          checkpoint bundle files (verified)
      runs/<run_id>/index.json                                 RunIndex (CAS): checkpoints + promotion
    dataset store
      datasets/<name>/recordings/<recording_id>/<file>         a recording's episode files (verified)
      datasets/<name>/manifest.json                            DatasetManifest, written last: the dataset
                                                               exists once it is there
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gradlab.errors import ConfigError, ContractViolation
from gradlab.stores import keys
from gradlab.stores.base import ObjectStore, sha256_hex, validate_key
from gradlab.stores.local import FileStore

if TYPE_CHECKING:
    from gradlab.settings import Settings
    from gradlab.stores.s3 import S3Store

__all__ = [
    "FileStore", "ObjectStore", "S3Store", "Stores", "keys", "open_dataset_store", "open_store", "open_stores",
    "s3_credentials",
    "sha256_hex", "validate_key",
]

#: ``[stores]`` secret references → the botocore client argument each one supplies.
S3_SECRET_REFS = {
    "stores.s3_access_key_id_ref": "aws_access_key_id",
    "stores.s3_secret_ref": "aws_secret_access_key",
    "stores.s3_session_token_ref": "aws_session_token",
}


def s3_credentials(settings: Settings) -> dict[str, str] | None:
    """The S3 client's credentials from the config file's ``[stores]`` secret references.

    ``s3_secret_ref`` (the secret access key), ``s3_access_key_id_ref`` and ``s3_session_token_ref``
    are resolved now (docs/ARCHITECTURE.md section 13); a key id or secret without a reference comes
    from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, since botocore takes both or neither.

    Returns:
        ``{"aws_access_key_id", "aws_secret_access_key"[, "aws_session_token"]}`` for
        ``botocore``'s ``create_client``; None when the file names no S3 reference (botocore then
        finds credentials itself: environment, AWS credential files).

    Raises:
        ConfigError: a reference is not set, or the pair is incomplete (names what is missing).
    """
    refs = dict(settings.secret_refs)
    if not any(key in refs for key in S3_SECRET_REFS):
        return None
    creds = {arg: settings.secret(key) for key, arg in S3_SECRET_REFS.items() if key in refs}
    fallback = {"aws_access_key_id": "AWS_ACCESS_KEY_ID", "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY"}
    for arg, env in fallback.items():
        if arg not in creds:
            value = os.environ.get(env)
            if not value:
                ref_key = next(k for k, a in S3_SECRET_REFS.items() if a == arg)
                raise ConfigError(f"{settings.config_file}: [stores] names S3 secret reference(s) but no {arg}: set "
                                  f"{ref_key.split('.')[1]} = \"env:NAME\" or {env}")
            creds[arg] = value
    return {k: v for k, v in creds.items() if v is not None}


def open_store(url: str, *, endpoint_url: str | None = None, settings: Settings | None = None) -> ObjectStore:
    """An object store for ``url``.

    Args:
        url: ``file:///abs/folder`` (or a plain local path) or ``s3://bucket[/prefix]``.
        endpoint_url: S3 endpoint (``https://<account>.r2.cloudflarestorage.com`` for R2); default
            ``GRADLAB_S3_ENDPOINT_URL`` or the ``[stores] endpoint_url`` setting, else AWS.
        settings: where S3 secret references and the endpoint setting come from (default:
            :func:`gradlab.settings.load_settings`, read only for an ``s3://`` URL).

    Raises:
        ContractViolation: an unsupported URL scheme.
        ConfigError: an S3 secret reference does not resolve (:func:`s3_credentials`).
    """
    if url.startswith("s3://"):
        from gradlab.stores.s3 import S3Store

        if settings is None:
            from gradlab.settings import load_settings

            settings = load_settings()
        if endpoint_url is None:
            endpoint_url = os.environ.get("GRADLAB_S3_ENDPOINT_URL") or settings.s3_endpoint_url
        return S3Store(url, endpoint_url=endpoint_url, credentials=s3_credentials(settings))
    if url.startswith("file://") or "://" not in url:
        return FileStore(url)
    raise ContractViolation(f"{url}: unsupported store URL (expected file:// or s3://)")


@dataclass(frozen=True)
class Stores:
    """The three logical stores of docs/ARCHITECTURE.md section 9."""

    control: ObjectStore
    eval: ObjectStore
    model: ObjectStore


def open_stores(settings: Settings | None = None) -> Stores:
    """The control, eval and model stores named by ``settings`` (default: :func:`load_settings`)."""
    if settings is None:
        from gradlab.settings import load_settings

        settings = load_settings()
    endpoint = settings.s3_endpoint_url
    return Stores(
        control=open_store(settings.control_store_url, endpoint_url=endpoint, settings=settings),
        eval=open_store(settings.eval_store_url, endpoint_url=endpoint, settings=settings),
        model=open_store(settings.model_store_url, endpoint_url=endpoint, settings=settings),
    )


def open_dataset_store(settings: Settings | None = None) -> ObjectStore:
    """The ``dataset`` store named by ``settings`` (default: :func:`load_settings`): file or S3, create-only."""
    if settings is None:
        from gradlab.settings import load_settings

        settings = load_settings()
    url = settings.dataset_store_url or (settings.home / "stores" / "dataset").as_uri()
    return open_store(url, endpoint_url=settings.s3_endpoint_url, settings=settings)


def __getattr__(name: str):  # lazy: botocore is imported only when an s3:// store is opened
    if name == "S3Store":
        from gradlab.stores.s3 import S3Store

        return S3Store
    raise AttributeError(name)
