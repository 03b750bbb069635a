"""Goal and recipe contracts: pydantic models, YAML composition, identity hashes.

Public names:
    Experiments, ResolvedRecipe, Hashes, find_experiments_root: the experiments tree.
    Goal, Recipe, EnvironmentSpec, TaskProgram, Catalog: the frozen contract models.
    canonical_json, sha256_json, sha256_bytes: identity hashing.

Never imports torch or prefect: ``gradlab validate`` must stay fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gradlab.contracts.catalog import Catalog
    from gradlab.contracts.environment import EnvironmentSpec
    from gradlab.contracts.experiments import Experiments, Hashes, ResolvedRecipe, find_experiments_root
    from gradlab.contracts.goal import Goal
    from gradlab.contracts.hashing import canonical_json, sha256_bytes, sha256_json
    from gradlab.contracts.recipe import Recipe
    from gradlab.contracts.task import TaskProgram

#: Public name -> the module that defines it, imported on first use (PEP 562): a command that only
#: hashes (``runs list``) does not pay for OmegaConf and the composition machinery.
_HOMES = {
    "Catalog": "catalog", "EnvironmentSpec": "environment", "Experiments": "experiments", "Hashes": "experiments",
    "ResolvedRecipe": "experiments", "find_experiments_root": "experiments", "Goal": "goal",
    "canonical_json": "hashing", "sha256_bytes": "hashing", "sha256_json": "hashing", "Recipe": "recipe",
    "TaskProgram": "task",
}

__all__ = [
    "Catalog", "EnvironmentSpec", "Experiments", "Goal", "Hashes", "Recipe", "ResolvedRecipe", "TaskProgram",
    "canonical_json", "find_experiments_root", "sha256_bytes", "sha256_json",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gradlab.contracts' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gradlab.contracts.{home}"), name)
    globals()[name] = value
    return value
