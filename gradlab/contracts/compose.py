"""Composition of goal and recipe files: ``defaults:`` lists, deep merge, templating, overrides.

A file's ``defaults:`` list names, in merge order, other files and the marker ``_self_`` (where the
file's own keys apply; last when absent). An entry ending in ``.yaml`` is a path relative to the
file; any other entry is a preset name under ``experiments/recipes/_presets/``. Mappings merge
deeply and lists replace (OmegaConf's merge). A cycle is an error.

After merging, ``{{ goal_id }}``, ``{{ recipe_id }}`` and ``{{ env_id }}`` are substituted in every
string, with the names a goal family declares in ``template_vars`` (:func:`template_vars`); any
other name between double braces is an error.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ValidationError

from gradlab.contracts.base import NestedValidationError
from gradlab.contracts.yamlfile import KeyPath, YamlDocument, load_yaml
from gradlab.errors import ConfigError, ConfigProblem

_TEMPLATE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_SECRET_KEY = re.compile(r"(secret|password|passwd|token|api[_-]?key|access[_-]?key|credential)", re.I)


@dataclass
class Composition:
    """The merged document of one file and the layers it was merged from (in merge order)."""

    data: dict[str, Any]
    layers: list[YamlDocument] = field(default_factory=list)

    def blame(self, path: KeyPath) -> tuple[str, int | None, int | None]:
        """The file (and line, column) that last wrote the longest prefix of ``path``."""
        best: tuple[int, YamlDocument] | None = None
        for layer in self.layers:
            n = layer.has_prefix(path)
            if n and (best is None or n >= best[0]):
                best = (n, layer)
        if best is None:
            return (self.layers[-1].file if self.layers else "", None, None)
        pos = best[1].position(path)
        return (best[1].file, pos[0] if pos else None, pos[1] if pos else None)

    def problem(self, path: KeyPath, message: str) -> ConfigProblem:
        file, line, col = self.blame(path)
        return ConfigProblem(file=file, key_path=".".join(path), message=message, line=line, column=col)


def compose_file(path: Path, *, presets_dir: Path, display_root: Path, _stack: tuple[Path, ...] = ()) -> Composition:
    """Compose ``path`` with everything its ``defaults:`` list names.

    Raises:
        ConfigError: a missing or invalid file, a bad ``defaults`` entry, a cycle, or a merge error.
    """
    path = path.resolve()
    display = _display(path, display_root)
    if path in _stack:
        chain = " -> ".join(_display(p, display_root) for p in (*_stack, path))
        raise ConfigError([ConfigProblem(file=display, key_path="defaults", message=f"cycle in defaults: {chain}")])
    doc = load_yaml(path, display)
    defaults = doc.data.pop("defaults", None)
    if defaults is None:
        defaults = ["_self_"]
    if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
        line = doc.positions.get(("defaults",), (None, None))
        raise ConfigError(
            [ConfigProblem(file=display, key_path="defaults", message="expected a list of file names and '_self_'",
                           line=line[0], column=line[1])]
        )
    if "_self_" not in defaults:
        defaults = [*defaults, "_self_"]
    layers: list[YamlDocument] = []
    for i, entry in enumerate(defaults):
        if entry == "_self_":
            layers.append(doc)
            continue
        target = (path.parent / entry) if entry.endswith((".yaml", ".yml")) else presets_dir / f"{entry}.yaml"
        if not target.is_file():
            pos = doc.positions.get(("defaults", str(i)), (None, None))
            raise ConfigError(
                [ConfigProblem(file=display, key_path=f"defaults.{i}",
                               message=f"expected an existing file, found no {_display(target.resolve(), display_root)}",
                               line=pos[0], column=pos[1])]
            )
        sub = compose_file(target, presets_dir=presets_dir, display_root=display_root, _stack=(*_stack, path))
        layers.extend(sub.layers)
    return Composition(data=merge([layer.data for layer in layers], display), layers=layers)


def merge(documents: list[dict[str, Any]], file: str) -> dict[str, Any]:
    """Deep-merge mappings in order with OmegaConf (lists replace) and resolve interpolations.

    Raises:
        ConfigError: OmegaConf refused a value or an interpolation.
    """
    documents = _drop_replaced_containers(documents)
    try:
        merged = OmegaConf.merge(*[OmegaConf.create(d) for d in documents]) if documents else OmegaConf.create({})
        return OmegaConf.to_container(merged, resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or ""
        raise ConfigError([ConfigProblem(file=file, key_path=str(key), message=f"cannot merge: {e.msg if hasattr(e, 'msg') else e}")]) from None


def _drop_replaced_containers(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The documents, where a later one gives a key a mapping in place of a list (or a list in place
    of a mapping: ``--set 'train.policy_model.net_arch={pi: [32], vf: [64]}'`` over ``[64, 64]``),
    without the earlier value: OmegaConf cannot merge the two kinds and raised a bare TypeError;
    the later value replaces it, as a list replaces a list. Inputs are not changed."""
    import copy

    def drop(earlier: dict[str, Any], later: dict[str, Any]) -> None:
        for k, v in later.items():
            old = earlier.get(k)
            if isinstance(old, dict) and isinstance(v, dict):
                drop(old, v)
            elif isinstance(old, (dict, list)) and isinstance(v, (dict, list)) and type(old) is not type(v):
                del earlier[k]

    docs = copy.deepcopy(documents)
    for i in range(1, len(docs)):
        for j in range(i):
            drop(docs[j], docs[i])
    return docs


