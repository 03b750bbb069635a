"""The experiments tree's layout: ids, where a goal's and a recipe's files are, what the tree holds.

Nothing here parses a file: ``gradlab train`` checks that ``GOAL/RECIPE`` names files that exist
before it starts anything (the background server, the warm flow), without importing pydantic or
the composition machinery (:mod:`gradlab.contracts.experiments` composes, validates and hashes).
Standard library only.

Layout (relative to the experiments root)::

    goals/_catalog.yaml                  projects → goals and families
    goals/<goal_id>/_goal.yaml           one goal; ``<goal_id>`` is a path ``Family/Sub`` (at most
                                         MAX_GOAL_DEPTH names), so a goal folder may hold sub-goals
    goals/<goal_id>/recipes/<id>.yaml    its recipes
    goals/<family>/_goal-common.yaml     composed first into every goal under ``<family>``
    goals/**/_*.yaml                     shared fragments named by ``defaults:``
    recipes/_presets/<name>.yaml         recipe presets named by ``defaults:``

The root is, in order: ``$GRADLAB_EXPERIMENTS``; an ``experiments/`` folder with ``goals/`` in the
current directory or a parent; the checkout this package was imported from; the copy bundled in
the wheel.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

from gradlab.errors import ConfigError, NotFound

GOAL_FILE = "_goal.yaml"
CATALOG_FILE = "_catalog.yaml"
#: A family's fragment composed first into every goal below its folder.
FAMILY_COMMON_FILE = "_goal-common.yaml"
#: Most names in a goal id (``Family/Sub/Variant`` is 3).
MAX_GOAL_DEPTH = 4
#: Folder names that are never goals: a goal's recipes live there.
RESERVED = frozenset({"recipes"})

#: One id name, matched whole (``fullmatch``: a trailing newline is not part of a name).
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters of the value, for an error message."""
    text = value if isinstance(value, str) else str(value)
    return repr(text[:limit]) + ("…" if len(text) > limit else "")


def check_id(kind: str, value: str) -> str:
    """A goal or recipe id, checked before any file is opened.

    A recipe id is one name of letters, digits and ``_ . + -`` (starting with a letter or digit,
    at most 128), never ``..``. A goal id is a path of 1 to :data:`MAX_GOAL_DEPTH` such names
    joined by ``/`` (``SuperMarioBros-Nes-v0/Level1-1``), none of them ``recipes``: no leading
    ``/``, no empty name, no ``..``. Ids name folders and files under the experiments tree;
    anything else could reach outside it (``gradlab__bandit/../../../tmp/x``).

    Raises:
        ConfigError: naming the kind, what is expected and the id found (cut at 80 characters).
    """
    ok = isinstance(value, str) and ".." not in value
    if kind == "goal":
        parts = value.split("/") if ok else []
        ok = ok and len(parts) <= MAX_GOAL_DEPTH and all(ID_RE.fullmatch(p) and p not in RESERVED for p in parts)
        expected = (f"a path of 1 to {MAX_GOAL_DEPTH} names of letters, digits and _ . + - joined by '/' "
                    "(no leading '/', no '..', no 'recipes')")
    else:
        ok = ok and bool(ID_RE.fullmatch(value))
        expected = "one name of letters, digits and _ . + - (no '/', no '..')"
    if not ok:
        raise ConfigError(f"{kind} id: expected {expected}, found {shown(value)}")
    return value


def split_ref(ref: str) -> tuple[str, str]:
    """``GOAL/RECIPE`` -> (goal id, recipe id); the recipe is the last name, the goal the path before.

    Both are checked with :func:`check_id` before anything is read.

    Raises:
        ConfigError: not GOAL/RECIPE, or an id :func:`check_id` refuses.
    """
    goal_id, sep, recipe_id = ref.rpartition("/") if isinstance(ref, str) else ("", "", "")
    if not sep or not goal_id or not recipe_id:
        raise ConfigError(f"expected GOAL/RECIPE, found {shown(ref)}")
    return check_id("goal", goal_id), check_id("recipe", recipe_id)


#: A recipe file's path given as a ref: ``[...]goals/GOAL/recipes/RECIPE.yaml``.
_RECIPE_PATH = re.compile(r"(?:^|/)goals/(.+)/recipes/([^/]+?)\.ya?ml\Z")


