"""The sides and runs of ``gradlab benchmark curves``: what one run trains.

A *side* is ``BACKEND[:PRECISION][@RECIPE]`` (:class:`Side`); each side and seed is one run, keyed
``<side>-s<seed>`` (:func:`run_key`), trained from the goal's recipe for that backend
(:data:`RECIPES`, :func:`side_ref`), or from the goal's recipe ``RECIPE`` when the side names one
(``gradlab.ppo@ppo-archive-curriculum`` against ``gradlab.ppo``: a recipe variant against the plain
recipe on the same backend), with the benchmark's overrides (:func:`run_spec`). The
command (:mod:`gradlab.benchmarks.curves`) and its worker processes
(:mod:`gradlab.benchmarks.curve_worker`) both read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gradlab.errors import ConfigError

BACKENDS = ("sb3.ppo", "gradlab.ppo")
PRECISIONS = ("fp32", "bf16")
RECIPES = {"sb3.ppo": ("ppo-sb3", "ppo"), "gradlab.ppo": ("ppo",)}
"""Per backend, the goal's recipes to train, the first the goal has."""


@dataclass(frozen=True)
class Side:
    """One side: a backend, (gradlab.ppo only) a precision, and optionally the goal's recipe to
    train (``None``: the backend's own, :data:`RECIPES`); ``label`` is how it was written."""

    backend: str
    precision: str = "fp32"
    recipe: str | None = None

    @property
    def label(self) -> str:
        base = self.backend if self.precision == "fp32" else f"{self.backend}:{self.precision}"
        return base if self.recipe is None else f"{base}@{self.recipe}"

    @classmethod
    def parse(cls, text: str) -> Side:
        """``BACKEND[:PRECISION][@RECIPE]``.

        Raises:
            ConfigError: an unknown backend or precision, a precision on sb3.ppo, or an empty recipe
                after ``@`` (whether the goal has the recipe is :func:`side_ref`'s to say).
        """
        head, at, recipe = text.partition("@")
        if at and not recipe.strip():
            raise ConfigError(f"--side {text!r}: expected a recipe name after '@', found nothing")
        backend, colon, precision = head.partition(":")
        if colon and not precision:
            raise ConfigError(f"--side {text!r}: expected a precision after ':' ({', '.join(PRECISIONS)}), found nothing")
        precision = precision or "fp32"
        if backend not in BACKENDS:
            raise ConfigError(f"--side {text!r}: expected a backend of {', '.join(BACKENDS)}, found {backend!r}")
        if precision not in PRECISIONS:
            raise ConfigError(f"--side {text!r}: expected a precision of {', '.join(PRECISIONS)}, found {precision!r}")
        if backend == "sb3.ppo" and precision != "fp32":
            raise ConfigError(f"--side {text!r}: sb3.ppo trains in fp32 only")
        return cls(backend, precision, recipe.strip() if at else None)


def run_key(side: Side, seed: int) -> str:
    return f"{side.label.replace(':', '-').replace('@', '-')}-s{seed}"


def side_ref(goal: str, side: Side) -> str:
    """``GOAL/RECIPE`` for ``side``: its own recipe, else the first of :data:`RECIPES` the goal has.

    Raises:
        NotFound: an unknown goal (as ``gradlab train`` reports it: did-you-mean or the known goals),
            the goal has no recipe ``side.recipe``, or none of the backend's recipes.
    """
    from gradlab.contracts.experiments import Experiments
    from gradlab.errors import NotFound

    exp = Experiments()
    exp.goal_path(goal)  # NotFound: unknown goal 'X' (the resolver `gradlab train` goes through)
    names = set(exp.recipe_ids(goal))
    if side.recipe is not None:
        if side.recipe not in names:
            raise NotFound(f"--side {side.label}: goal {goal} has no recipe {side.recipe!r}; its recipes: "
                           f"{', '.join(sorted(names))}")
        return f"{goal}/{side.recipe}"
    for recipe in RECIPES[side.backend]:
        if recipe in names:
            return f"{goal}/{recipe}"
    raise NotFound(f"{goal}: expected one of the recipes {', '.join(RECIPES[side.backend])} for {side.label}, found none")


HORIZONS = ("recipe", "steps")


def run_spec(goal: str, side: Side, seed: int, steps: int, threads: int, horizon: str = "recipe") -> Any:
    """The run spec of one run: the side's recipe, one final checkpoint, device cpu, ``threads`` torch
    threads, the side's backend and precision.

    ``horizon`` sets ``train.timesteps``, the length the learning-rate, clip-range and entropy
    schedules run over: ``recipe`` keeps the recipe's (the run then stops at ``steps``, so the curve
    is the first ``steps`` of the recipe's own run; at least ``steps``), ``steps`` sets it to
    ``steps`` (the schedules reach their final values at the end of the curve).

    Raises:
        ConfigError: an unknown ``horizon``, or an override the recipe rejects. NotFound: no recipe.
    """
    from gradlab.contracts.experiments import Experiments
    from gradlab.contracts.run_spec import RunSpec

    if horizon not in HORIZONS:
        raise ConfigError(f"--schedule-horizon: expected {' or '.join(HORIZONS)}, found {horizon!r}")
    overrides = [f"train.checkpoint_freq={steps}", "train.device=cpu", f"train.torch_threads={threads}",
                 f"train.backend.id={side.backend}"]
    if side.backend == "gradlab.ppo":
        overrides += [f"train.backend.config.threads={threads}", f"train.backend.config.precision={side.precision}"]
    exp, ref = Experiments(), side_ref(goal, side)
    if side.recipe is not None:  # a recipe of another algorithm would fail on its keys, one line each
        own = exp.resolve(ref, []).recipe.train.backend.id
        if own not in BACKENDS:
            raise ConfigError(f"--side {side.label}: recipe {ref} trains {own}; a curves side trains "
                              f"{' or '.join(BACKENDS)}")
    resolved = exp.resolve(ref, overrides)
    if horizon == "steps" or resolved.recipe.train.timesteps < steps:
        resolved = exp.resolve(ref, [f"train.timesteps={steps}", *overrides])
    return RunSpec.from_resolved(resolved, seed=seed)
