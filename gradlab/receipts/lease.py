"""The run's writer lease: acquire, renew (heartbeat), release; compare-and-swap on ``lease.json``.

One lease per run (``runs/<run_id>/lease.json`` in the control store). A live lease (not released,
``now < expires_at``) held by another attempt refuses acquisition; an expired or released one is
taken over with ``generation + 1``. Every write is a compare-and-swap against the etag read, so two
acquirers racing for an expired lease produce exactly one holder.

Fencing: the generation is the holder's epoch; a store write made for an attempt whose epoch is no
longer the lease's is refused (:func:`require_epoch`, ``LeaseLost``).

Liveness: a live lease is waited out unless its owner is *provably* dead, which only a checker on
the owner's boot and PID namespace can know (:mod:`gradlab.receipts.owner`); from another host or
container a missing pid proves nothing (docs/ARCHITECTURE.md section 9).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from gradlab.errors import Conflict, NotFound
from gradlab.receipts.io import dump_model, read_model_with_etag
from gradlab.receipts.models import Lease, utcnow
from gradlab.stores import ObjectStore, Stores, keys

logger = logging.getLogger(__name__)

DEFAULT_LEASE_TTL_S = 60.0
#: Environment variable overriding the lease TTL of new attempts (seconds; a test deployment
#: shortens it so a paused host's lease expires in seconds).
LEASE_TTL_ENV = "GRADLAB_LEASE_TTL_S"
_MAX_CAS_TRIES = 50


def lease_ttl_s() -> float:
    """The TTL new attempts take their lease for: ``GRADLAB_LEASE_TTL_S``, else 60 s.

    Raises:
        ContractViolation: the variable is not a number of seconds >= 3.
    """
    import os

    from gradlab.errors import ContractViolation

    raw = os.environ.get(LEASE_TTL_ENV)
    if not raw:
        return DEFAULT_LEASE_TTL_S
    try:
        ttl = float(raw)
    except ValueError:
        ttl = -1.0
    if not ttl >= 3.0:
        raise ContractViolation(f"{LEASE_TTL_ENV}: expected seconds >= 3, found {raw!r}")
    return ttl


class LeaseHeld(Conflict):
    """Another attempt holds a live lease on the run."""


class LeaseLost(Conflict):
    """The lease this process held was taken over (it had expired) or changed under it."""


@dataclass(frozen=True)
class HeldLease:
    """A lease as last written by this process, with the etag needed to update it."""

    lease: Lease
    etag: str
    #: The lease this acquisition replaced (another holder's, expired, released or of a dead owner),
    #: or None: what a superseding attempt names in the receipt it seals for the old one.
    replaced: Lease | None = None


def read_lease(store: ObjectStore, run_id: str) -> HeldLease | None:
    """The run's lease and its etag, or None if none was ever acquired."""
    try:
        lease, etag = read_model_with_etag(store, keys.lease(run_id), Lease)
    except NotFound:
        return None
    return HeldLease(lease, etag)


def require_no_live_lease(store: ObjectStore, run_id: str, *, now: datetime | None = None) -> None:
    """Refuse early, before a new attempt touches the run directory, while a lease is live.

    Raises:
        LeaseHeld: as :func:`acquire_lease` would.
    """
    at = now or utcnow()
    current = read_lease(store, run_id)
    refusal = _refusal(store, run_id, current, None, at)
    if refusal is not None:
        raise refusal


