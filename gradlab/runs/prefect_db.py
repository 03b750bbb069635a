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
not match is removed and not used. Prefect's record that the block types are registered
(``memo_store.toml``) is copied with it. Only for Prefect's default database (no
``PREFECT_API_DATABASE_CONNECTION_URL`` / ``PREFECT_SERVER_DATABASE_CONNECTION_URL``).
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
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

log = logging.getLogger(__name__)

#: Tables whose rows the copy keeps: what migrations and block registration write.
KEPT_TABLES = frozenset({"alembic_version", "block_type", "block_schema", "block_schema_reference"})
DATABASE = "prefect.db"
MEMO = "memo_store.toml"
RECORD = "template.json"
_URL_VARIABLES = ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL")


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


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def seed(prefect_home: Path) -> bool:
    """Give a server that has no database yet the pre-migrated copy. True when it was given one.

    Nothing happens when ``prefect_home`` has a database already, or there is no copy for this
    Prefect version. What is checked against the record's sha256 is the copied file itself, before
    it takes the database's name; a copy that does not match is removed (and logged), not used.
    """
    target = Path(prefect_home) / DATABASE
    folder = template_dir()
    if folder is None or target.exists() or not (folder / RECORD).is_file():
        return False
    partial = target.with_name(DATABASE + ".partial")
    try:
        record = json.loads((folder / RECORD).read_text())
        shutil.copyfile(folder / DATABASE, partial)
        found = _sha256(partial)
    except (OSError, ValueError) as e:
        log.warning("pre-migrated Prefect database %s unreadable (%s): the server migrates its own", folder, e)
        partial.unlink(missing_ok=True)
        return False
    if found != record.get("sha256"):
        log.warning("pre-migrated Prefect database %s: sha256 %s, its record says %s: removed, the server migrates "
                    "its own", folder / DATABASE, found, record.get("sha256"))
        partial.unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)
        return False
    os.replace(partial, target)
    if (folder / MEMO).is_file() and not (Path(prefect_home) / MEMO).exists():
        shutil.copyfile(folder / MEMO, Path(prefect_home) / MEMO)
    log.info("prefect database from the pre-migrated copy %s (sha256 %s)", folder / DATABASE, found[:12])
    return True


def save(prefect_home: Path) -> Path | None:
    """Keep a copy of a server's database that its migrations and block registration have written
    (call once it answers), unless this Prefect version has one. Returns the copy's path, if made.

    The copy is taken with SQLite's online backup (consistent while the server writes), emptied of
    every table but :data:`KEPT_TABLES`, vacuumed, and recorded with its sha256; it appears whole
    or not at all (written aside, then renamed).
    """
    folder = template_dir()
    source = Path(prefect_home) / DATABASE
    if folder is None or (folder / RECORD).is_file() or not source.is_file():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f"{DATABASE}.{os.getpid()}.partial"
    try:
        with closing(sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)) as src, \
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
        os.replace(partial, folder / DATABASE)
        if (Path(prefect_home) / MEMO).is_file():
            shutil.copyfile(Path(prefect_home) / MEMO, folder / MEMO)
        record = folder / f"{RECORD}.partial"
        record.write_text(json.dumps({"sha256": sha256, "prefect": folder.name, "created_at": time.time()}))
        os.replace(record, folder / RECORD)
    except (OSError, sqlite3.Error) as e:
        log.warning("could not keep a pre-migrated copy of %s (%s): the next new server migrates its own", source, e)
        for leftover in (partial, partial.with_name(partial.name + "-wal"), partial.with_name(partial.name + "-shm"),
                         partial.with_name(partial.name + "-journal")):
            leftover.unlink(missing_ok=True)
        return None
    log.info("kept a pre-migrated copy of the Prefect database: %s (sha256 %s)", folder / DATABASE, sha256[:12])
    return folder / DATABASE
