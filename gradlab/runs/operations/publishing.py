"""Publishing checkpoints: one checkpoint to the model store (files, receipt, index), and a
published checkpoint's folder in the run directory, verified against its publication receipt."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from gradlab.errors import ContractViolation, NotFound
from gradlab.receipts.models import CheckpointPublication
from gradlab.receipts.publication import download_checkpoint, publish_checkpoint
from gradlab.runs.paths import RunPaths
from gradlab.stores import Stores

log = logging.getLogger(__name__)


def publish(stores: Stores, run_id: str, attempt_id: str, checkpoint_dir: Path, *,
            epoch: int | None = None) -> CheckpointPublication:
    """Publish one checkpoint (copy, verify, receipt, index): exactly the files of the bundle's schema.

    See :func:`gradlab.receipts.publication.publish_checkpoint`.

    Raises:
        LeaseLost: ``epoch`` is no longer the lease's (a newer attempt holds the run).
        IntegrityError: a file outside the bundle's schema is in the folder (named; nothing uploaded),
            even one its manifest lists (:func:`gradlab.checkpoints.bundle.check_bundle_files`).
    """
    from gradlab.checkpoints.bundle import check_bundle_files

    check_bundle_files(checkpoint_dir)
    return publish_checkpoint(stores, run_id=run_id, attempt_id=attempt_id, checkpoint_dir=checkpoint_dir,
                              epoch=epoch)


def local_checkpoint_dir(stores: Stores, paths: RunPaths, publication: CheckpointPublication) -> Path:
    """The published checkpoint's folder in the run directory, verified file by file against its
    publication receipt (the control store, not the folder's own manifest); downloaded (verified)
    when absent, and again when the local copy differs (the bad copy is kept aside).

    Raises:
        IntegrityError: the model store's copy differs from the publication (names the object and
            both hashes). NotFound: an object of the publication is missing from the model store.
    """
    from gradlab.checkpoints import verify_against_publication
    from gradlab.errors import IntegrityError
    from gradlab.stores import keys

    dest = paths.checkpoints / keys.checkpoint_name(publication.step, publication.sha256)
    if dest.is_dir():
        try:
            verify_against_publication(dest, publication.files)
            return dest
        except (IntegrityError, ContractViolation, NotFound) as e:
            aside = dest.with_name(f"{dest.name}.corrupt-{time.time_ns()}")
            log.warning("%s fails verification (%s): kept as %s; using the published copy", dest, e, aside.name)
            dest.rename(aside)
    download_checkpoint(stores, publication, dest)
    verify_against_publication(dest, publication.files)
    return dest
