"""The project's ``prefect.yaml``: reading its deployments and checking them without Prefect.

``gradlab validate`` calls :func:`validate_deployments`: every deployment names an entrypoint file
that exists, whose function is a top-level ``def`` in that file, and whose ``parameters`` are
among that function's parameter names (read with :mod:`ast`, so neither prefect nor torch is
imported). Parameter values are checked where gradlab knows their meaning: ``recipe`` is a
``GOAL/RECIPE`` that exists, ``seed`` a non-negative integer, ``overrides`` a list of
``dotted.key=value`` strings, ``wandb_mode`` one of ``disabled|offline|online`` (or null: the
worker machine's setting). Every deployment's work pool must be one of
``deployments/work-pools/pools.yaml``. Deployments carry references (recipe, seed, overrides,
W&B mode), never copies of hyperparameters: a parameter the flow does not declare is refused.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradlab.errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    from gradlab.contracts import Experiments

logger = logging.getLogger(__name__)

PREFECT_YAML = "prefect.yaml"
WANDB_MODES = ("disabled", "offline", "online")


@dataclass(frozen=True)
class DeploymentSpec:
    """One entry of ``deployments:`` in ``prefect.yaml`` (after YAML anchors are resolved).

    ``index`` is its position in the list (for error key paths such as ``deployments.0.entrypoint``).
    """

    index: int
    name: str
    entrypoint: str
    work_pool: str | None
    parameters: dict[str, Any]
    tags: tuple[str, ...]
    raw: dict[str, Any]

    @property
    def entrypoint_path(self) -> str:
        """The file part of ``path/to/file.py:function``."""
        return self.entrypoint.rsplit(":", 1)[0]

    @property
    def function(self) -> str:
        """The function part of ``path/to/file.py:function``."""
        return self.entrypoint.rsplit(":", 1)[1] if ":" in self.entrypoint else ""


@dataclass(frozen=True)
class PrefectProject:
    """A parsed ``prefect.yaml``: its path, pull steps and deployments."""

    path: Path
    name: str | None
    pull: list[dict[str, Any]]
    deployments: list[DeploymentSpec]
    data: dict[str, Any] = field(repr=False)

    @property
    def root(self) -> Path:
        return self.path.parent

    def deployment(self, name: str) -> DeploymentSpec:
        """The deployment called ``name`` (``local``), or ``flow-name/name`` (``training-run/local``).

        Raises:
            NotFound: no deployment of that name.
        """
        from gradlab.errors import NotFound

        short = name.split("/", 1)[1] if "/" in name else name
        for spec in self.deployments:
            if spec.name == short:
                return spec
        known = ", ".join(d.name for d in self.deployments) or "none"
        raise NotFound(f"{self.path}: no deployment {name!r} (found: {known})")


@dataclass(frozen=True)
class FlowSignature:
    """What :mod:`ast` can tell about a flow function without importing it.

    ``flow_name`` is the ``name=`` of its ``@flow(...)`` decorator, else Prefect's default (the
    function name with ``_`` replaced by ``-``). ``parameters`` are its parameter names in order;
    ``accepts_any`` is True when it has ``**kwargs``.
    """

    file: Path
    function: str
    flow_name: str
    parameters: tuple[str, ...]
    accepts_any: bool
    is_flow: bool


def find_project_root(start: Path | None = None) -> Path | None:
    """The gradlab checkout: ``prefect.yaml`` next to a ``pyproject.toml`` of project ``gradlab``, or None.

    Looks in ``start`` (default: the current directory) and its parents, then in the checkout this
    package was imported from. An installed wheel has no ``prefect.yaml``: None.
    """
    here = (start or Path.cwd()).resolve()
    candidates = [here, *here.parents, Path(__file__).resolve().parents[2]]
    for folder in candidates:
        if (folder / PREFECT_YAML).is_file() and _is_gradlab_project(folder / "pyproject.toml"):
            return folder
    return None


def _is_gradlab_project(pyproject: Path) -> bool:
    """True when ``pyproject`` exists and names the project ``gradlab`` (not some other Prefect project)."""
    import tomllib

    try:
        with pyproject.open("rb") as f:
            return tomllib.load(f).get("project", {}).get("name") == "gradlab"
    except (OSError, tomllib.TOMLDecodeError):
        return False


def load_prefect_yaml(root: Path) -> PrefectProject:
    """Parse ``root/prefect.yaml`` (YAML anchors and merge keys resolved by PyYAML).

    Raises:
        ConfigError: the file is missing, not valid YAML, or its ``deployments`` is not a list of
            mappings each with a ``name`` and an ``entrypoint``.
    """
    import yaml

    path = root / PREFECT_YAML
    shown = PREFECT_YAML
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError([ConfigProblem(shown, "", f"cannot read: {e}")]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError([ConfigProblem(shown, "", f"invalid YAML: {e}",
                                         line=mark.line + 1 if mark else None,
                                         column=mark.column + 1 if mark else None)]) from None
    if not isinstance(data, dict):
        raise ConfigError([ConfigProblem(shown, "", f"expected a mapping, found {type(data).__name__}")])
    problems: list[ConfigProblem] = []
    raw_deployments = data.get("deployments")
    if not isinstance(raw_deployments, list) or not raw_deployments:
        problems.append(ConfigProblem(shown, "deployments", "expected a non-empty list of deployments"))
        raw_deployments = []
    pull = data.get("pull") or []
    if not isinstance(pull, list):
        problems.append(ConfigProblem(shown, "pull", f"expected a list of steps, found {type(pull).__name__}"))
        pull = []
    deployments: list[DeploymentSpec] = []
    for i, entry in enumerate(raw_deployments):
        where = f"deployments.{i}"
        if not isinstance(entry, dict):
            problems.append(ConfigProblem(shown, where, f"expected a mapping, found {type(entry).__name__}"))
            continue
        name, entrypoint = entry.get("name"), entry.get("entrypoint")
        if not isinstance(name, str) or not name:
            problems.append(ConfigProblem(shown, f"{where}.name", "expected a deployment name"))
        if not isinstance(entrypoint, str) or ":" not in entrypoint:
            problems.append(ConfigProblem(shown, f"{where}.entrypoint",
                                          f"expected 'path/to/file.py:function', found {entrypoint!r}"))
        params = entry.get("parameters") or {}
        if not isinstance(params, dict):
            problems.append(ConfigProblem(shown, f"{where}.parameters", f"expected a mapping, found {type(params).__name__}"))
            params = {}
        pool = entry.get("work_pool") or {}
        pool_name = pool.get("name") if isinstance(pool, dict) else None
        if not isinstance(name, str) or not name or not isinstance(entrypoint, str) or ":" not in entrypoint:
            continue
        deployments.append(DeploymentSpec(
            index=i, name=str(name), entrypoint=str(entrypoint), work_pool=pool_name, parameters=dict(params),
            tags=tuple(str(t) for t in entry.get("tags") or ()), raw=entry,
        ))
    if problems:
        raise ConfigError(problems)
    return PrefectProject(path=path, name=data.get("name"), pull=pull, deployments=deployments, data=data)


def _decorator_flow_name(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[bool, str | None]:
    """(is decorated with ``flow``/``prefect.flow``, its ``name=`` if a string literal)."""
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        dotted = target.id if isinstance(target, ast.Name) else (
            target.attr if isinstance(target, ast.Attribute) else None)
        if dotted != "flow":
            continue
        if isinstance(dec, ast.Call):
            for kw in dec.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    return True, kw.value.value
        return True, None
    return False, None


def flow_signature(path: Path, function: str) -> FlowSignature:
    """Read a flow function's name and parameters from its source, without importing it.

    Args:
        path: the Python file.
        function: the name of a top-level ``def`` or ``async def`` in it.

    Raises:
        ConfigError: the file cannot be read or parsed, or has no top-level ``function``.
    """
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    except SyntaxError as e:
        raise ConfigError([ConfigProblem(str(path), "", f"invalid Python: {e.msg}", line=e.lineno,
                                         column=e.offset)]) from None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == function:
            args = node.args
            names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
            is_flow, flow_name = _decorator_flow_name(node)
            return FlowSignature(file=path, function=function, flow_name=flow_name or function.replace("_", "-"),
                                 parameters=tuple(names), accepts_any=args.kwarg is not None, is_flow=is_flow)
    raise ConfigError(f"{path}: no top-level function {function!r}")


def _pull_step_problems(project: PrefectProject, shown: str) -> list[ConfigProblem]:
    problems = []
    for i, step in enumerate(project.pull):
        if not isinstance(step, dict) or len(step) != 1:
            problems.append(ConfigProblem(shown, f"pull.{i}", "expected a mapping of one step name to its inputs"))
            continue
        fqn = next(iter(step))
        module, _, func = fqn.rpartition(".")
        if not module.startswith("gradlab."):
            continue  # prefect's own steps are not imported here (validate stays prefect-free)
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        origin = Path(spec.origin) if spec and spec.origin else None
        if origin is None or not origin.is_file():
            problems.append(ConfigProblem(shown, f"pull.{i}", f"step {fqn!r}: module {module!r} not found"))
            continue
        tree = ast.parse(origin.read_text())
        if not any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == func for n in tree.body):
            problems.append(ConfigProblem(shown, f"pull.{i}", f"step {fqn!r}: {origin} has no function {func!r}"))
    return problems


def _parameter_value_problems(spec: DeploymentSpec, shown: str,
                              experiments: Experiments | None) -> list[ConfigProblem]:
    where = f"deployments.{spec.index}.parameters"
    problems: list[ConfigProblem] = []
    params = spec.parameters
    if "recipe" in params and params["recipe"] is not None:
        ref = params["recipe"]
        if not isinstance(ref, str) or ref.rpartition("/")[0] == "" or not ref.rpartition("/")[2]:
            problems.append(ConfigProblem(shown, f"{where}.recipe", f"expected GOAL/RECIPE, found {ref!r}"))
        elif experiments is not None:
            goal, _, recipe = ref.rpartition("/")
            if goal not in experiments.goal_ids() or recipe not in experiments.recipe_ids(goal):
                problems.append(ConfigProblem(shown, f"{where}.recipe", f"expected an existing GOAL/RECIPE, found {ref!r}"))
    if "seed" in params and (not isinstance(params["seed"], int) or isinstance(params["seed"], bool) or params["seed"] < 0):
        problems.append(ConfigProblem(shown, f"{where}.seed", f"expected a non-negative integer, found {params['seed']!r}"))
    if "overrides" in params and params["overrides"] is not None:
        value = params["overrides"]
        if not isinstance(value, list) or not all(isinstance(v, str) and "=" in v for v in value):
            problems.append(ConfigProblem(shown, f"{where}.overrides", f"expected a list of 'dotted.key=value', found {value!r}"))
    if "wandb_mode" in params and params["wandb_mode"] is not None and params["wandb_mode"] not in WANDB_MODES:
        problems.append(ConfigProblem(shown, f"{where}.wandb_mode",
                                      f"expected one of {', '.join(WANDB_MODES)} or null, found {params['wandb_mode']!r}"))
    for key, value in params.items():
        if isinstance(value, dict):
            problems.append(ConfigProblem(shown, f"{where}.{key}", "expected a reference (recipe, seed, overrides, "
                                          "W&B mode), found a mapping: deployments never copy hyperparameters"))
    return problems


def validate_deployments(root: Path, experiments: Experiments | None = None) -> list[ConfigProblem]:
    """Every problem with ``root/prefect.yaml``'s deployments (empty list: all good).

    Args:
        root: the project root (holds ``prefect.yaml`` and ``deployments/work-pools/pools.yaml``).
        experiments: when given, a ``recipe`` parameter must name an existing GOAL/RECIPE.

    Checks, per deployment: unique name; entrypoint file exists under ``root`` and defines the
    function (an ``@flow``); each parameter is one of the function's parameter names and has a
    valid value; the work pool is defined in ``pools.yaml``. Also each ``gradlab.*`` pull step
    exists. Never imports prefect or the flow.
    """
    from gradlab.deploy.pools import load_pools

    shown = PREFECT_YAML
    try:
        project = load_prefect_yaml(root)
    except ConfigError as e:
        return list(e.problems)
    problems = _pull_step_problems(project, shown)
    try:
        pool_names = {p.name for p in load_pools(root).pools}
    except ConfigError as e:
        problems += e.problems
        pool_names = None
    seen: set[str] = set()
    for spec in project.deployments:
        where = f"deployments.{spec.index}"
        if spec.name in seen:
            problems.append(ConfigProblem(shown, f"{where}.name", f"duplicate deployment name {spec.name!r}"))
        seen.add(spec.name)
        if pool_names is not None and spec.work_pool not in pool_names:
            problems.append(ConfigProblem(shown, f"{where}.work_pool.name",
                                          f"expected one of {sorted(pool_names)} (deployments/work-pools/pools.yaml), "
                                          f"found {spec.work_pool!r}"))
        file = root / spec.entrypoint_path
        if not file.is_file():
            problems.append(ConfigProblem(shown, f"{where}.entrypoint", f"entrypoint file {spec.entrypoint_path} does not exist"))
            continue
        try:
            signature = flow_signature(file, spec.function)
        except ConfigError as e:
            problems += [ConfigProblem(shown, f"{where}.entrypoint", p.render()) for p in e.problems]
            continue
        if not signature.is_flow:
            problems.append(ConfigProblem(shown, f"{where}.entrypoint", f"{spec.entrypoint}: function is not decorated with @flow"))
        unknown = [k for k in spec.parameters if k not in signature.parameters]
        if unknown and not signature.accepts_any:
            for key in unknown:
                problems.append(ConfigProblem(
                    shown, f"{where}.parameters.{key}",
                    f"unknown parameter of {signature.flow_name} (expected one of {', '.join(signature.parameters)})"))
        problems += _parameter_value_problems(spec, shown, experiments)
    return problems
