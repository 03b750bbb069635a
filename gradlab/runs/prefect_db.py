"""A pre-migrated database for a new local Prefect server (docs/ARCHITECTURE.md section 11).

A Prefect server on an empty SQLite database runs every migration and registers its block types
before it answers: about half of its start-up here (9.1 s against 5.1 s in one quiet run each of
``gradlab benchmark run``, docs/BENCHMARKS.md). So the daemon (:mod:`gradlab.runs.daemon`) keeps, per
Prefect version, a copy of a database with both done, taken from the first server it starts on an
empty one, and a server of a new ``GRADLAB_HOME`` starts from a copy of that.

The copy (``<cache>/prefect-db/<prefect version>/prefect.db``, ``<cache>`` being
``GRADLAB_CACHE_DIR``, default ``$XDG_CACHE_HOME/gradlab`` or ``~/.cache/gradlab``) keeps only
the migrations' revision and the block types and schemas; every other table is emptied (Prefect
keeps per-database secrets in ``configuration``, and a command may already have created its flow
run when the copy is taken). Beside it, ``template.json`` records its sha256; a copy that does
not match is removed and not used. Only for Prefect's default database (no
``PREFECT_API_DATABASE_CONNECTION_URL`` / ``PREFECT_SERVER_DATABASE_CONNECTION_URL``).

The record also lists the Prefect collections installed when the copy was taken (the
``prefect.collections`` entry points: they add block types). A server starting on a copy whose
list is this installation's skips block registration (:data:`REGISTERED`): the copy has every
block type it would register, and registering them again costs ~0.3 s of a ~3.5 s start-up here.
Prefect's own record of a registration (``memo_store.toml``) cannot say so: it hashes the
database URL, which names each home's file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sqlite3
import time
from contextlib import closing
from importlib.metadata import PackageNotFoundError, entry_points, version
from pathlib import Path

log = logging.getLogger(__name__)

#: Tables whose rows the copy keeps: what migrations and block registration write.
KEPT_TABLES = frozenset({"alembic_version", "block_type", "block_schema", "block_schema_reference"})
DATABASE = "prefect.db"
RECORD = "template.json"
_URL_VARIABLES = ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL")

#: Settings of a server starting on a copy that has this installation's block types: no block
#: registration, and no hashing of the block registry to decide on one.
REGISTERED = {"PREFECT_SERVER_REGISTER_BLOCKS_ON_START": "false",
              "PREFECT_SERVER_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false"}


def cache_dir() -> Path:
    """gradlab's cache folder: ``GRADLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/gradlab``, else ``~/.cache/gradlab``."""
    if value := os.environ.get("GRADLAB_CACHE_DIR"):
        return Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gradlab"


def template_dir() -> Path | None:
    """The folder of this Prefect version's copy; None when Prefect is not installed or the server
    uses another database than its default SQLite file."""
    if any(os.environ.get(name) for name in _URL_VARIABLES):
        return None
    try:
        prefect_version = version("prefect")
    except PackageNotFoundError:
        return None
    return cache_dir() / "prefect-db" / prefect_version


