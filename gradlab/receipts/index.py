"""The run index (``runs/<run_id>/index.json`` in the model store), updated by compare-and-swap."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from gradlab.errors import Conflict, NotFound
from gradlab.receipts.io import dump_model, read_model_with_etag
from gradlab.receipts.models import IndexEntry, PromotionRef, RunIndex
from gradlab.stores import ObjectStore, keys

logger = logging.getLogger(__name__)

_MAX_CAS_TRIES = 100


def read_index(store: ObjectStore, run_id: str) -> RunIndex:
    """The run's index; an empty one (version 0) if none was written yet."""
    try:
        return read_model_with_etag(store, keys.run_index(run_id), RunIndex)[0]
    except NotFound:
        return RunIndex(run_id=run_id)


def update_index(store: ObjectStore, run_id: str, mutate: Callable[[RunIndex], RunIndex]) -> RunIndex:
    """Read the index, apply ``mutate``, write it back by compare-and-swap; retry on a lost race.

    ``mutate`` must be a pure function of the index it is given (it is re-applied after every lost
    race); returning the index unchanged writes nothing.

    Returns:
        The index as written (or as read, when unchanged).

    Raises:
        Conflict: ``mutate`` refused the change, or 100 races in a row were lost.
        StoreUnavailable: the model store cannot be reached (transient).
    """
    key = keys.run_index(run_id)
    for attempt in range(_MAX_CAS_TRIES):
        try:
            current, etag = read_model_with_etag(store, key, RunIndex)
        except NotFound:
            current, etag = RunIndex(run_id=run_id), None
        new = mutate(current)
        if new == current:
            return current
        new = new.model_copy(update={"version": current.version + 1})
        try:
            store.put_if_match(key, dump_model(new), etag)
            return new
        except Conflict:
            logger.debug("%s: lost index race %d, re-reading", store.url(key), attempt + 1)
            time.sleep(random.uniform(0, 0.01 * min(attempt + 1, 10)))
    raise Conflict(f"{store.url(key)}: lost {_MAX_CAS_TRIES} compare-and-swap races in a row")


def with_checkpoint(index: RunIndex, entry: IndexEntry) -> RunIndex:
    """``index`` with ``entry`` added (sorted by step, then sha256); unchanged if already listed."""
    if entry in index.checkpoints:
        return index
    entries = sorted([*index.checkpoints, entry], key=lambda e: (e.step, e.sha256))
    return index.model_copy(update={"checkpoints": entries})


def with_promotion(index: RunIndex, promotion: PromotionRef) -> RunIndex:
    """``index`` with its promotion set.

    Raises:
        Conflict: the index already names a different promotion.
    """
    if index.promotion == promotion:
        return index
    if index.promotion is not None:
        raise Conflict(
            f"index of run {index.run_id}: promotion is already {index.promotion.model_dump_json()}, "
            f"refusing {promotion.model_dump_json()}"
        )
    return index.model_copy(update={"promotion": promotion})