def render_templates(data: Any, context: dict[str, str], comp: Composition, path: KeyPath = ()) -> tuple[Any, list[ConfigProblem]]:
    """Substitute ``{{ name }}`` in every string; unknown names become problems."""
    problems: list[ConfigProblem] = []
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            out[k], p = render_templates(v, context, comp, (*path, str(k)))
            problems += p
        return out, problems
    if isinstance(data, list):
        out_list = []
        for i, v in enumerate(data):
            r, p = render_templates(v, context, comp, (*path, str(i)))
            out_list.append(r)
            problems += p
        return out_list, problems
    if isinstance(data, str) and "{{" in data:
        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in context:
                problems.append(comp.problem(path, f"undefined template name '{name}' (expected one of {sorted(context)})"))
                return m.group(0)
            return context[name]
        return _TEMPLATE.sub(sub, data), problems
    return data, problems


#: Template names gradlab sets itself; a family's ``template_vars`` cannot redefine them.
BUILTIN_TEMPLATE_NAMES = ("goal_id", "recipe_id", "env_id")


def template_vars(value: Any, comp: Composition) -> tuple[dict[str, str], list[ConfigProblem]]:
    """A family's ``template_vars``: a mapping of identifier names to scalars (rendered as text).

    Returns:
        (name -> text, problems): a name that is not an identifier or is built in, or a value that
        is not a string, number or boolean, is a problem at ``template_vars.<name>``.
    """
    if value is None:
        return {}, []
    if not isinstance(value, dict):
        return {}, [comp.problem(("template_vars",), f"expected a mapping of names to scalars; found {type(value).__name__}")]
    out: dict[str, str] = {}
    problems: list[ConfigProblem] = []
    for name, v in value.items():
        where = ("template_vars", str(name))
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            problems.append(comp.problem(where, f"expected an identifier name; found {name!r}"))
        elif name in BUILTIN_TEMPLATE_NAMES:
            problems.append(comp.problem(where, f"'{name}' is set by gradlab and cannot be redefined"))
        elif isinstance(v, bool) or not isinstance(v, (str, int, float)):
            problems.append(comp.problem(where, f"expected a string or a number; found {v!r}"))
        else:
            out[name] = str(v)
    return out, problems


