"""The pre-migrated Prefect database (``gradlab.runs.prefect_db``) on real SQLite files: what the
copy keeps and empties, its sha256 record, and a copy that does not match it refused. A real
Prefect server starting from it: ``tests/cli/test_daemon.py``."""

from __future__ import annotations

import json
import logging
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from gradlab.runs import prefect_db


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GRADLAB_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "cache"


def _server_database(home: Path) -> sqlite3.Connection:
    """A database as a running server holds it: WAL mode, a connection open, a flow run and a
    per-database secret written after the migrations and the block types."""
    home.mkdir(parents=True)
    db = sqlite3.connect(home / prefect_db.DATABASE, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.executescript("""
        CREATE TABLE alembic_version (version_num TEXT);  INSERT INTO alembic_version VALUES ('head1');
        CREATE TABLE block_type (id TEXT, name TEXT);     INSERT INTO block_type VALUES ('1', 'secret');
        CREATE TABLE block_schema (id TEXT);              INSERT INTO block_schema VALUES ('s1');
        CREATE TABLE flow_run (id TEXT, name TEXT);       INSERT INTO flow_run VALUES ('r1', 'a-run');
        CREATE TABLE configuration (key TEXT, value TEXT); INSERT INTO configuration VALUES ('ENCRYPTION_KEY', 'k');
    """)
    return db


def _rows(path: Path) -> dict[str, int]:
    with closing(sqlite3.connect(path)) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: db.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}


def test_the_copy_keeps_migrations_and_block_types_only_and_a_new_home_starts_from_it(cache: Path,
                                                                                     tmp_path: Path) -> None:
    live = _server_database(tmp_path / "first")
    try:
        kept = prefect_db.save(tmp_path / "first")  # while the "server" still has it open
    finally:
        live.close()
    folder = prefect_db.template_dir()
    assert kept == folder / prefect_db.DATABASE and folder.parent == cache / "prefect-db"
    assert _rows(kept) == {"alembic_version": 1, "block_type": 1, "block_schema": 1, "flow_run": 0, "configuration": 0}
    record = json.loads((folder / prefect_db.RECORD).read_text())
    assert record["sha256"] == prefect_db._sha256(kept)
    assert record["collections"] == prefect_db.installed_collections()
    assert sorted(p.name for p in folder.iterdir()) == [prefect_db.DATABASE, prefect_db.RECORD]
    assert prefect_db.save(tmp_path / "first") is None  # one copy per Prefect version

    new = tmp_path / "second"
    new.mkdir()
    # The same collections as when the copy was taken: its server need not register block types.
    assert prefect_db.seed(new) == prefect_db.REGISTERED
    assert _rows(new / prefect_db.DATABASE)["block_type"] == 1
    assert prefect_db.seed(new) is None  # a home with a database keeps it
    assert prefect_db.seed(tmp_path / "first") is None


def test_a_copy_taken_with_other_prefect_collections_is_used_and_its_server_registers_block_types(
        cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _server_database(tmp_path / "first").close()
    prefect_db.save(tmp_path / "first")
    record_path = prefect_db.template_dir() / prefect_db.RECORD
    record = json.loads(record_path.read_text())
    # A collection (it adds block types) installed since, or a record from before collections were listed.
    for collections in ([*record["collections"], "aws=prefect-aws==0.5.0"], None):
        record_path.write_text(json.dumps({**record, "collections": collections}))
        new = tmp_path / f"new-{collections is None}"
        new.mkdir()
        with caplog.at_level(logging.INFO, logger="gradlab.runs.prefect_db"):
            assert prefect_db.seed(new) == {}
        assert _rows(new / prefect_db.DATABASE)["block_type"] == 1
        assert "block types registered again (other Prefect collections)" in caplog.text
    # The daemon keeps that server's database (registered with this installation's collections) instead.
    kept = prefect_db.save(new)
    assert kept == prefect_db.template_dir() / prefect_db.DATABASE
    replaced = json.loads(record_path.read_text())
    assert replaced["collections"] == prefect_db.installed_collections() and replaced["sha256"] == prefect_db._sha256(kept)
    newest = tmp_path / "newest"
    newest.mkdir()
    assert prefect_db.seed(newest) == prefect_db.REGISTERED


def test_a_copy_that_does_not_match_its_record_is_removed_not_used(cache: Path, tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    _server_database(tmp_path / "first").close()
    kept = prefect_db.save(tmp_path / "first")
    with kept.open("r+b") as f:  # one byte changed on disk
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0xFF]))
    new = tmp_path / "second"
    new.mkdir()
    with caplog.at_level(logging.WARNING, logger="gradlab.runs.prefect_db"):
        assert prefect_db.seed(new) is None
    assert "its record says" in caplog.text and str(kept) in caplog.text
    assert not (new / prefect_db.DATABASE).exists() and not kept.parent.exists()

    # A record that is not a JSON object: no copy is used, and the next server's database replaces it.
    _server_database(tmp_path / "third").close()
    prefect_db.save(tmp_path / "third")
    (kept.parent / prefect_db.RECORD).write_text("[]")
    with caplog.at_level(logging.WARNING, logger="gradlab.runs.prefect_db"):
        assert prefect_db.seed(new) is None
    assert "is not a JSON object" in caplog.text and not (new / prefect_db.DATABASE).exists()
    assert prefect_db.save(tmp_path / "third") == kept and prefect_db.seed(new) == prefect_db.REGISTERED