def _record(folder: Path) -> dict:
    """The copy's record (empty when there is none or it cannot be read; only a regular file is read)."""
    try:
        if not (folder / RECORD).is_file():
            return {}
        record = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def installed_collections() -> list[str]:
    """The Prefect collections installed here (``prefect.collections`` entry points) as sorted
    ``NAME=DIST==VERSION`` strings; ~10 ms."""
    return sorted(f"{ep.name}={ep.dist.name if ep.dist else ''}=={ep.dist.version if ep.dist else ''}"
                  for ep in entry_points(group="prefect.collections"))


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def seed(prefect_home: Path) -> dict[str, str] | None:
    """Give a server that has no database yet the pre-migrated copy.

    Nothing happens when ``prefect_home`` has a database already, or there is no copy for this
    Prefect version. What is checked against the record's sha256 is the copied file itself, before
    it takes the database's name; a copy that does not match is removed (and logged), not used.

    Returns:
        None when no copy was given; else the Prefect settings to start its server with:
        :data:`REGISTERED` when the copy's collections are this installation's, else none (the
        server registers its block types as usual).
    """
    target = Path(prefect_home) / DATABASE
    folder = template_dir()
    if folder is None or target.exists() or not (folder / RECORD).exists():
        return None
    partial = target.with_name(DATABASE + ".partial")
    try:
        if not (folder / RECORD).is_file():
            raise ValueError(f"{folder / RECORD} is not a regular file")
        record = json.loads((folder / RECORD).read_text())
        if not isinstance(record, dict):
            raise ValueError(f"{folder / RECORD} is not a JSON object")
        if not (folder / DATABASE).is_file():
            raise FileNotFoundError(f"{folder / DATABASE} is missing or not a regular file")
        shutil.copyfile(folder / DATABASE, partial)
        found = _sha256(partial)
    except (OSError, ValueError) as e:
        log.warning("pre-migrated Prefect database %s unreadable (%s): the server migrates its own", folder, e)
        partial.unlink(missing_ok=True)
        return None
    try:
        if found != record.get("sha256"):
            raise ValueError(f"sha256 {found}, its record says {record.get('sha256')}")
        _check_database(partial)
    except (ValueError, sqlite3.Error) as e:  # not the copy that was kept, or not one Prefect can use
        partial.unlink(missing_ok=True)
        log.warning("pre-migrated Prefect database %s: %s: %s; the server migrates its own", folder / DATABASE, e,
                    "removed" if _remove(folder) else f"could not remove {folder}")
        return None
    os.replace(partial, target)
    registered = record.get("collections") == installed_collections()
    blocks = ("as registered there" if registered else "registered again (other Prefect collections)"
              if registration_on() else "not registered (PREFECT_SERVER_REGISTER_BLOCKS_ON_START is off)")
    log.info("prefect database from the pre-migrated copy %s (sha256 %s); block types %s", folder / DATABASE,
             found[:12], blocks)
    return dict(REGISTERED) if registered else {}


def registration_on() -> bool:
    """Whether a server started with this environment registers its block types (a user's own
    ``PREFECT_SERVER_REGISTER_BLOCKS_ON_START`` can turn it off; a copy is kept only from a server
    that registered them)."""
    value = os.environ.get("PREFECT_SERVER_REGISTER_BLOCKS_ON_START", "true").strip().lower()
    return value not in ("false", "0", "no", "off", "f", "n")


def _check_database(path: Path) -> None:
    """Raise ``sqlite3.DatabaseError`` unless ``path`` is an SQLite database with a migrations'
    revision and block types (a file whose sha256 matches a record may still be neither)."""
    with closing(sqlite3.connect(_read_only_uri(path), uri=True)) as db:
        revision = db.execute("SELECT version_num FROM alembic_version").fetchone()
        blocks = db.execute("SELECT count(*) FROM block_type").fetchone()[0]
    if not revision or not blocks:
        raise sqlite3.DatabaseError("not a Prefect database with a migrations' revision and block types")


def _read_only_uri(path: Path) -> str:
    """SQLite's read-only URI of ``path`` (percent-encoded: a ``#``, ``?`` or ``%`` in a folder's
    name stays part of the path)."""
    return f"{Path(path).absolute().as_uri()}?mode=ro"


def _remove(folder: Path) -> bool:
    """Remove a copy's folder; False when it could not be (each new home then finds it again)."""
    shutil.rmtree(folder, ignore_errors=True)
    return not folder.exists()


def reject(prefect_home: Path) -> None:
    """A server seeded from the copy exited while starting: remove the copy (a file with its
    record's sha256 can still be a database Prefect cannot open, e.g. another build's migrations)
    and this home's seeded database, so the next start, here or in a new home, migrates its own."""
    folder = template_dir()
    for name in (DATABASE, f"{DATABASE}-wal", f"{DATABASE}-shm"):
        (Path(prefect_home) / name).unlink(missing_ok=True)
    copy = "" if folder is None else (f", and the copy {folder}" if _remove(folder) else f"; could not remove {folder}")
    log.warning("the Prefect server exited while starting on the pre-migrated database: this home's database "
                "removed%s; the next start migrates its own", copy)


