"""Checkpoint publication: copy a checkpoint's files to the model store, verify them, write the
create-only publication receipt and add it to the run index; read a publication back, verified.

Publishing for a superseded attempt is refused (fencing: :func:`gradlab.receipts.lease.require_epoch`).
Every object read back is checked against the sha256 in the publication receipt before it is used.
"""

from __future__ import annotations

import json
import logging
import os
import re
from datetime import datetime
from pathlib import Path

from gradlab.errors import Conflict, ContractViolation, IntegrityError
from gradlab.receipts.index import update_index, with_checkpoint
from gradlab.receipts.io import create_or_agree, read_model
from gradlab.receipts.lease import require_epoch
from gradlab.receipts.models import CheckpointPublication, FileEntry, IndexEntry, utcnow
from gradlab.stores import Stores, keys, sha256_hex

logger = logging.getLogger(__name__)

_SHA256 = re.compile(r"[0-9a-f]{64}")


def _checkpoint_files(checkpoint_dir: Path) -> dict[str, Path]:
    files = {}
    for path in sorted(checkpoint_dir.rglob("*")):
        if path.is_file():
            files[path.relative_to(checkpoint_dir).as_posix()] = path
    return files


def publish_checkpoint(
    stores: Stores, *, run_id: str, attempt_id: str, checkpoint_dir: Path, now: datetime | None = None,
    epoch: int | None = None,
) -> CheckpointPublication:
    """Copy a checkpoint folder to the model store, verify it, write its receipt, add it to the index.

    Every file listed in ``manifest.json`` (``files: {relative path: {sha256, size_bytes}}``) is checked
    against its bytes before upload; every file is uploaded create-only and re-read
    (:meth:`ObjectStore.put_verified`). A retry after a partial publication re-uploads identical
    bytes (success) and finds the receipt it wrote (agrees).

    Returns:
        The publication receipt as stored.

    Args:
        epoch: the publishing attempt's lease epoch: checked before anything is uploaded and again
            before the receipt is written (a superseded attempt publishes nothing), and recorded.

    An attempt that lost its lease mid-upload leaves objects under the checkpoint's keys that no
    publication receipt names. A later attempt that trains the same policy to the same step (seeded
    training is deterministic) has the same keys but not the same bytes (``created_at``, resume
    state): holding the lease (``epoch``), it replaces those unfinished objects by compare-and-swap
    (docs/ARCHITECTURE.md section 8). Objects a publication receipt names are never replaced.

    Raises:
        LeaseLost: ``epoch`` is no longer the lease's (also checked before replacing an object).
        ContractViolation: no ``manifest.json``, or it names another run.
        IntegrityError: ``manifest.json`` is not a manifest (invalid JSON, no integer step or
            sha256), the policy file's sha256 is not the manifest's, a file's bytes do not match
            the manifest (names the file), a listed file is missing, or a file is not listed; or a
            replaced object reads back different bytes.
        Conflict: the model store holds different bytes under this checkpoint's keys and either a
            publication receipt names them or no ``epoch`` was given.
        StoreUnavailable: a store cannot be reached (transient: retry).
    """
    checkpoint_dir = Path(checkpoint_dir)
    manifest_path = checkpoint_dir / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_bytes())
    except FileNotFoundError:
        raise ContractViolation(f"{manifest_path}: checkpoint has no manifest.json") from None
    except ValueError as e:  # not JSON, not UTF-8
        raise IntegrityError(f"{manifest_path}: not a checkpoint manifest (invalid JSON: {e})") from None
    if not isinstance(manifest, dict):
        raise IntegrityError(f"{manifest_path}: not a checkpoint manifest (expected a JSON object)")
    if manifest.get("run_id") != run_id:
        raise ContractViolation(f"{manifest_path}: run_id: expected {run_id}, found {manifest.get('run_id')}")
    step, sha256, listed = manifest.get("step"), manifest.get("sha256"), manifest.get("files", {})
    if (not isinstance(step, int) or isinstance(step, bool) or step < 0 or not isinstance(sha256, str)
            or not _SHA256.fullmatch(sha256) or not isinstance(listed, dict)
            or not all(isinstance(entry, dict) for entry in listed.values())):
        raise IntegrityError(f"{manifest_path}: expected step (an integer >= 0), sha256 (64 hex digits) and files "
                             f"(name: {{sha256, size_bytes}}), found step {step!r}, sha256 {sha256!r}")
    purpose = manifest.get("purpose", "periodic")
    if epoch is not None:
        require_epoch(stores, run_id, attempt_id, epoch)
    # The identity is the policy file's sha256; its bytes are checked against ``files`` below.
    policy_name = str(manifest.get("policy_file", "policy.zip"))
    if policy_name in listed and listed[policy_name].get("sha256") != sha256:
        raise IntegrityError(f"{manifest_path}: sha256 {sha256} (the checkpoint's identity) is not its {policy_name}'s "
                             f"({listed[policy_name].get('sha256')})")
    present = _checkpoint_files(checkpoint_dir)
    missing = sorted(set(listed) - set(present))
    if missing:
        raise IntegrityError(f"{checkpoint_dir}: files listed in manifest.json are missing: {', '.join(missing)}")
    unlisted = sorted(set(present) - set(listed) - {"manifest.json"})
    if unlisted:
        raise IntegrityError(f"{checkpoint_dir}: files not listed in manifest.json: {', '.join(unlisted)}")
    entries: dict[str, FileEntry] = {}
    for name, path in present.items():
        data = path.read_bytes()
        digest = sha256_hex(data)
        if name in listed and listed[name].get("sha256") != digest:
            raise IntegrityError(
                f"{path}: sha256 expected {listed[name].get('sha256')} (manifest.json), found {digest}"
            )
        key = keys.checkpoint_file(run_id, step, sha256, name)
        try:
            stores.model.put_verified(key, data)
        except Conflict:
            if epoch is None or stores.control.exists(keys.publication(run_id, step, sha256)):
                raise
            _replace_unfinished_upload(stores, run_id, attempt_id, epoch, key, data)
        entries[name] = FileEntry(sha256=digest, size_bytes=len(data))
    uri = stores.model.url(keys.checkpoint_prefix(run_id, step, sha256).rstrip("/")) + "/"
    publication = CheckpointPublication(
        run_id=run_id,
        attempt_id=attempt_id,
        step=step,
        sha256=sha256,
        purpose=purpose,
        uri=uri,
        files=entries,
        epoch=epoch,
        published_at=now or utcnow(),
    )
    if epoch is not None:
        require_epoch(stores, run_id, attempt_id, epoch)
    stored = create_or_agree(
        stores.control,
        keys.publication(run_id, step, sha256),
        publication,
        agree=lambda old, new: (old.step, old.sha256, old.files, old.uri) == (new.step, new.sha256, new.files, new.uri),
        what="checkpoint publication",
    )
    entry = IndexEntry(step=step, sha256=sha256, uri=uri, purpose=stored.purpose)
    update_index(stores.model, run_id, lambda index: with_checkpoint(index, entry))
    logger.info("run %s: published checkpoint step %d (%s)", run_id, step, sha256[:16])
    return stored