def wait_out_lease(store: ObjectStore, run_id: str, *, poll_s: float = 0.25) -> None:
    """Before a new attempt opens: wait until a lease in force expires when its owner cannot be
    judged from here (another host or PID namespace), as long as nobody renews it; write nothing.

    A retry queued right after its host died would otherwise be refused for up to one TTL: from
    here a missing pid proves nothing, so the lease is waited out (docs/ARCHITECTURE.md section 9).
    The wait is bounded by the lease's remaining time, which may be at most its own ``ttl_s`` (plus
    one second of clock granularity).

    Raises:
        LeaseHeld: the owner is seen alive here; the lease is renewed or taken while waited out
            (its owner lives, or another attempt won); or it expires further off than its own TTL
            (a clock ahead of this one). As :func:`acquire_lease` would, naming the holder.
    """
    import time

    held = read_lease(store, run_id)
    refusal = _refusal(store, run_id, held, None, utcnow())
    if refusal is None:
        return
    lease = held.lease
    remaining = (lease.expires_at - utcnow()).total_seconds()
    if lease.owner_state() != "unknown" or remaining > lease.ttl_s + 1.0:
        raise refusal
    logger.info("run %s: waiting %.1f s for %s's lease (owner %s, not visible from here) to expire", run_id,
                remaining, lease.holder, lease.owner)
    deadline = lease.expires_at + timedelta(seconds=1.0)
    while True:
        time.sleep(max(poll_s, min((lease.expires_at - utcnow()).total_seconds(), 5.0)))
        again = read_lease(store, run_id)
        refusal = _refusal(store, run_id, again, None, utcnow())
        if refusal is None:
            return
        if utcnow() > deadline:  # rewritten further off without a renewal: waited as long as it said
            raise refusal
        if (again.lease.holder, again.lease.generation) != (lease.holder, lease.generation):
            raise refusal  # another attempt took the run meanwhile
        if again.lease.heartbeat_at != lease.heartbeat_at:
            raise LeaseHeld(f"{refusal} (renewed while it was waited out: its owner lives elsewhere)")


def _refusal(store: ObjectStore, run_id: str, current: HeldLease | None, holder: str | None,
             at: datetime) -> LeaseHeld | None:
    """Why ``holder`` (None: any new holder) may not take the lease now, or None."""
    if current is None or current.lease.holder == holder:
        return None
    if owner_elsewhere_alive(current.lease):
        return LeaseHeld(
            f"{store.url(keys.lease(run_id))}: run {run_id} is leased by {current.lease.holder}, whose process "
            f"{current.lease.owner} still runs on this host although the lease "
            f"{'expired' if not current.lease.is_live(at) else 'is live'}; expected it gone: stop it first "
            "(Ctrl-C or `prefect flow-run cancel`)"
        )
    if current.lease.in_force(at):
        return LeaseHeld(
            f"{store.url(keys.lease(run_id))}: run {run_id} is leased by {current.lease.holder} "
            f"({current.lease.owner}) until {current.lease.expires_at.isoformat()}; "
            f"expected no live lease at {at.isoformat()}"
        )
    return None


def owner_elsewhere_alive(lease: Lease) -> bool:
    """The lease's owner is another process that still runs here, in this boot and PID namespace
    (suspended, swapping):
    its lease expiring does not make it dead, and taking the run over would start a second
    learner lineage. Every path that opens an attempt (CLI, deployment, UI retry) gets this guard."""
    if lease.released or lease.owner_state() != "alive":
        return False
    from gradlab.receipts.owner import current_owner

    me = current_owner()
    return (lease.owner_pid, lease.owner_start) != (me.pid, me.start)


def _owner_fields() -> dict:
    from gradlab.receipts.owner import current_owner

    me = current_owner()
    return {"owner": me.label(), "owner_boot_id": me.boot_id, "owner_pid_namespace": me.pid_namespace,
            "owner_pid": me.pid, "owner_start": me.start}


def acquire_lease(
    store: ObjectStore,
    run_id: str,
    holder: str,
    *,
    ttl_s: float = DEFAULT_LEASE_TTL_S,
    now: datetime | None = None,
    owner: str | None = None,
) -> HeldLease:
    """Take the run's writer lease for ``holder`` (an attempt id) for ``ttl_s`` seconds.

    Re-acquiring a lease the same holder still has live renews it (same generation). A live lease
    whose owner is known to be dead (same host boot and PID namespace, its pid gone or recycled:
    :mod:`gradlab.receipts.owner`) is taken over at once instead of waited out; one whose owner
    cannot be seen from here (another host or namespace) is waited out until it expires.

    Args:
        owner: a label for the owner instead of this process's identity (then its liveness is
            unknown and only expiry frees the lease).

    Raises:
        LeaseHeld: another holder's lease is live (names the holder and its expiry).
        StoreUnavailable: the control store cannot be reached (transient).
    """
    for _ in range(_MAX_CAS_TRIES):
        at = now or utcnow()
        current = read_lease(store, run_id)
        refusal = _refusal(store, run_id, current, holder, at)
        if refusal is not None:
            raise refusal
        replaced = None
        if current is not None and current.lease.is_live(at) and current.lease.holder == holder:
            generation, acquired_at = current.lease.generation, current.lease.acquired_at
        else:
            generation = current.lease.generation + 1 if current is not None else 1
            acquired_at = at
            replaced = current.lease if current is not None else None
        lease = Lease(
            run_id=run_id,
            holder=holder,
            **({"owner": owner} if owner else _owner_fields()),
            generation=generation,
            ttl_s=ttl_s,
            acquired_at=acquired_at,
            heartbeat_at=at,
            expires_at=at + timedelta(seconds=ttl_s),
        )
        try:
            etag = store.put_if_match(keys.lease(run_id), dump_model(lease), current.etag if current else None)
        except Conflict:
            continue  # someone wrote between our read and write: re-read and decide again
        logger.info("run %s: lease acquired by %s (generation %d)", run_id, holder, generation)
        return HeldLease(lease, etag, replaced)
    raise LeaseHeld(f"{store.url(keys.lease(run_id))}: lost {_MAX_CAS_TRIES} races for the lease of run {run_id}")