def save(prefect_home: Path) -> Path | None:
    """Keep a copy of a server's database that its migrations and block registration have written
    (call once it answers), unless this Prefect version has one taken with this installation's
    collections. Returns the copy's path, if made.

    The copy is taken with SQLite's online backup (consistent while the server writes), emptied of
    every table but :data:`KEPT_TABLES`, vacuumed, and recorded with its sha256; it appears whole
    or not at all (written aside, then renamed). A copy taken with other collections is replaced:
    the database first, then its record, so a :func:`seed` between the two renames finds them
    disagree, removes both, and its server migrates its own database (a slower start, once).
    """
    folder = template_dir()
    source = Path(prefect_home) / DATABASE
    if folder is None or not source.is_file() or _current(folder):
        return None
    partial = folder / f"{DATABASE}.{os.getpid()}.partial"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(folder)
        with closing(sqlite3.connect(_read_only_uri(source), uri=True, timeout=30)) as src, \
                closing(sqlite3.connect(partial)) as dst:
            src.backup(dst)
        with closing(sqlite3.connect(partial, isolation_level=None)) as db:
            db.execute("PRAGMA journal_mode = DELETE")  # one self-contained file, as copied
            tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                                   "AND name NOT LIKE 'sqlite_%'")]
            if "alembic_version" not in tables or not db.execute("SELECT count(*) FROM block_type").fetchone()[0]:
                raise sqlite3.DatabaseError("no migrations' revision or no block types yet")
            for table in tables:
                if table not in KEPT_TABLES:
                    db.execute(f'DELETE FROM "{table}"')
            db.execute("VACUUM")
        sha256 = _sha256(partial)
        if (folder / DATABASE).is_dir() and not (folder / DATABASE).is_symlink():
            shutil.rmtree(folder / DATABASE)  # not a copy: nothing of it to keep
        os.replace(partial, folder / DATABASE)
        record = folder / f"{RECORD}.{os.getpid()}.partial"
        record.write_text(json.dumps({"sha256": sha256, "prefect": folder.name, "created_at": time.time(),
                                      "collections": installed_collections()}))
        os.replace(record, folder / RECORD)
    except (OSError, sqlite3.Error) as e:
        log.warning("could not keep a pre-migrated copy of %s in %s (%s): the next new server migrates its own",
                    source, folder, e)
        for leftover in (partial, *(partial.with_name(partial.name + end) for end in ("-wal", "-shm", "-journal")),
                         folder / f"{RECORD}.{os.getpid()}.partial"):
            try:
                leftover.unlink(missing_ok=True)
            except OSError:
                pass  # an unwritable cache: nothing was written there either
        return None
    log.info("kept a pre-migrated copy of the Prefect database: %s (sha256 %s)", folder / DATABASE, sha256[:12])
    return folder / DATABASE


#: Seconds after which a ``*.partial`` file in the cache is a save that never finished (killed).
STALE_PARTIAL_S = 3600.0


def _current(folder: Path) -> bool:
    """Whether the folder's copy was taken with this installation's collections and is whole (its
    file's sha256 is its record's): then there is nothing to replace."""
    record = _record(folder)
    if record.get("collections") != installed_collections():
        return False
    try:
        return (folder / DATABASE).is_file() and _sha256(folder / DATABASE) == record.get("sha256")
    except OSError:
        return False


def _remove_stale_partials(folder: Path) -> None:
    """Remove what saves killed midway left (``*.partial*`` older than :data:`STALE_PARTIAL_S`; by
    age, not by pid: the cache may be shared with processes this one cannot see)."""
    now = time.time()
    for path in folder.glob("*.partial*"):
        try:
            if now - path.stat().st_mtime > STALE_PARTIAL_S:
                path.unlink()
        except OSError:
            continue
