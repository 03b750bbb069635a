"""A run's own records in the control store: the run record and its spec, attempts, the stop request.

Each function is one idempotent step (create-only or create-or-agree), so a retried Prefect task
finds its own earlier write and agrees with it instead of writing twice. An attempt begins under
the run's writer lease (:mod:`gradlab.receipts.lease`).
"""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime
from typing import Any

from gradlab.contracts.hashing import canonical_json, sha256_json
from gradlab.errors import ContractViolation, IntegrityError, NotFound
from gradlab.receipts.io import create_or_agree, dump_model, read_model, read_optional
from gradlab.receipts.lease import DEFAULT_LEASE_TTL_S, HeldLease, acquire_lease
from gradlab.receipts.models import Attempt, AttemptMode, CheckpointRef, RunRecord, StopRequest, utcnow
from gradlab.stores import Stores, keys


def open_run(stores: Stores, spec: Any, *, now: datetime | None = None) -> RunRecord:
    """Write ``spec.json`` and ``run.json`` for a run spec (create-only; re-opening agrees).

    Args:
        spec: a :class:`gradlab.contracts.run_spec.RunSpec`.

    Returns:
        The stored run record (the earlier one when the run was opened before).

    Raises:
        Conflict: a run with this id exists with a different spec.
    """
    spec_json = spec.model_dump(mode="json")
    record = RunRecord.from_spec(spec, now=now)
    stores.control.put_create_only(keys.run_spec(spec.run_id), canonical_json(spec_json))
    return create_or_agree(
        stores.control,
        keys.run_record(spec.run_id),
        record,
        agree=lambda old, new: old.spec_sha256 == new.spec_sha256,
        what="run record",
    )


def read_run(stores: Stores, run_id: str) -> RunRecord:
    """The run record. Raises NotFound naming the key when the run does not exist."""
    return read_model(stores.control, keys.run_record(run_id), RunRecord)


def read_run_spec(stores: Stores, run_id: str) -> dict[str, Any]:
    """The resolved run spec JSON as written by :func:`open_run`, checked against the run record's
    ``spec_sha256`` when the record exists.

    Raises:
        NotFound: no spec. ContractViolation: the object is not a JSON object.
        IntegrityError: its hash is not the run record's.
    """
    url = stores.control.url(keys.run_spec(run_id))
    try:
        spec = json.loads(stores.control.get(keys.run_spec(run_id)))
    except (ValueError, UnicodeDecodeError) as e:
        raise ContractViolation(f"{url}: not JSON ({e})") from None
    if not isinstance(spec, dict):
        raise ContractViolation(f"{url}: expected a JSON object, found {type(spec).__name__}")
    try:
        record = read_run(stores, run_id)
    except NotFound:  # opened up to the spec only: nothing to check it against
        return spec
    found = sha256_json(spec)
    if found != record.spec_sha256:
        raise IntegrityError(f"{url}: sha256 expected {record.spec_sha256} (run record), found {found}")
    return spec


def list_runs(stores: Stores) -> list[str]:
    """Run ids with a run record in the control store, sorted (ids sort by start time)."""
    return sorted(
        k.split("/")[1] for k in stores.control.list("runs/") if k.count("/") == 2 and k.endswith("/run.json")
    )


def list_attempts(stores: Stores, run_id: str) -> list[Attempt]:
    """Every attempt of the run, by number."""
    found = [
        read_model(stores.control, k, Attempt)
        for k in stores.control.list(keys.attempts_prefix(run_id))
        if k.endswith("/attempt.json")
    ]
    return sorted(found, key=lambda a: a.number)


def begin_attempt(
    stores: Stores,
    run_id: str,
    *,
    mode: AttemptMode,
    resume_from: CheckpointRef | None = None,
    skipped_checkpoints: list[str] | None = None,
    outbox: str | None = None,
    outbox_replaced: str | None = None,
    ttl_s: float = DEFAULT_LEASE_TTL_S,
    now: datetime | None = None,
    flow_run_id: str | None = None,
) -> tuple[Attempt, HeldLease]:
    """Start the next attempt of a run: take the writer lease, then write ``attempt.json`` (with
    the lease epoch and the executing flow run).

    Returns:
        (attempt, held lease); renew the lease at least every ``ttl_s / 3`` seconds.

    Raises:
        LeaseHeld: another attempt's lease is live (a retry is refused while it is).
        Conflict: another process created the same attempt number first.
    """
    previous = list_attempts(stores, run_id)
    number = previous[-1].number + 1 if previous else 1
    attempt_id = f"attempt-{number:03d}"
    held = acquire_lease(stores.control, run_id, attempt_id, ttl_s=ttl_s, now=now)
    attempt = Attempt(
        run_id=run_id,
        attempt_id=attempt_id,
        number=number,
        mode=mode,
        resume_from=resume_from,
        skipped_checkpoints=list(skipped_checkpoints or []),
        outbox=outbox,
        outbox_replaced=outbox_replaced,
        previous_attempt_id=previous[-1].attempt_id if previous else None,
        epoch=held.lease.generation,
        flow_run_id=flow_run_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        started_at=now or utcnow(),
    )
    stores.control.put_create_only(keys.attempt(run_id, attempt_id), dump_model(attempt))
    return attempt, held


def request_stop(stores: Stores, stop: StopRequest) -> StopRequest:
    """Record a stop request; the first request wins and is returned to every later caller."""
    return create_or_agree(
        stores.control, keys.stop_request(stop.run_id), stop, agree=lambda old, new: True, what="stop request"
    )


def read_stop_request(stores: Stores, run_id: str) -> StopRequest | None:
    """The run's stop request (the first one written), or None when nothing asked the run to stop."""
    return read_optional(stores.control, keys.stop_request(run_id), StopRequest)