def secret_problems(data: Any, comp: Composition, path: KeyPath = ()) -> list[ConfigProblem]:
    """Keys that look like secrets: secrets come from the environment, never from contracts."""
    problems = []
    if isinstance(data, dict):
        for k, v in data.items():
            if _SECRET_KEY.search(str(k)):
                problems.append(comp.problem((*path, str(k)), "secret-like key refused: secrets come from the environment or the OS keyring, never from goals or recipes"))
            problems += secret_problems(v, comp, (*path, str(k)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            problems += secret_problems(v, comp, (*path, str(i)))
    return problems


def parse_override(text: str) -> tuple[KeyPath, Any]:
    """Parse one ``dotted.key=value`` override; the value is a YAML scalar (or flow collection).

    Raises:
        ConfigError: no ``=``, an empty key, or a value that is not valid YAML.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError([ConfigProblem(file="--set", key_path=key, message=f"expected KEY=VALUE with a dotted key, found {text!r}")])
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError([ConfigProblem(file="--set", key_path=key, message=f"value {raw!r} is not a YAML scalar: {getattr(e, 'problem', e)}")]) from None
    return tuple(key.split(".")), value


def set_path(data: dict[str, Any], path: KeyPath, value: Any) -> None:
    """Set ``data[path[0]]...[path[-1]] = value``, creating mappings on the way."""
    node = data
    for part in path[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[path[-1]] = value


def validation_problems(error: ValidationError, model: type[BaseModel], comp: Composition, prefix: KeyPath = ()) -> list[ConfigProblem]:
    """Turn a pydantic error into problems naming file, key path, expected and found."""
    problems = []
    for err in error.errors(include_url=False):
        nested = (err.get("ctx") or {}).get("error")
        loc = tuple(str(p) for p in err["loc"])
        if isinstance(nested, NestedValidationError):
            for inner in nested.errors:
                inner_loc = (*loc, *nested.prefix, *(str(p) for p in inner["loc"]))
                problems.append(_one_problem(inner, inner_loc, nested.model, tuple(str(p) for p in inner["loc"]), comp, prefix))
            continue
        problems.append(_one_problem(err, loc, model, loc, comp, prefix))
    return problems


def _one_problem(err: dict, loc: KeyPath, model: type[BaseModel], model_loc: KeyPath, comp: Composition, prefix: KeyPath) -> ConfigProblem:
    full = (*prefix, *loc)
    kind = err["type"]
    found = err.get("input")
    if kind == "extra_forbidden":
        parent = _model_at(model, model_loc[:-1])
        reason = getattr(parent, "refused_keys", {}).get(model_loc[-1]) if parent else None
        if reason:
            return comp.problem(full, f"a stable-baselines3 argument gradlab does not take here: {reason}")
        valid = sorted(parent.model_fields) if parent else []
        hint = difflib.get_close_matches(model_loc[-1], valid, n=1)
        msg = "unknown key"
        msg += f" (did you mean {hint[0]}?)" if hint else (f" (expected one of: {', '.join(valid)})" if valid else "")
        return comp.problem(full, msg)
    if kind == "missing":
        return comp.problem(full, "missing required key")
    msg = err["msg"]
    for lead in ("Value error, ", "Input should be "):
        if msg.startswith(lead):
            msg = msg[len(lead):]
    return comp.problem(full, f"expected {msg}; found {_short(found)}")


def _model_at(model: type[BaseModel] | None, loc: KeyPath) -> type[BaseModel] | None:
    """The pydantic model class that owns the mapping at ``loc`` (None if not a model)."""
    import typing

    current: Any = model
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        fld = current.model_fields.get(part)
        if fld is None:
            return None
        current = _unwrap(fld.annotation, typing)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any, typing: Any) -> Any:
    args = typing.get_args(annotation)
    if isinstance(annotation, type):
        return annotation
    for arg in args:
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return annotation


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _display(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
