"""Which checkpoint a reference names, verified and local: ``RUN_ID[:STEP]``, a folder, a store URI.

A reference is a checkpoint directory (``<run_dir>/checkpoints/<step>-<sha16>``, its run spec read
from ``<run_dir>/spec.json``; ``file://`` as receipts print a file store's folder) or
``RUN_ID[:STEP]``, read from the receipt stores (:func:`gradlab.stores.open_stores`; key layout in
``gradlab/stores/__init__.py``):

* the run spec is ``runs/<run_id>/spec.json`` in the control store (else ``spec.json`` in the local
  run directory ``$GRADLAB_HOME/runs/<run_id>/``, for a run never recorded in the stores);
* without STEP: the promoted checkpoint (``promotion.json``), else the newest published one
  (``publications/``), else the newest local checkpoint in the run directory;
* with STEP: the published checkpoint at that step, else the local one.

The local copy in the run directory is used when it exists and verifies (every file's sha256, and the
manifest's step and policy sha256 equal the receipt's); otherwise the published copy is downloaded
(every file checked against its publication receipt) into
``$GRADLAB_HOME/cache/checkpoints/<run_id>/<step:012d>-<sha16>/`` and reused from there while it
verifies. A Hugging Face repository (``hf://OWNER/NAME``) is not resolved here: it is
:func:`gradlab.share.hub.load_repo`'s, a floor above.

``gradlab eval``, ``export``, ``publish``, ``train --init-from``, ``play`` and the player's catalog
resolve through :func:`resolve_checkpoint`; ``gradlab play`` also takes a checkpoint's URI in the
model store (``s3://.../runs/<run_id>/checkpoints/<step>-<sha16>/``, :func:`resolve_store_uri`). Importing this module imports neither torch nor the
stores.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradlab.errors import ConfigError, Conflict, IntegrityError, NotFound

if TYPE_CHECKING:
    from gradlab.receipts.models import CheckpointPublication
    from gradlab.settings import Settings
    from gradlab.stores import Stores

logger = logging.getLogger(__name__)

SPEC_FILE = "spec.json"
CACHE_DIR = Path("cache") / "checkpoints"
"""Downloaded checkpoints, under ``$GRADLAB_HOME``: ``cache/checkpoints/<run_id>/<step:012d>-<sha16>/``."""

#: A checkpoint's URI in a model store: ``.../runs/<run_id>/checkpoints/<step:012d>-<sha16>/``.
_S3_CHECKPOINT = re.compile(r"/runs/(?P<run>[^/]+)/checkpoints/(?P<step>\d{12})-[0-9a-f]{16}/?$")

#: Called with a one-line note when a copy is passed over (a damaged local or cached copy, a
#: publication receipt that could not be read); the commands print it on stderr.
Warn = Callable[[str], None]


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """A verified local checkpoint folder and the run spec it is evaluated under.

    Attributes:
        path: the checkpoint folder (verified against its manifest).
        spec: the resolved run spec JSON (``gradlab.contracts.run_spec.RunSpec``).
        spec_source: where the spec was read (file path or store URL), for error messages.
        origin: ``directory`` (given as a folder), ``local`` (the run directory's copy),
            ``cache`` (an earlier download) or ``downloaded`` (fetched from the model store now);
            ``hub`` for a Hugging Face repository (built by the commands from
            :func:`gradlab.share.hub.load_repo`).
        fallback: for a bare ``RUN_ID`` whose run promoted no checkpoint, what was taken instead
            (``"the newest published checkpoint (step N)"``); None when the ref named the checkpoint
            or the promoted one was taken. Commands that publish or export warn with it.
    """

    path: Path
    spec: dict[str, Any]
    spec_source: str
    origin: str
    fallback: str | None = None


def _checkpoint_step(path: Path) -> int | None:
    head = path.name.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _read_spec_file(spec_file: Path) -> dict[str, Any]:
    if not spec_file.is_file():
        raise NotFound(f"{spec_file}: the run spec is missing (needed to rebuild the goal's environment)")
    try:
        return json.loads(spec_file.read_text())
    except json.JSONDecodeError as e:
        raise IntegrityError(f"{spec_file}: expected the run spec as JSON, found invalid JSON ({e})") from None


def _verified(path: Path, *, step: int, sha256: str, what: str,
              publication: CheckpointPublication | None = None) -> Path:
    """``path`` after :func:`verify_checkpoint` and a check that it is checkpoint (step, sha256);
    with a ``publication``, every file is checked against the publication receipt's hashes (the
    control store), not only against the folder's own manifest.

    Raises:
        NotFound, IntegrityError: as :func:`gradlab.checkpoints.verify_checkpoint` and
            :func:`gradlab.checkpoints.verify_against_publication` (naming the file and both
            hashes), or the manifest names another step or policy sha256 than ``what`` says.
    """
    from gradlab.checkpoints import verify_against_publication, verify_checkpoint

    manifest = verify_checkpoint(path) if publication is None else verify_against_publication(path, publication.files)
    if (manifest.step, manifest.sha256) != (step, sha256):
        raise IntegrityError(f"{path}/manifest.json: expected step {step} sha256 {sha256} ({what}), "
                             f"found step {manifest.step} sha256 {manifest.sha256}")
    return path


def _materialize(stores: Stores, settings: Settings, run_id: str, step: int, sha256: str,
                 publication: CheckpointPublication | None, *, what: str, warn: Warn,
                 check_store: bool = False) -> tuple[Path, str]:
    """A verified local folder for checkpoint (step, sha256): the run directory's copy, else the cache.

    Returns:
        (folder, origin) with origin ``local``, ``cache`` or ``downloaded``.

    Raises:
        NotFound: no verified local copy and no publication to download.
        IntegrityError: the run directory's copy or a downloaded file differs from its
            publication receipt (naming the file and both hashes).
        StoreUnavailable: the model store cannot be reached.
    """
    from gradlab import receipts as rules
    from gradlab.stores import keys

    name = keys.checkpoint_name(step, sha256)
    local = settings.run_dir(run_id) / "checkpoints" / name
    if local.is_dir():
        from gradlab.checkpoints import verify_checkpoint

        try:
            verify_checkpoint(local)
        except (IntegrityError, NotFound) as e:  # damaged (fails its own manifest): the published copy
            if publication is None:
                raise
            warn(f"local copy fails verification ({e}); using the published copy")
        else:
            # Intact by its own manifest, so it must be the published bytes: a copy whose manifest
            # was rewritten with its files is refused, naming the file and both hashes.
            folder = _verified(local, step=step, sha256=sha256, what=what, publication=publication)
            if check_store and publication is not None:
                try:  # the copy evaluations and promotion read: say when it no longer verifies
                    rules.verify_published(stores, publication)
                except (IntegrityError, NotFound) as e:
                    warn(f"the published copy of {what} fails verification ({e}); using the local copy, "
                         "which matches the publication receipt")
            return folder, "local"
    if publication is None:
        raise NotFound(f"run {run_id}: {what} (step {step}, sha256 {sha256[:16]}) is neither published "
                       f"({stores.control.url(keys.publication(run_id, step, sha256))} missing) nor under "
                       f"{settings.run_dir(run_id) / 'checkpoints'}")
    cache = settings.home / CACHE_DIR / run_id / name
    if cache.is_dir():
        try:
            return _verified(cache, step=step, sha256=sha256, what=what, publication=publication), "cache"
        except (IntegrityError, NotFound) as e:
            warn(f"cached copy fails verification ({e}); downloading again")
            shutil.rmtree(cache)
    try:
        rules.download_checkpoint(stores, publication, cache)
    except Conflict:  # another process downloaded it at the same moment: use theirs if it verifies
        return _verified(cache, step=step, sha256=sha256, what=what, publication=publication), "cache"
    return _verified(cache, step=step, sha256=sha256, what=what, publication=publication), "downloaded"


def _check_published_copy(path: Path, *, settings: Settings | None, stores: Stores | None, warn: Warn) -> None:
    """A checkpoint folder named by path is checked against its publication receipt when its run
    published it (the folder's own manifest could have been rewritten with its files).

    Raises:
        IntegrityError: a file differs from the publication receipt (named, with both hashes).
    """
    from gradlab.checkpoints import read_manifest, verify_against_publication
    from gradlab.errors import StoreUnavailable
    from gradlab.receipts.io import read_optional
    from gradlab.receipts.models import CheckpointPublication
    from gradlab.stores import keys, open_stores

    manifest = read_manifest(path)
    try:
        stores = stores or open_stores(settings)
        pub = read_optional(stores.control, keys.publication(manifest.run_id, manifest.step, manifest.sha256),
                            CheckpointPublication)
    except (StoreUnavailable, ConfigError) as e:
        warn(f"{path}: publication receipt not checked ({e}); verifying against its manifest only")
        return
    if pub is not None:
        verify_against_publication(path, pub.files)


def resolve_checkpoint(ref: str, *, settings: Settings | None = None, stores: Stores | None = None,
                       warn: Warn | None = None, check_store: bool = False) -> ResolvedCheckpoint:
    """The checkpoint folder and run spec for a directory or ``RUN_ID[:STEP]`` (see the module docstring).

    Args:
        ref: a checkpoint directory, ``RUN_ID`` or ``RUN_ID:STEP`` (STEP in env steps).
        settings: default :func:`gradlab.settings.load_settings`.
        stores: default :func:`gradlab.stores.open_stores` of ``settings``.
        warn: called with each note about a copy passed over (:data:`Warn`); default: logged as a
            warning.
        check_store: when a verified local copy of a published checkpoint is used, also re-read the
            model store's copy and ``warn`` when it no longer matches the publication receipt
            (``gradlab eval`` does: evaluations and promotion read the store's copy).

    Returns:
        The verified local folder (possibly downloaded) with the run spec JSON.

    Raises:
        NotFound: no such directory, run, step or checkpoint (naming what was looked for and where).
        IntegrityError: the chosen checkpoint fails verification and has no good published copy.
        StoreUnavailable: a store cannot be reached (transient).
    """
    from gradlab.checkpoints import list_checkpoints

    warn = warn or logger.warning
    if ref.startswith("file://"):  # the URIs receipts print for file stores
        ref = ref.removeprefix("file://")
    path = Path(ref).expanduser()
    try:
        is_dir = path.is_dir()
    except OSError:  # a name the OS refuses (too long): not a folder; the run-id checks name it below
        is_dir = False
    if is_dir:
        if not (path / "manifest.json").is_file():
            raise NotFound(f"{path}: not a checkpoint directory (no manifest.json)")
        path = path.resolve()
        _check_published_copy(path, settings=settings, stores=stores, warn=warn)
        spec_file = path.parent.parent / SPEC_FILE
        if spec_file.is_file():
            return ResolvedCheckpoint(path=path, spec=_read_spec_file(spec_file), spec_source=str(spec_file),
                                      origin="directory")
        # A published copy (model store) has no run directory around it: its manifest names the run,
        # whose spec the control store holds.
        import json

        from gradlab import receipts as rules
        from gradlab.stores import keys, open_stores

        run_id = json.loads((path / "manifest.json").read_text()).get("run_id")
        stores = stores or open_stores(settings)
        try:
            spec = rules.read_run_spec(stores, str(run_id))
        except NotFound:
            raise NotFound(f"{path}: no run spec beside it ({spec_file}) and no run {run_id} in "
                           f"{stores.control.url(keys.run_spec(str(run_id)))}") from None
        return ResolvedCheckpoint(path=path, spec=spec, spec_source=stores.control.url(keys.run_spec(str(run_id))),
                                  origin="directory")
    if "/" in ref or ref.startswith("."):
        raise NotFound(f"{ref}: no such checkpoint directory")

    from gradlab import receipts as rules
    from gradlab.settings import load_settings
    from gradlab.stores import keys, open_stores

    settings = settings or load_settings()
    stores = stores or open_stores(settings)
    run_id, _, step_text = ref.partition(":")
    if step_text and not step_text.isdigit():
        raise NotFound(f"{ref}: STEP must be a non-negative integer, found {step_text!r}")
    run_dir = settings.run_dir(run_id)
    spec_url = stores.control.url(keys.run_spec(run_id))
    try:
        spec, spec_source = rules.read_run_spec(stores, run_id), spec_url
    except NotFound:
        if not run_dir.is_dir():
            raise NotFound(f"{ref}: neither a checkpoint directory nor a run (no {spec_url} in the control store "
                           f"and no {run_dir}); expected RUN_ID[:STEP] (see `gradlab runs list`) or a "
                           "checkpoint folder") from None
        spec, spec_source = _read_spec_file(run_dir / SPEC_FILE), str(run_dir / SPEC_FILE)
    publications = rules.list_publications(stores, run_id)
    promotion = rules.read_promotion(stores, run_id)
    local = list_checkpoints(run_dir)

    def done(folder: Path, origin: str, fallback: str | None = None) -> ResolvedCheckpoint:
        return ResolvedCheckpoint(path=folder, spec=spec, spec_source=spec_source, origin=origin, fallback=fallback)

    def local_newest(candidates: list[Path], what: str, fallback: bool = False) -> ResolvedCheckpoint:
        from gradlab.checkpoints import verify_checkpoint

        folder = candidates[-1]
        manifest = verify_checkpoint(folder)
        logger.info("run %s: %s is the local checkpoint %s (not published)", run_id, what, folder)
        return done(folder, "local", f"{what} (step {manifest.step}, local, not published)" if fallback else None)

    if step_text:
        step = int(step_text)
        pubs = [p for p in publications if p.step == step]
        if pubs:
            pub = pubs[-1]
            return done(*_materialize(stores, settings, run_id, pub.step, pub.sha256, pub, what=f"step {step}",
                                      warn=warn, check_store=check_store))
        matches = [p for p in local if _checkpoint_step(p) == step]
        if matches:
            return local_newest(matches, f"step {step}")
        steps = sorted({p.step for p in publications} | {s for p in local if (s := _checkpoint_step(p)) is not None})
        raise NotFound(f"run {run_id}: no checkpoint at step {step} (steps: {', '.join(map(str, steps)) or 'none'})")
    if promotion is not None:
        pub = next((p for p in publications
                    if (p.step, p.sha256) == (promotion.checkpoint_step, promotion.checkpoint_sha256)), None)
        return done(*_materialize(stores, settings, run_id, promotion.checkpoint_step, promotion.checkpoint_sha256,
                                  pub, what="the promoted checkpoint", warn=warn, check_store=check_store))
    if publications:
        pub = publications[-1]
        return done(*_materialize(stores, settings, run_id, pub.step, pub.sha256, pub,
                                  what="the newest published checkpoint", warn=warn, check_store=check_store),
                    fallback=f"the newest published checkpoint (step {pub.step})")
    if local:
        return local_newest(local, "the newest checkpoint", fallback=True)
    raise NotFound(f"run {run_id}: no checkpoint (no promotion or publication under "
                   f"{stores.control.url(keys.run_prefix(run_id))}, nothing under {run_dir / 'checkpoints'})")


def resolve_store_uri(uri: str, *, stores: Stores, settings: Settings | None = None,
                      warn: Warn | None = None) -> ResolvedCheckpoint:
    """A checkpoint named by its URI in the configured model store, as :func:`resolve_checkpoint`
    resolves ``RUN_ID:STEP``, then checked to be the checkpoint the URI names.

    Args:
        uri: ``s3://BUCKET/PREFIX/runs/<run_id>/checkpoints/<step:012d>-<sha16>/``.
        stores: the configured stores (their publication receipts are the authority).
        settings: default :func:`gradlab.settings.load_settings`.
        warn: as for :func:`resolve_checkpoint`.

    Returns:
        The verified local folder (possibly downloaded) with the run spec JSON.

    Raises:
        NotFound: not a checkpoint URI, or the run's checkpoint at that step is not that sha16
            (and as :func:`resolve_checkpoint`).
        ConfigError: the URI names another model store than the configured one.
    """
    from gradlab.checkpoints import read_manifest

    m = _S3_CHECKPOINT.search(uri)
    if m is None:
        raise NotFound(f"{uri}: expected a checkpoint URI .../runs/<run_id>/checkpoints/<step>-<sha16>/")
    # The URI is looked up in the configured stores (their publication receipts are the authority), so
    # it must name the configured model store and the exact checkpoint, not just a run and a step.
    store = uri[:m.start()]
    if store != stores.model.base_url.rstrip("/"):
        raise ConfigError(f"{uri}: names the model store {store}, but the configured model store is "
                          f"{stores.model.base_url} (set GRADLAB_MODEL_STORE_URL and GRADLAB_CONTROL_STORE_URL "
                          "to play from another store)")
    resolved = resolve_checkpoint(f"{m['run']}:{int(m['step'])}", settings=settings, stores=stores, warn=warn)
    sha16 = uri.rstrip("/").rsplit("-", 1)[1]
    found = read_manifest(resolved.path).sha256
    if not found.startswith(sha16):
        raise NotFound(f"{uri}: run {m['run']} has no checkpoint {sha16} at step {int(m['step'])} "
                       f"(its checkpoint there is {found[:16]})")
    return resolved
