"""A receipt's reason names an error's first cause (issue 16 item 3)."""

from __future__ import annotations

import errno
import os

from gradlab.errors import StoreUnavailable, describe_failure


def test_an_oserror_reads_as_its_errno_and_path() -> None:
    e = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/runs/r/journal.jsonl")
    assert describe_failure(e) == "no space left on device: /runs/r/journal.jsonl"


def test_a_secondary_error_never_hides_the_first_cause() -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/runs/r/outbox.sqlite")
        except OSError:
            raise RuntimeError("cannot rollback - no transaction is active")  # noqa: B904 - the case under test
    except RuntimeError as secondary:
        assert describe_failure(secondary) == "no space left on device: /runs/r/outbox.sqlite"


def test_other_errors_read_as_type_and_message() -> None:
    try:
        raise StoreUnavailable("s3://control/runs/x/lease.json: connection refused") from None
    except StoreUnavailable as e:
        assert describe_failure(e) == "StoreUnavailable: s3://control/runs/x/lease.json: connection refused"
