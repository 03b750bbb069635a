"""Goal and recipe contracts: pydantic models, YAML composition, identity hashes.

Public names:
    Experiments, ResolvedRecipe, Hashes, find_experiments_root: the experiments tree.
    Goal, Recipe, EnvironmentSpec, TaskProgram, Catalog: the frozen contract models.
    canonical_json, sha256_json, sha256_bytes: identity hashing.

Never imports torch or prefect: ``gradlab validate`` must stay fast.
"""

from gradlab.contracts.catalog import Catalog
from gradlab.contracts.environment import EnvironmentSpec
from gradlab.contracts.experiments import Experiments, Hashes, ResolvedRecipe, find_experiments_root
from gradlab.contracts.goal import Goal
from gradlab.contracts.hashing import canonical_json, sha256_bytes, sha256_json
from gradlab.contracts.recipe import Recipe
from gradlab.contracts.task import TaskProgram

__all__ = [
    "Catalog", "EnvironmentSpec", "Experiments", "Goal", "Hashes", "Recipe", "ResolvedRecipe", "TaskProgram",
    "canonical_json", "find_experiments_root", "sha256_bytes", "sha256_json",
]