def test_nothing_is_kept_for_another_database_nor_from_one_not_migrated_yet(cache: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "early"
    home.mkdir()
    with closing(sqlite3.connect(home / prefect_db.DATABASE)) as db:
        db.execute("CREATE TABLE alembic_version (version_num TEXT)")
        db.execute("CREATE TABLE block_type (id TEXT)")  # no block types registered yet
        db.commit()
    assert prefect_db.save(home) is None
    assert not [p for p in cache.rglob("*") if p.is_file()]  # no partial left behind
    _server_database(tmp_path / "first").close()
    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", "postgresql+asyncpg://u:p@127.0.0.1/prefect")
    assert prefect_db.template_dir() is None and prefect_db.save(tmp_path / "first") is None


def test_a_cache_that_cannot_be_written_keeps_nothing_and_raises_nothing(cache: Path, tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """The cache is a file, or its version folder is: a warning, nothing left, no exception (the
    daemon's server goes on)."""
    _server_database(tmp_path / "first").close()
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="gradlab.runs.prefect_db"):
        assert prefect_db.save(tmp_path / "first") is None
    assert "could not keep a pre-migrated copy" in caplog.text and cache.read_text() == "not a folder"
    cache.unlink()
    folder = prefect_db.template_dir()
    folder.parent.mkdir(parents=True)
    folder.write_text("a file where the version's folder goes")
    assert prefect_db.save(tmp_path / "first") is None and folder.is_file()


def test_a_copy_whose_record_matches_this_installation_is_replaced_when_it_is_not_whole(
        cache: Path, tmp_path: Path) -> None:
    """A missing database, a folder in its place, or bytes that are not its record's: the next
    server's database replaces it (before, a matching record kept a broken copy for good)."""
    _server_database(tmp_path / "first").close()
    kept = prefect_db.save(tmp_path / "first")
    assert prefect_db.save(tmp_path / "first") is None  # whole and current: nothing to do
    kept.unlink()
    assert prefect_db.save(tmp_path / "first") == kept
    kept.unlink()
    (kept / "inside").mkdir(parents=True)
    assert prefect_db.save(tmp_path / "first") == kept and kept.is_file()
    kept.write_bytes(b"not the recorded bytes")
    assert prefect_db.save(tmp_path / "first") == kept and prefect_db._current(kept.parent)


def test_a_copy_that_is_not_a_database_is_refused_even_with_its_records_sha256(cache: Path, tmp_path: Path,
                                                                                caplog: pytest.LogCaptureFixture) -> None:
    _server_database(tmp_path / "first").close()
    kept = prefect_db.save(tmp_path / "first")
    record_path = kept.parent / prefect_db.RECORD
    kept.write_bytes(bytes(range(256)) * 16)  # 4 KiB that are not SQLite
    record_path.write_text(json.dumps({**json.loads(record_path.read_text()), "sha256": prefect_db._sha256(kept)}))
    new = tmp_path / "second"
    new.mkdir()
    with caplog.at_level(logging.WARNING, logger="gradlab.runs.prefect_db"):
        assert prefect_db.seed(new) is None
    assert "file is not a database" in caplog.text and "removed" in caplog.text
    assert not (new / prefect_db.DATABASE).exists() and not kept.parent.exists()  # the next save keeps a good one

    # An SQLite file with its record's sha256 but no block types: removed too, and replaced by the next save.
    prefect_db.save(tmp_path / "first")
    with closing(sqlite3.connect(kept)) as db:
        db.execute("DELETE FROM block_type")
        db.commit()
    record_path.write_text(json.dumps({**json.loads(record_path.read_text()), "sha256": prefect_db._sha256(kept)}))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gradlab.runs.prefect_db"):
        assert prefect_db.seed(new) is None
    assert "not a Prefect database with a migrations' revision and block types" in caplog.text
    assert not kept.parent.exists() and prefect_db.save(tmp_path / "first") == kept
    assert prefect_db.seed(new) == prefect_db.REGISTERED


def test_a_home_or_cache_path_with_uri_characters_is_read_as_named(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite reads these files by URI: a '#', '?' or '%' in a folder's name is part of the path."""
    monkeypatch.setenv("GRADLAB_CACHE_DIR", str(tmp_path / "cache #1 ?%41"))
    for name in ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL"):
        monkeypatch.delenv(name, raising=False)
    _server_database(tmp_path / "home #1 ?%41").close()
    kept = prefect_db.save(tmp_path / "home #1 ?%41")
    assert kept is not None and "cache #1 ?%41" in str(kept)
    new = tmp_path / "new #2"
    new.mkdir()
    assert prefect_db.seed(new) == prefect_db.REGISTERED


def test_a_rejected_copy_is_removed_with_the_home_database_seeded_from_it(cache: Path, tmp_path: Path) -> None:
    """The daemon's answer to a server that exited while starting on a seeded database (a file
    Prefect cannot open, e.g. another build's migrations): the next start migrates its own."""
    _server_database(tmp_path / "first").close()
    kept = prefect_db.save(tmp_path / "first")
    new = tmp_path / "second"
    new.mkdir()
    assert prefect_db.seed(new) == prefect_db.REGISTERED
    (new / f"{prefect_db.DATABASE}-wal").write_bytes(b"")
    prefect_db.reject(new)
    assert not kept.parent.exists() and list(new.iterdir()) == []


def test_a_record_that_is_a_fifo_is_not_read(cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import os

    _server_database(tmp_path / "first").close()
    kept = prefect_db.save(tmp_path / "first")
    (kept.parent / prefect_db.RECORD).unlink()
    os.mkfifo(kept.parent / prefect_db.RECORD)
    assert prefect_db._record(kept.parent) == {}  # would block on open
    new = tmp_path / "second"
    new.mkdir()
    with caplog.at_level(logging.WARNING, logger="gradlab.runs.prefect_db"):
        assert prefect_db.seed(new) is None
    assert "template.json is not a regular file" in caplog.text
    assert prefect_db.save(tmp_path / "first") == kept and prefect_db.seed(new) == prefect_db.REGISTERED


def test_a_save_killed_midway_leaves_partials_that_a_later_save_removes(cache: Path, tmp_path: Path) -> None:
    import os
    import time

    _server_database(tmp_path / "first").close()
    folder = prefect_db.template_dir()
    folder.mkdir(parents=True)
    old, fresh = folder / "prefect.db.999999.partial", folder / "template.json.888888.partial"
    for path in (old, fresh):
        path.write_bytes(b"x")
    an_hour_ago = time.time() - prefect_db.STALE_PARTIAL_S - 60
    os.utime(old, (an_hour_ago, an_hour_ago))
    assert prefect_db.save(tmp_path / "first") is not None
    assert not old.exists() and fresh.exists()  # a save that may still be running keeps its files


def test_the_users_own_registration_off_is_detected_and_said(cache: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    _server_database(tmp_path / "first").close()
    prefect_db.save(tmp_path / "first")
    record_path = prefect_db.template_dir() / prefect_db.RECORD
    record_path.write_text(json.dumps({**json.loads(record_path.read_text()), "collections": ["x=prefect-x==1"]}))
    monkeypatch.setenv("PREFECT_SERVER_REGISTER_BLOCKS_ON_START", "False")
    assert not prefect_db.registration_on()  # what the daemon checks before it keeps a copy
    new = tmp_path / "second"
    new.mkdir()
    with caplog.at_level(logging.INFO, logger="gradlab.runs.prefect_db"):
        assert prefect_db.seed(new) == {}
    assert "not registered (PREFECT_SERVER_REGISTER_BLOCKS_ON_START is off)" in caplog.text
    monkeypatch.setenv("PREFECT_SERVER_REGISTER_BLOCKS_ON_START", "true")
    assert prefect_db.registration_on()
