"""The experiments tree: composing, validating and hashing goals and recipes.

The tree's layout, its ids and where their files are: :mod:`gradlab.contracts.tree` (re-exported
here). A family's ``template_vars`` (a mapping of names to scalars, set in ``_goal-common.yaml`` or any
fragment, overridable by the goal) add ``{{ name }}`` templates for its goals and their recipes;
it is removed from the composed goal, so only what it renders into enters the hashes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gradlab.contracts import tree
from gradlab.contracts.actions import resolve_action_profile
from gradlab.contracts.catalog import Catalog
from gradlab.contracts.compose import (
    Composition,
    compose_file,
    merge,
    parse_override,
    render_templates,
    secret_problems,
    set_path,
    template_vars,
    validation_problems,
)
from gradlab.contracts.environment import EnvironmentSpec
from gradlab.contracts.goal import COSMETIC_GOAL_FIELDS, Goal
from gradlab.contracts.hashing import sha256_json
from gradlab.contracts.recipe import COSMETIC_RECIPE_FIELDS, Recipe
from gradlab.contracts.tree import (  # noqa: F401 - re-exported: the tree's layout and ids
    CATALOG_FILE,
    FAMILY_COMMON_FILE,
    GOAL_FILE,
    MAX_GOAL_DEPTH,
    check_id,
    find_experiments_root,
    goal_family,
    split_ref,
)
from gradlab.contracts.yamlfile import YamlDocument, load_yaml
from gradlab.errors import ConfigError, ConfigProblem


@dataclass(frozen=True)
class Hashes:
    goal_contract_sha256: str
    recipe_sha256: str
    environment_sha256: str

    def as_dict(self) -> dict[str, str]:
        return {
            "goal_contract_sha256": self.goal_contract_sha256,
            "recipe_sha256": self.recipe_sha256,
            "environment_sha256": self.environment_sha256,
        }


@dataclass(frozen=True)
class ResolvedRecipe:
    """A goal and one of its recipes, composed, validated, with overrides applied and hashed.

    ``environment`` is the effective training environment (the goal's with the recipe's and the
    overrides' changes); the evaluation environment is ``goal.eval_environment(environment)``.
    """

    goal: Goal
    recipe: Recipe
    environment: EnvironmentSpec
    overrides: tuple[str, ...]
    hashes: Hashes
    goal_file: str
    recipe_file: str

    @property
    def ref(self) -> str:
        return f"{self.goal.goal_id}/{self.recipe.recipe_id}"

    @property
    def checkpoint_freq(self) -> int:
        return self.recipe.train.checkpoint_freq or self.goal.train.checkpoint_freq

    @property
    def eval_environment(self) -> EnvironmentSpec:
        return self.goal.eval_environment(self.environment)

    def contract(self) -> dict[str, Any]:
        """The composed contract as JSON: goal, recipe, effective environments, overrides."""
        return {
            "goal": self.goal.model_dump(mode="json"),
            "recipe": self.recipe.model_dump(mode="json"),
            "environment": self.environment.model_dump(mode="json"),
            "eval_environment": self.eval_environment.model_dump(mode="json"),
            "overrides": list(self.overrides),
        }

    def as_json(self) -> dict[str, Any]:
        return {"goal_id": self.goal.goal_id, "recipe_id": self.recipe.recipe_id, **self.hashes.as_dict(),
                "contract": self.contract()}


@dataclass
class ValidationReport:
    goals: int = 0
    recipes: int = 0
    presets: int = 0
    problems: list[ConfigProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class Experiments:
    """Read access to one experiments tree."""

    def __init__(self, root: Path | None = None):
        self.root = (root or find_experiments_root()).resolve()
        self.goals_dir = self.root / "goals"
        self.presets_dir = self.root / "recipes" / "_presets"
        self._display_root = self.root.parent
        self._goal_cache: dict[str, tuple[Goal, Composition]] = {}
        self._template_vars: dict[str, dict[str, str]] = {}

    # -- discovery -------------------------------------------------------------------------
    def goal_ids(self) -> list[str]:
        """Every goal id in the tree (:func:`gradlab.contracts.tree.goal_ids`)."""
        return tree.goal_ids(self.goals_dir)

    def families(self) -> dict[str, list[str]]:
        """Family id -> the goal ids directly or indirectly under it (families with 1+ goals)."""
        out: dict[str, list[str]] = {}
        for gid in self.goal_ids():
            parts = gid.split("/")
            for n in range(1, len(parts)):
                out.setdefault("/".join(parts[:n]), []).append(gid)
        return out

    def recipe_ids(self, goal_id: str) -> list[str]:
        """The recipe ids of one goal (:func:`gradlab.contracts.tree.recipe_ids`)."""
        return tree.recipe_ids(self.goals_dir, goal_id)

    def preset_names(self) -> list[str]:
        if not self.presets_dir.is_dir():
            return []
        return sorted(p.stem for p in self.presets_dir.glob("*.yaml"))

    # -- goals -----------------------------------------------------------------------------
    def _compose(self, path: Path) -> Composition:
        return compose_file(path, presets_dir=self.presets_dir, display_root=self._display_root)

    def goal_path(self, goal_id: str) -> Path:
        """The goal's ``_goal.yaml`` (:func:`gradlab.contracts.tree.goal_file`; raises its errors)."""
        return tree.goal_file(self.goals_dir, goal_id)

    def load_goal(self, goal_id: str) -> Goal:
        """Compose, render and validate one goal.

        Raises:
            NotFound: no such goal. ConfigError: every problem of the goal's files.
        """
        goal, _comp = self._load_goal(goal_id)
        return goal

    def _load_goal(self, goal_id: str) -> tuple[Goal, Composition]:
        if goal_id not in self._goal_cache:
            self._goal_cache[goal_id] = self._load_goal_uncached(goal_id)
        return self._goal_cache[goal_id]

    def _compose_goal(self, goal_id: str) -> Composition:
        """The goal file composed after each ancestor family's ``_goal-common.yaml`` (outermost
        first); a common fragment the goal's ``defaults:`` already names is not merged twice."""
        path = self.goal_path(goal_id)
        comp = self._compose(path)
        parts = goal_id.split("/")
        commons = [self.goals_dir.joinpath(*parts[:n], FAMILY_COMMON_FILE) for n in range(1, len(parts))]
        named = {layer.file for layer in comp.layers}
        layers: list[YamlDocument] = []
        for common in commons:
            if common.is_file():
                layers += [layer for layer in self._compose(common).layers if layer.file not in named]
        if not layers:
            return comp
        layers += comp.layers
        return Composition(data=merge([layer.data for layer in layers], comp.layers[-1].file), layers=layers)

    def _load_goal_uncached(self, goal_id: str) -> tuple[Goal, Composition]:
        comp = self._compose_goal(goal_id)
        data = dict(comp.data)
        problems: list[ConfigProblem] = []
        if data.setdefault("goal_id", goal_id) != goal_id:
            problems.append(comp.problem(("goal_id",), f"expected '{goal_id}' (the folder path), found {data['goal_id']!r}"))
        variables, var_problems = template_vars(data.pop("template_vars", None), comp)
        problems += var_problems
        problems += resolve_action_profile(data, data.pop("action_profiles", None), comp.problem)
        env_id = _get(data, ("train", "environment", "env_id"))
        context = {**variables, "goal_id": goal_id, **({"env_id": env_id} if isinstance(env_id, str) else {})}
        self._template_vars[goal_id] = variables
        data, template_problems = render_templates(data, context, comp)
        problems += template_problems + secret_problems(data, comp)
        try:
            goal = Goal.model_validate(data)
        except ValidationError as e:
            problems += validation_problems(e, Goal, comp)
            raise ConfigError(problems) from None
        if problems:
            raise ConfigError(problems)
        return goal, comp

    def goal_problem(self, goal_id: str, path: tuple[str, ...], message: str) -> ConfigProblem:
        """A problem at key ``path`` of goal ``goal_id``, blamed on the file (and line) that set it.

        Raises:
            NotFound, ConfigError: the goal does not compose.
        """
        _goal, comp = self._load_goal(goal_id)
        return comp.problem(tuple(p for p in path if p), message)

    # -- recipes ---------------------------------------------------------------------------
    def resolve(self, ref: str, overrides: list[str] | tuple[str, ...] = ()) -> ResolvedRecipe:
        """Compose and validate ``GOAL/RECIPE`` with ``--set`` overrides applied, and hash it.

        Raises:
            NotFound: unknown goal or recipe. ConfigError: a goal or recipe id that is not one
            name (:func:`check_id`, checked before any file is opened); every problem found,
            each with file, key path, expected and found.
        """
        # Ids checked before any file is read: they cannot leave the experiments tree.
        goal_id, recipe_id = tree.parse_ref(self.goals_dir, ref)
        _, path = tree.ref_files(self.goals_dir, goal_id, recipe_id)
        goal, goal_comp = self._load_goal(goal_id)
        comp = self._compose(path)
        problems: list[ConfigProblem] = []
        data = dict(comp.data)
        if data.setdefault("recipe_id", recipe_id) != recipe_id:
            problems.append(comp.problem(("recipe_id",), f"expected '{recipe_id}' (the file name), found {data['recipe_id']!r}"))
        # Overrides: a pseudo-layer named --set, so problems in them are blamed on the command line.
        set_doc = YamlDocument(file="--set", data={})
        for text in overrides:
            try:
                key, value = parse_override(text)
            except ConfigError as e:
                problems += e.problems
                continue
            if key[0] == "eval":
                problems.append(ConfigProblem(file="--set", key_path=".".join(key), message="evaluation settings belong to the goal's protocol and cannot be overridden"))
                continue
            set_path(set_doc.data, key, value)
            for n in range(1, len(key) + 1):
                set_doc.positions[key[:n]] = (0, 0)
        if set_doc.data:
            data = merge([data, set_doc.data], "--set")
            comp.layers.append(set_doc)
        context = {**self._template_vars.get(goal_id, {}), "goal_id": goal_id, "recipe_id": recipe_id,
                   "env_id": goal.train.environment.env_id}
        data, template_problems = render_templates(data, context, comp)
        problems += template_problems + secret_problems(data, comp)
        try:
            recipe = Recipe.model_validate(data)
        except ValidationError as e:
            problems += validation_problems(e, Recipe, comp)
            raise ConfigError(_positions_for_set(problems)) from None
        if recipe.train.starts is not None:  # weights name the goal's own starts
            for name in recipe.train.starts:
                if name not in goal.eval.starts:
                    problems.append(comp.problem(("train", "starts", name), (
                        f"goal '{goal_id}' has no start '{name}'; expected one of {goal.eval.starts} (its eval.starts)"
                        if goal.eval.starts else f"goal '{goal_id}' names no starts (eval.starts), found '{name}'")))
        environment = None
        env_data = goal.train.environment.model_dump(mode="json")
        changes = recipe.train.environment.model_dump(mode="json", exclude_none=True)
        merged_env = merge([env_data, changes], comp.layers[-1].file) if changes else env_data
        try:
            environment = EnvironmentSpec.model_validate(merged_env)
        except ValidationError as e:
            problems += validation_problems(e, EnvironmentSpec, comp, prefix=("train", "environment"))
        archive = recipe.train.archive_curriculum
        if environment is not None and archive is not None and archive.cell.kind == "signals":
            known = list(environment.task.signals)
            where = ("train", "curriculum", "archive", "cell", "signals")
            if not archive.cell.signals:
                problems.append(comp.problem(where, (
                    f"expected the signals the cells are made of, some of the goal's ({', '.join(known)}), or "
                    "cell.kind: frame; found none" if known else
                    "expected cell.kind: frame (the goal's task program has no signals to make cells of); found none")))
            elif unknown := [name for name in archive.cell.signals if name not in known]:
                problems.append(comp.problem(where, (
                    f"expected signals of the goal's task program ({', '.join(known) or 'none'}); "
                    f"found {', '.join(unknown)}, which it lacks")))
        if problems:
            raise ConfigError(_positions_for_set(problems))
        assert environment is not None
        hashes = Hashes(
            goal_contract_sha256=goal_contract_sha256(goal),
            recipe_sha256=recipe_sha256(recipe),
            environment_sha256=environment_sha256(environment),
        )
        return ResolvedRecipe(
            goal=goal, recipe=recipe, environment=environment, overrides=tuple(overrides), hashes=hashes,
            goal_file=goal_comp.layers[-1].file, recipe_file=comp.layers[0].file if comp.layers else str(path),
        )

    # -- catalog ---------------------------------------------------------------------------
    @cached_property
    def catalog(self) -> Catalog:
        path = self.goals_dir / CATALOG_FILE
        if not path.is_file():
            return Catalog()
        doc = load_yaml(path, str(path.relative_to(self._display_root)))
        try:
            return Catalog.model_validate(doc.data)
        except ValidationError as e:
            raise ConfigError(validation_problems(e, Catalog, Composition(doc.data, [doc]))) from None

    # -- everything --------------------------------------------------------------------------
    def validate_all(self) -> ValidationReport:
        """Compose and validate every goal, recipe, preset and the catalog; collect every problem."""
        report = ValidationReport()
        goal_ids = self.goal_ids()
        for goal_id in goal_ids:
            report.goals += 1
            try:
                self.load_goal(goal_id)
            except ConfigError as e:
                report.problems += e.problems
                continue
            for recipe_id in self.recipe_ids(goal_id):
                report.recipes += 1
                try:
                    self.resolve(f"{goal_id}/{recipe_id}")
                except ConfigError as e:
                    report.problems += e.problems
        for name in self.preset_names():
            report.presets += 1
            report.problems += self._preset_problems(self.presets_dir / f"{name}.yaml")
        try:
            catalog = self.catalog
        except ConfigError as e:
            report.problems += e.problems
        else:
            catalog_file = str((self.goals_dir / CATALOG_FILE).relative_to(self._display_root))
            seen: dict[str, str] = {}
            families = self.families()
            for project, entry in catalog.projects.items():
                for gid in entry.goals:
                    if gid not in goal_ids and gid not in families:
                        report.problems.append(ConfigProblem(catalog_file, f"projects.{project}.goals", f"expected a goal or a family folder, found no goal '{gid}'"))
                    if gid in seen:
                        report.problems.append(ConfigProblem(catalog_file, f"projects.{project}.goals", f"goal '{gid}' is already in project '{seen[gid]}'"))
                    seen[gid] = project
            for gid in goal_ids:
                if catalog.project_of(gid) is None:
                    report.problems.append(ConfigProblem(catalog_file, "projects", f"goal '{gid}' belongs to no project"))
        return report

    def _preset_problems(self, path: Path) -> list[ConfigProblem]:
        """A preset is a partial recipe: every key it has must be valid; missing keys are fine."""
        try:
            comp = self._compose(path)
        except ConfigError as e:
            return e.problems
        data = {"recipe_id": "preset", **comp.data}
        try:
            Recipe.model_validate(data)
        except ValidationError as e:
            return [p for p in validation_problems(e, Recipe, comp) if p.message != "missing required key"]
        return []


def goal_contract_sha256(goal: Goal) -> str:
    """sha256 of the composed, rendered goal without cosmetic fields (title, description, tags)."""
    return sha256_json(goal.model_dump(mode="json", exclude=COSMETIC_GOAL_FIELDS))


def recipe_sha256(recipe: Recipe) -> str:
    """sha256 of the composed recipe with overrides applied, without its description."""
    return sha256_json(recipe.model_dump(mode="json", exclude=COSMETIC_RECIPE_FIELDS))


def environment_sha256(environment: EnvironmentSpec) -> str:
    """sha256 of the environment's semantic fields (not lane count, vectorisation or threads)."""
    return sha256_json(environment.semantic())


def _positions_for_set(problems: list[ConfigProblem]) -> list[ConfigProblem]:
    # The --set pseudo-layer has no real line numbers.
    return [ConfigProblem(p.file, p.key_path, p.message) if p.file == "--set" else p for p in problems]


def _get(data: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data
