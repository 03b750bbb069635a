"""The house stays as drawn: the product's import graph, computed from the source with ``ast``.

``uv run lint-imports`` (in ``.ci/run``) checks the floors of ``docs/ARCHITECTURE.md`` section 2
as import-linter contracts in ``pyproject.toml``. This module checks what those contracts cannot
say, on a graph it builds itself, so a contract that quietly stops matching (a renamed package, a
new room no floor names) fails here:

* no circle anywhere in the product (``gradlab``, ``flows``, ``tasks``), counting imports inside
  functions, which are edges like any other: a lazy import hides a cost, not a dependency;
* every room (``gradlab.<package>`` and the top-level modules of ``gradlab``) stands on one floor
  of the layers contract, and no room imports a floor above its own;
* no module imports a private name (``_name``) from another module of the product;
* nothing imports the root package ``gradlab`` for a name (the version lives in
  ``gradlab.version``), so the root stays a thin public face;
* every product module is at most 600 lines.
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gradlab", "flows", "tasks")
MAX_LINES = 600


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package ``__init__``), for every product module."""
    found = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


MODULES = _modules()


def _known(name: str) -> str | None:
    """The longest product module that ``name`` (a module or ``module.attribute``) falls in."""
    parts = name.split(".")
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts) or None


def _imports(module: str) -> list[tuple[str, str | None]]:
    """(imported module, imported name or None) for every import statement of ``module``."""
    path, is_package = MODULES[module]
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                out.append((submodule, None) if submodule in MODULES else (source, alias.name))
    return out


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for module in MODULES:
        for imported, _ in _imports(module):
            target = _known(imported)
            if target and target != module:
                edges[module].add(target)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(MODULES):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _room(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "gradlab" and len(parts) > 1 else parts[0]


def _floors() -> list[tuple[set[str], bool]]:
    """The layers contract of ``pyproject.toml``, top floor first: (room names, independent).

    A floor written ``a | b`` holds independent rooms (neither imports the other); ``a : b`` rooms
    that may import each other (import-linter's notation).
    """
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    layers = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    assert len(layers) == 1, "pyproject.toml should hold exactly one layers contract (the floors)"
    return [({n.strip() for n in floor.replace(":", "|").split("|")}, ":" not in floor) for floor in layers[0]["layers"]]


def test_the_graph_sees_the_product():
    edges = _graph()
    assert len(MODULES) > 150 and sum(map(len, edges.values())) > 500
    assert "gradlab.learn.learner" in edges["gradlab.learn.__main__"]  # a plain edge is seen
    assert "gradlab.checkpoints.bundle" in edges["gradlab.learn.learner"]


def test_no_circle_in_the_product():
    cycles = _cycles(_graph())
    assert not cycles, "import circles (each a strongly connected set of modules):\n" + "\n".join(map(str, cycles))


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"gradlab.errors": {"gradlab.fsync"}, "gradlab.fsync": {"gradlab.errors"}}) == [
        ["gradlab.errors", "gradlab.fsync"]
    ]


def test_every_room_stands_on_one_floor_and_imports_only_floors_below():
    floors = _floors()
    floor_of = {}
    for level, (rooms, _) in enumerate(floors):
        for room in rooms:
            assert room not in floor_of, f"{room} stands on two floors"
            floor_of[room] = level
    rooms = {_room(m) for m in MODULES} - {"gradlab"}
    unplaced = sorted(rooms - set(floor_of))
    assert not unplaced, f"rooms no floor of pyproject.toml's layers contract names: {unplaced}"
    upward = []
    for module, targets in _graph().items():
        for target in targets:
            a, b = _room(module), _room(target)
            if a == b or a not in floor_of or b not in floor_of:
                continue
            if floor_of[b] < floor_of[a] or (floor_of[b] == floor_of[a] and floors[floor_of[a]][1]):
                upward.append(f"{module} -> {target}")
    assert not upward, "imports of the same or a higher floor:\n" + "\n".join(sorted(upward))


def test_no_module_imports_a_private_name_of_another():
    offenders = [
        f"{module}: {name} from {source}"
        for module in MODULES
        for source, name in _imports(module)
        if name and name.startswith("_") and not name.startswith("__") and _known(source) not in (None, module)
    ]
    assert not offenders, "\n".join(sorted(offenders))


def test_nothing_imports_the_root_package_for_a_name():
    offenders = [
        f"{module}: {name or 'import gradlab'}"
        for module in MODULES
        if module != "gradlab"
        for source, name in _imports(module)
        if source == "gradlab"
    ]
    assert not offenders, "\n".join(sorted(offenders))


def test_every_module_is_at_most_600_lines():
    long = []
    for path, _ in MODULES.values():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            long.append(f"{path.relative_to(ROOT)}: {lines} lines; split it along what it owns")
    assert not long, "\n".join(long)