def _update(store: ObjectStore, held: HeldLease, new: Lease) -> HeldLease:
    key = keys.lease(held.lease.run_id)
    etag = held.etag
    for _ in range(_MAX_CAS_TRIES):
        try:
            return HeldLease(new, store.put_if_match(key, dump_model(new), etag))
        except Conflict:
            current = read_lease(store, held.lease.run_id)
            if current is not None and current.lease == new:
                return current  # our write landed but its answer was lost
            if (
                current is None
                or current.lease.holder != held.lease.holder
                or current.lease.generation != held.lease.generation
                or current.lease.released
            ):
                found = "no lease" if current is None else (
                    f"holder {current.lease.holder} generation {current.lease.generation}"
                    f"{' (released)' if current.lease.released else ''}"
                )
                raise LeaseLost(
                    f"{store.url(key)}: expected holder {held.lease.holder} generation "
                    f"{held.lease.generation}, found {found}"
                ) from None
            etag = current.etag  # our own earlier write landed (e.g. a retried request): go on from it
    raise LeaseLost(f"{store.url(key)}: lost {_MAX_CAS_TRIES} compare-and-swap races while holding the lease")


def renew_lease(
    store: ObjectStore, held: HeldLease, *, ttl_s: float | None = None, now: datetime | None = None
) -> HeldLease:
    """Heartbeat: extend the lease to ``now + ttl_s`` (default: the lease's own ttl).

    Raises:
        LeaseLost: the lease was taken over by another holder or released.
    """
    at = now or utcnow()
    ttl = ttl_s if ttl_s is not None else held.lease.ttl_s
    new = held.lease.model_copy(update={"heartbeat_at": at, "expires_at": at + timedelta(seconds=ttl), "ttl_s": ttl})
    return _update(store, held, new)


def release_lease(store: ObjectStore, held: HeldLease, *, now: datetime | None = None) -> HeldLease:
    """Release the lease so the next attempt may start at once.

    Raises:
        LeaseLost: the lease was already taken over by another holder.
    """
    at = now or utcnow()
    new = held.lease.model_copy(update={"released": True, "heartbeat_at": at, "expires_at": at})
    return _update(store, held, new)


def require_epoch(stores: Stores, run_id: str, attempt_id: str, epoch: int, *, released_ok: bool = False) -> None:
    """Refuse a write made for an attempt whose lease epoch is no longer current (fencing).

    Called right before every store write on behalf of an attempt (docs/ARCHITECTURE.md section 9).
    A lease past its expiry but not taken over still fences for its holder: nobody else has written.

    Args:
        released_ok: accept the holder's own released lease (a seal retried after the release).

    Raises:
        LeaseLost: the lease is held by another attempt or epoch (or released), naming both.
    """
    held = read_lease(stores.control, run_id)
    if (held is None or (held.lease.holder, held.lease.generation) != (attempt_id, epoch)
            or (held.lease.released and not released_ok)):
        found = "no lease" if held is None else (f"{held.lease.holder} epoch {held.lease.generation}"
                                                 f"{' (released)' if held.lease.released else ''}")
        raise LeaseLost(f"{stores.control.url(keys.lease(run_id))}: write for {attempt_id} epoch {epoch} refused: "
                        f"the lease is {found}")