def parse_ref(goals_dir: Path, ref: str) -> tuple[str, str]:
    """:func:`split_ref`, saying what to type instead when ``ref`` is not GOAL/RECIPE but names a
    goal (``CartPole-v1``), a family (``Bandit``) or a recipe file
    (``experiments/goals/CartPole-v1/recipes/ppo.yaml``). Only names :func:`check_id` accepts are
    looked up, so nothing outside the tree is touched.

    Raises:
        ConfigError: as :func:`split_ref`. NotFound: the ref names a goal, a family or a recipe
        file: the refs to type.
    """
    try:
        return split_ref(ref)
    except ConfigError:
        if not isinstance(ref, str):
            raise
        text = ref.strip().rstrip("/")
        path = _RECIPE_PATH.search(text)
        if path is not None and _is_id("goal", path[1]) and _is_id("recipe", path[2]) \
                and (goals_dir / path[1] / "recipes" / f"{path[2]}.yaml").is_file():
            raise NotFound(f"{shown(ref)} is a recipe file; name it as GOAL/RECIPE: {path[1]}/{path[2]}") from None
        if "/" not in ref.strip() or ref.endswith("/"):
            if _is_id("goal", text) and (goals_dir / text / GOAL_FILE).is_file():
                raise NotFound(_recipes_to_name(goals_dir, text)) from None
            members = [g for g in goal_ids(goals_dir) if g.startswith(text + "/")] if _is_id("goal", text) else []
            if members:
                raise NotFound(f"'{text}' is a family of goals, not a goal: {', '.join(members)}; "
                               "name one of them and a recipe: GOAL/RECIPE") from None
        raise


def _is_id(kind: str, value: str) -> bool:
    try:
        check_id(kind, value)
    except ConfigError:
        return False
    return True


def _recipes_to_name(goals_dir: Path, goal_id: str) -> str:
    recipes = recipe_ids(goals_dir, goal_id)
    return (f"'{goal_id}' is a goal; name one of its recipes: GOAL/RECIPE, e.g. "
            + (", ".join(f"{goal_id}/{r}" for r in recipes) if recipes else f"{goal_id}/ppo (it has none yet)"))


def _closest(name: str, known: list[str]) -> str | None:
    """The known name equal to ``name`` but for case, else difflib's closest, else None."""
    same = [k for k in known if k.lower() == name.lower()]
    if same:
        return same[0]
    close = difflib.get_close_matches(name, known, n=1)
    return close[0] if close else None


def goal_family(goal_id: str) -> str | None:
    """The family of a nested goal id (``A/B/C`` -> ``A/B``); None for a top-level goal."""
    family, sep, _ = goal_id.rpartition("/")
    return family if sep else None


def find_experiments_root(start: Path | None = None) -> Path:
    """Locate the experiments root (see the module docstring for the order).

    Raises:
        NotFound: none of the places holds an experiments tree, or the current directory no
        longer exists.
    """
    env = os.environ.get("GRADLAB_EXPERIMENTS")
    if env:
        return Path(env).expanduser().resolve()
    try:
        here = (start or Path.cwd()).resolve()
    except FileNotFoundError:
        raise NotFound("the current directory no longer exists: change to one that does") from None
    for folder in (here, *here.parents):
        candidate = folder / "experiments"
        if (candidate / "goals").is_dir():
            return candidate
    package = Path(__file__).resolve().parents[1]
    checkout = package.parent / "experiments"
    if (checkout / "goals").is_dir():
        return checkout
    bundled = package / "_bundled" / "experiments"
    if (bundled / "goals").is_dir():
        return bundled
    raise NotFound("no experiments folder found: set GRADLAB_EXPERIMENTS or run inside a gradlab checkout")


def goal_ids(goals_dir: Path) -> list[str]:
    """Every goal id under ``goals_dir``: folders with a ``_goal.yaml``, at most MAX_GOAL_DEPTH deep."""
    found: list[str] = []

    def walk(folder: Path, prefix: str, depth: int) -> None:
        for p in sorted(folder.iterdir()):
            if not p.is_dir() or not ID_RE.fullmatch(p.name) or p.name in RESERVED or ".." in p.name:
                continue
            gid = f"{prefix}{p.name}"
            if (p / GOAL_FILE).is_file():
                found.append(gid)
            if depth < MAX_GOAL_DEPTH:
                walk(p, gid + "/", depth + 1)

    if goals_dir.is_dir():
        walk(goals_dir, "", 1)
    return sorted(found)


