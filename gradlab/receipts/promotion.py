"""Promotion: the run's one create-only ``promotion.json`` and its entry in the run index.

A second promoter naming the same checkpoint agrees; one naming another checkpoint is refused.
"""

from __future__ import annotations

from gradlab.receipts.index import update_index, with_promotion
from gradlab.receipts.io import create_or_agree, read_optional
from gradlab.receipts.models import Promotion
from gradlab.stores import Stores, keys


def write_promotion(stores: Stores, promotion: Promotion) -> Promotion:
    """Promote a checkpoint: create-only ``promotion.json``, exactly one per run, then the index.

    A second promoter finds the existing promotion: it agrees (gets the existing receipt back) when
    it names the same checkpoint (step and sha256), else it is refused.

    Raises:
        Conflict: the run already promoted a different checkpoint (names both).
    """
    stored = create_or_agree(
        stores.control,
        keys.promotion(promotion.run_id),
        promotion,
        agree=lambda old, new: (old.checkpoint_step, old.checkpoint_sha256) == (new.checkpoint_step, new.checkpoint_sha256),
        what="promotion",
    )
    update_index(stores.model, promotion.run_id, lambda index: with_promotion(index, stored.ref))
    return stored


def read_promotion(stores: Stores, run_id: str) -> Promotion | None:
    """The run's promotion receipt, or None while nothing is promoted."""
    return read_optional(stores.control, keys.promotion(run_id), Promotion)