def _replace_unfinished_upload(stores: Stores, run_id: str, attempt_id: str, epoch: int, key: str, data: bytes) -> None:
    """Replace an object of a checkpoint no publication receipt names (an earlier attempt's
    unfinished upload) with ``data``: lease checked first, compare-and-swap on the etag read, then
    re-read and compared. A writer that replaced it meanwhile wins (``Conflict``)."""
    require_epoch(stores, run_id, attempt_id, epoch)
    old, etag = stores.model.get_with_etag(key)
    logger.warning("run %s: %s holds %d bytes (sha256 %s) that no publication receipt names, left by an "
                   "unfinished upload; %s epoch %d replaces them", run_id, stores.model.url(key), len(old),
                   sha256_hex(old)[:16], attempt_id, epoch)
    stores.model.put_if_match(key, data, etag)
    found = sha256_hex(stores.model.get(key))
    if found != sha256_hex(data):
        raise IntegrityError(f"{stores.model.url(key)}: wrote sha256 {sha256_hex(data)}, read back sha256 {found}")


def download_checkpoint(stores: Stores, publication: CheckpointPublication, dest: Path) -> Path:
    """Fetch a published checkpoint into ``dest`` (a new folder), verifying every file's sha256.

    The files land in a sibling ``.partial`` folder first, which is renamed to ``dest`` once all are
    verified, so ``dest`` is either complete or absent.

    Returns:
        ``dest``.

    Raises:
        Conflict: ``dest`` exists already.
        IntegrityError: a downloaded file's sha256 differs from the publication receipt (names it).
        NotFound: a file of the publication is missing from the model store.
    """
    import shutil
    import uuid

    dest = Path(dest)
    if dest.exists():
        raise Conflict(f"{dest}: exists already; expected a new folder for the checkpoint")
    partial = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}.partial"
    partial.mkdir(parents=True)
    try:
        for name, entry in sorted(publication.files.items()):
            key = keys.checkpoint_file(publication.run_id, publication.step, publication.sha256, name)
            data = stores.model.get(key)
            if sha256_hex(data) != entry.sha256:
                raise IntegrityError(
                    f"{stores.model.url(key)}: sha256 expected {entry.sha256} (publication), found {sha256_hex(data)}"
                )
            target = partial / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        os.rename(partial, dest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return dest


def verify_published(stores: Stores, publication: CheckpointPublication) -> None:
    """Re-read every published object of a checkpoint from the model store and check its sha256
    against the publication receipt (control store): what is evaluated and promoted must be
    byte-identical to what was published (docs/ARCHITECTURE.md section 8).

    Raises:
        IntegrityError: an object's bytes differ, naming its URL and both hashes.
        NotFound: an object of the publication is missing from the model store (named).
        StoreUnavailable: the model store cannot be reached (transient).
    """
    for name, entry in sorted(publication.files.items()):
        key = keys.checkpoint_file(publication.run_id, publication.step, publication.sha256, name)
        digest = sha256_hex(stores.model.get(key))
        if digest != entry.sha256:
            raise IntegrityError(f"{stores.model.url(key)}: sha256 expected {entry.sha256} (publication), found {digest}")


def list_publications(stores: Stores, run_id: str) -> list[CheckpointPublication]:
    """Every published checkpoint of the run, by step."""
    found = [
        read_model(stores.control, k, CheckpointPublication)
        for k in stores.control.list(keys.publications_prefix(run_id))
        if k.endswith(".json")
    ]
    return sorted(found, key=lambda p: (p.step, p.sha256))