def recipe_ids(goals_dir: Path, goal_id: str) -> list[str]:
    """The recipe ids of one goal (its ``recipes/*.yaml`` but ``_*`` fragments), sorted.

    Raises:
        ConfigError: ``goal_id`` is not a goal id (:func:`check_id`).
    """
    check_id("goal", goal_id)
    folder = goals_dir / goal_id / "recipes"
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.yaml") if not p.name.startswith("_") and p.is_file())


def goal_file(goals_dir: Path, goal_id: str) -> Path:
    """The path of the goal's ``_goal.yaml``.

    Raises:
        ConfigError: ``goal_id`` is not a goal id. NotFound: ``unknown goal 'X'`` with the closest
        known goal or the known goals; a family's goals when ``X`` is a family; the tree searched
        when it holds no goal at all.
    """
    check_id("goal", goal_id)
    path = goals_dir / goal_id / GOAL_FILE
    if path.is_file():
        return path
    known = goal_ids(goals_dir)
    if not known:
        where = f"GRADLAB_EXPERIMENTS={os.environ['GRADLAB_EXPERIMENTS']}" if os.environ.get("GRADLAB_EXPERIMENTS") \
            else "the experiments tree found from the current directory"
        raise NotFound(f"unknown goal '{goal_id}': {goals_dir} ({where}) holds no goal "
                       f"(folders with a {GOAL_FILE})")
    members = [g for g in known if g.startswith(goal_id + "/")]
    if members:
        raise NotFound(f"'{goal_id}' is a family of goals, not a goal: {', '.join(members)}")
    hint = _closest(goal_id, known)
    raise NotFound(f"unknown goal '{goal_id}'" + (f" (did you mean {hint}?)" if hint
                                                   else f"; known goals: {', '.join(known)}"))


def recipe_file(goals_dir: Path, goal_id: str, recipe_id: str) -> Path:
    """The path of the goal's recipe file (the goal is not checked: :func:`goal_file` does that).

    Raises:
        ConfigError: an id :func:`check_id` refuses. NotFound: ``goal 'G' has no recipe 'R'`` with
        the closest recipe of the goal, or its recipes.
    """
    check_id("recipe", recipe_id)
    path = goals_dir / goal_id / "recipes" / f"{recipe_id}.yaml"
    if not path.is_file():
        known = recipe_ids(goals_dir, goal_id)
        stem = recipe_id.removesuffix(".yaml").removesuffix(".yml")
        hint = stem if stem != recipe_id and stem in known else _closest(recipe_id, known)
        raise NotFound(f"goal '{goal_id}' has no recipe '{recipe_id}'" + (
            f" (did you mean {goal_id}/{hint}?)" if hint else f"; its recipes: {', '.join(known) or 'none'}"))
    return path


def ref_files(goals_dir: Path, goal_id: str, recipe_id: str) -> tuple[Path, Path]:
    """The goal's and the recipe's files for ``GOAL/RECIPE`` already split, checked to exist (not
    parsed). A whole ref that is itself a goal (``Bandit/Arms4``: its recipe forgotten) is named as
    such, with its recipes.

    Raises:
        ConfigError: a bad id. NotFound: as :func:`goal_file` and :func:`recipe_file` say.
    """
    whole = f"{goal_id}/{recipe_id}"
    if not (goals_dir / goal_id / "recipes" / f"{recipe_id}.yaml").is_file() \
            and (goals_dir / whole / GOAL_FILE).is_file():
        raise NotFound(_recipes_to_name(goals_dir, whole))
    return goal_file(goals_dir, goal_id), recipe_file(goals_dir, goal_id, recipe_id)


def check_ref(ref: str) -> tuple[Path, Path]:
    """The goal and recipe files ``GOAL/RECIPE`` names in this process's experiments tree, checked
    to exist (not parsed): what a command can refuse before it starts anything.

    Raises:
        ConfigError: not GOAL/RECIPE, a bad id (:func:`split_ref`), or a folder of the tree that
        cannot be read (its path and the system's reason). NotFound: no experiments tree, a ref
        that names a goal, a family or a recipe file (:func:`parse_ref`), an unknown goal or
        recipe (:func:`ref_files`).
    """
    try:
        goals_dir = find_experiments_root().resolve() / "goals"
        return ref_files(goals_dir, *parse_ref(goals_dir, ref))
    except OSError as e:
        raise ConfigError(f"cannot read the experiments tree: {e.filename or 'a folder'}: {e.strerror or e}") from None
