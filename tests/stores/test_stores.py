"""Object-store contract: one suite over ``file://`` and a real S3-protocol server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import multiprocessing
from pathlib import Path

import pytest

from gradlab.errors import (
    Conflict,
    ContractViolation,
    IntegrityError,
    NotFound,
    StoreUnavailable,
    TransientError,
)
from gradlab.settings import load_settings
from gradlab.stores import FileStore, ObjectStore, open_store, open_stores
from tests.concurrency import race
from tests.s3server import running_s3_server


def test_create_get_roundtrip(store: ObjectStore) -> None:
    etag = store.put_create_only("runs/r1/run.json", b'{"a":1}')
    assert store.get("runs/r1/run.json") == b'{"a":1}'
    data, etag2 = store.get_with_etag("runs/r1/run.json")
    assert (data, etag2) == (b'{"a":1}', etag)
    assert store.exists("runs/r1/run.json") is True
    assert store.exists("runs/r1/other.json") is False
    assert store.url("runs/r1/run.json") == store.base_url + "/runs/r1/run.json"


def test_file_etag_is_sha256_of_bytes(tmp_path: Path) -> None:
    store = open_store((tmp_path / "s").as_uri())
    assert store.put_create_only("k", b"abc") == hashlib.sha256(b"abc").hexdigest()
    # sha256("abc"), FIPS 180-2 appendix B.1
    assert store.get_with_etag("k")[1] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_identical_create_is_success_different_is_conflict(store: ObjectStore) -> None:
    first = store.put_create_only("runs/r1/promotion.json", b"same")
    assert store.put_create_only("runs/r1/promotion.json", b"same") == first
    with pytest.raises(Conflict, match="different bytes"):
        store.put_create_only("runs/r1/promotion.json", b"other")
    with pytest.raises(Conflict):
        store.put_verified("runs/r1/promotion.json", b"other")
    assert store.get("runs/r1/promotion.json") == b"same"


def test_eight_racing_creators_one_winner(store: ObjectStore) -> None:
    results = race(8, lambda i: store.put_create_only("runs/r1/promotion.json", f"creator-{i}".encode()))
    winners = [i for i, r in enumerate(results) if isinstance(r, str)]
    losers = [r for r in results if isinstance(r, Conflict)]
    assert len(winners) == 1
    assert len(losers) == 7
    assert store.get("runs/r1/promotion.json") == f"creator-{winners[0]}".encode()


def test_compare_and_swap(store: ObjectStore) -> None:
    e1 = store.put_if_match("runs/r1/index.json", b"v1", None)
    with pytest.raises(Conflict):
        store.put_if_match("runs/r1/index.json", b"again", None)  # must not exist
    e2 = store.put_if_match("runs/r1/index.json", b"v2", e1)
    assert e2 != e1
    with pytest.raises(Conflict, match="compare-and-swap lost"):
        store.put_if_match("runs/r1/index.json", b"v3", e1)  # stale etag refused
    assert store.get_with_etag("runs/r1/index.json") == (b"v2", e2)


def test_racing_compare_and_swap_loses_no_update(store: ObjectStore) -> None:
    key = "runs/r1/counter"
    store.put_if_match(key, b"0", None)

    def increment(_: int) -> int:
        while True:
            data, etag = store.get_with_etag(key)
            try:
                store.put_if_match(key, str(int(data) + 1).encode(), etag)
                return int(data) + 1
            except Conflict:
                continue

    results = race(6, increment)
    assert sorted(results) == [1, 2, 3, 4, 5, 6]
    assert store.get(key) == b"6"


def test_missing_key(store: ObjectStore) -> None:
    with pytest.raises(NotFound, match="no such object"):
        store.get("runs/none/run.json")
    with pytest.raises(NotFound):
        store.get_with_etag("runs/none/run.json")
    assert store.exists("runs/none/run.json") is False


def test_list_by_prefix(store: ObjectStore) -> None:
    for key in ["a/b/1", "a/b/2", "a/c", "ab", "z/y"]:
        store.put_create_only(key, key.encode())
    store.put_if_match("a/d", b"cas", None)
    assert store.list("a/") == ["a/b/1", "a/b/2", "a/c", "a/d"]
    assert store.list("a/b") == ["a/b/1", "a/b/2"]
    assert store.list("a") == ["a/b/1", "a/b/2", "a/c", "a/d", "ab"]
    assert store.list() == ["a/b/1", "a/b/2", "a/c", "a/d", "ab", "z/y"]
    assert store.list("nothing/") == []


def test_put_verified(store: ObjectStore) -> None:
    body = bytes(range(256)) * 4096  # 1 MiB
    etag = store.put_verified("runs/r1/checkpoints/000000000100-0123456789abcdef/policy.zip", body)
    data, etag2 = store.get_with_etag("runs/r1/checkpoints/000000000100-0123456789abcdef/policy.zip")
    assert etag2 == etag
    assert hashlib.sha256(data).hexdigest() == hashlib.sha256(body).hexdigest()


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "../x", "a/./b", ".hidden", "a/.lock"])
def test_bad_keys_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(ContractViolation):
        store.put_create_only(key, b"x")


def test_file_store_leaves_no_temp_or_lock_in_listing(tmp_path: Path) -> None:
    store = FileStore((tmp_path / "s").as_uri())
    store.put_create_only("k/a", b"1")
    store.put_if_match("k/b", b"1", None)
    with pytest.raises(Conflict):
        store.put_create_only("k/a", b"2")
    assert store.list() == ["k/a", "k/b"]
    assert sorted(p.name for p in (tmp_path / "s" / "k").iterdir()) == [".b.lock", "a", "b"]


def _process_increment(url: str, n: int) -> None:
    store = open_store(url)
    for _ in range(n):
        while True:
            data, etag = store.get_with_etag("counter")
            try:
                store.put_if_match("counter", str(int(data) + 1).encode(), etag)
                break
            except Conflict:
                continue


def test_file_compare_and_swap_across_processes(tmp_path: Path) -> None:
    url = (tmp_path / "s").as_uri()
    open_store(url).put_if_match("counter", b"0", None)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_process_increment, args=(url, 25)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert open_store(url).get("counter") == b"100"


def test_s3_server_down_is_transient_then_recovers() -> None:
    with running_s3_server() as server:
        store = open_store(server.url("p"))
        store.put_create_only("runs/r1/run.json", b"kept")
        server.stop()
        for call in (
            lambda: store.get("runs/r1/run.json"),
            lambda: store.put_create_only("runs/r1/other.json", b"x"),
            lambda: store.put_if_match("runs/r1/index.json", b"x", None),
            lambda: store.list("runs/"),
            lambda: store.exists("runs/r1/run.json"),
        ):
            with pytest.raises(StoreUnavailable, match=f"cannot reach {server.endpoint_url}") as info:
                call()
            assert isinstance(info.value, TransientError)
        server.restart()
        assert store.get("runs/r1/run.json") == b"kept"
        store.put_create_only("runs/r1/other.json", b"x")
        assert store.list("runs/") == ["runs/r1/other.json", "runs/r1/run.json"]


def test_open_stores_defaults_and_overrides(gradlab_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stores = open_stores()
    assert isinstance(stores.control, FileStore)
    assert stores.control.base_url == (gradlab_home / "stores" / "control").resolve().as_uri()
    assert stores.eval.base_url == (gradlab_home / "stores" / "eval").resolve().as_uri()
    assert stores.model.base_url == (gradlab_home / "stores" / "model").resolve().as_uri()
    with running_s3_server() as server:
        monkeypatch.setenv("GRADLAB_MODEL_STORE_URL", server.url("models"))
        stores = open_stores(load_settings())
        assert stores.model.base_url == f"s3://{server.bucket}/models"
        assert stores.model.endpoint_url == server.endpoint_url
        stores.model.put_create_only("x", b"1")
        assert stores.model.url("x") == f"s3://{server.bucket}/models/x"
        assert isinstance(stores.control, FileStore)


def test_unsupported_scheme() -> None:
    with pytest.raises(ContractViolation, match="unsupported store URL"):
        open_store("gs://bucket/x")


class _CorruptingStore(FileStore):
    """A file store whose reads flip the last byte: a store that silently damages data."""

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        data, etag = super().get_with_etag(key)
        return data[:-1] + bytes([data[-1] ^ 1]), etag


def test_put_verified_detects_bytes_that_differ_on_read_back(tmp_path: Path) -> None:
    store = _CorruptingStore((tmp_path / "s").as_uri())
    # sha256("abc") and sha256("abb"): the flipped last byte is caught by our own hash, not the etag.
    with pytest.raises(IntegrityError, match=(
        "wrote sha256 ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad, "
        f"read back sha256 {hashlib.sha256(b'abb').hexdigest()}"
    )):
        store.put_verified("k", b"abc")


def test_s3_missing_bucket_is_not_found(s3_bucket) -> None:
    from gradlab.stores.s3 import S3Store

    store = S3Store(s3_bucket.url("p"), endpoint_url=s3_bucket.endpoint_url)
    with pytest.raises(NotFound, match="bucket 'no-such-bucket-x' does not exist"):
        S3Store("s3://no-such-bucket-x/p", endpoint_url=s3_bucket.endpoint_url).get("k")
    store.put_create_only("k", b"v")
    assert store.get("k") == b"v"
