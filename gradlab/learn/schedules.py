"""Hyperparameter schedules: a constant, or linear from ``initial`` to ``final`` over the budget.

SB3 calls a schedule with ``progress_remaining``: 1.0 at the first update, falling linearly with
``num_timesteps / total_timesteps`` to 0.0 at the end of the budget
(``OnPolicyAlgorithm._update_current_progress_remaining``). A resumed run restores
``num_timesteps`` and so continues the schedule where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradlab.contracts.recipe import LinearSchedule


@dataclass(frozen=True)
class ConstantFn:
    """``value`` at every progress."""

    value: float

    def __call__(self, progress_remaining: float) -> float:
        return self.value


@dataclass(frozen=True)
class LinearFn:
    """``final + (initial - final) * progress_remaining``: ``initial`` at 1.0, ``final`` at 0.0.

    Source: rl-baselines3-zoo's ``linear_schedule`` (``lin_<x>`` hyperparameters), generalised to a
    non-zero final value.
    """

    initial: float
    final: float

    def __call__(self, progress_remaining: float) -> float:
        return self.final + (self.initial - self.final) * float(progress_remaining)


def schedule_fn(value: float | LinearSchedule | dict) -> ConstantFn | LinearFn:
    """The callable for a recipe schedule (a float, a ``LinearSchedule`` or its dict form)."""
    if isinstance(value, dict):
        value = LinearSchedule.model_validate(value)
    if isinstance(value, LinearSchedule):
        return LinearFn(float(value.initial), float(value.final))
    return ConstantFn(float(value))
