"""The evaluation evidence a publication carries: the run's accepted result for one checkpoint.

``gradlab publish`` puts this result on the model card of a promoted checkpoint instead of
evaluating it again; a record whose result does not match its hash is refused.
"""

from __future__ import annotations

from typing import Any


def accepted_result(stores: Any, spec: Any, sha256: str) -> Any:
    """The run's recorded evaluation result of checkpoint ``sha256``, validated, or None.

    Args:
        stores: :class:`gradlab.stores.Stores` (the control store's evaluation records are read).
        spec: the run's :class:`gradlab.contracts.run_spec.RunSpec` (its run id, hashes and goal).
        sha256: the checkpoint's policy sha256 (64 hex digits).

    Returns:
        The :class:`gradlab.evaluation.result.EvalResult` of the first evaluation record (in the
        store's order) of that checkpoint that holds one, checked against the spec's hashes and
        goal; None when none does.

    Raises:
        IntegrityError: a record's result does not match its ``result_sha256``.
        ContractViolation: the result does not belong to this checkpoint, run or goal
            (:func:`gradlab.evaluation.validate_result`).
    """
    from gradlab import receipts as rules
    from gradlab.contracts.hashing import sha256_json
    from gradlab.evaluation import validate_result
    from gradlab.evaluation.result import EvalResult

    for _intent, record in rules.list_evaluations(stores, spec.run_id):
        if record is None or record.checkpoint_sha256 != sha256 or record.result is None:
            continue
        if record.result_sha256 != sha256_json(record.result):
            from gradlab.errors import IntegrityError

            raise IntegrityError(f"run {spec.run_id}: the evaluation record of {sha256[:16]} does not match its result hash")
        result = EvalResult.from_json(record.result, source=f"run {spec.run_id} evaluation")
        validate_result(result, expected={"checkpoint_sha256": sha256, **spec.hashes}, goal=spec.goal)
        return result
    return None
