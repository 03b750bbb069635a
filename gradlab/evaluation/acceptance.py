"""Acceptance rules ``{metric, operator, threshold}`` over evaluation aggregates, and fail-fast.

The operators compare as :func:`gradlab.contracts.goal.compare` says.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from gradlab.contracts.goal import AcceptanceRule, compare
from gradlab.errors import ContractViolation
from gradlab.evaluation import names

# Rates of outcomes that did not happen are absent from the aggregates and read as 0.0.
_ABSENT_IS_ZERO = re.compile(r"^eval/(outcome/failure/[^/]+/rate|start/[^/]+/success/rate)$")
_SUCCESS_RATE = re.compile(r"^eval/(outcome/success/rate|start/[^/]+/success/rate)$")


def rule_value(rule: AcceptanceRule, aggregates: Mapping[str, float]) -> float:
    """The aggregate a rule reads.

    Raises:
        ContractViolation: the rule names a metric the result does not hold (and that is not a
            rate of an outcome that did not occur, which reads as 0.0).
    """
    if rule.metric in aggregates:
        return float(aggregates[rule.metric])
    if _ABSENT_IS_ZERO.match(rule.metric):
        return 0.0
    raise ContractViolation(
        f"acceptance rule {rule.metric} {rule.operator} {rule.threshold}: metric {rule.metric!r} is not an "
        f"evaluation aggregate (known: {', '.join(sorted(aggregates))})"
    )


def rules_pass(rules: Sequence[AcceptanceRule], aggregates: Mapping[str, float]) -> bool:
    """True when every rule holds (an empty rule list passes)."""
    return all(compare(rule_value(r, aggregates), r.operator, r.threshold) for r in rules)


def requires_perfect_success(rules: Sequence[AcceptanceRule]) -> bool:
    """True when every rule demands a 100% success rate, so one failed episode decides rejection.

    A rule demands it when it reads ``eval/outcome/success/rate`` (or a per-start success rate)
    with ``>= t`` or ``== t`` and ``t >= 1``, or ``> t`` with ``t >= 1`` (unreachable). No rules:
    False. Then evaluation may stop at the first episode whose outcome is not ``success``.
    """
    if not rules:
        return False

    def perfect(rule: AcceptanceRule) -> bool:
        if not _SUCCESS_RATE.match(rule.metric):
            return False
        return rule.operator in (">=", "==", ">") and rule.threshold >= 1.0

    return all(perfect(r) for r in rules)


__all__ = ["names", "requires_perfect_success", "rule_value", "rules_pass"]
