"""Lane state as data: an in-process vector env's state saved as JSON + npz, restored by assignment.

Resume must never unpickle (docs/ARCHITECTURE.md section 6): a pickle from a store or a run
directory runs code. Instead the learner walks the vector env's object graph (gradlab's
``SB3VecEnv`` → ``VectorEnv`` → task runner and lane backend → gymnasium envs and wrappers) and
records every attribute that is plain data: ``None``/bool/int/float/str, numpy scalars and
arrays, numpy ``Generator``/``RandomState`` states, and lists, tuples and dicts of those.
Restoring walks a *freshly built* env of the same spec and assigns the saved values into the
objects that already exist there; it never creates an object of a class named by the file. A
saved path that does not exist in the fresh env, or holds another kind of value, refuses the
whole restore before anything is assigned.

Files (``resume/`` of a checkpoint):
    ``lanes.json``: ``{"format": "gradlab.lanes/2", "tree": <node>}`` (``/1``, without provider
        snapshots, is read too). A node is one of
        ``{"t": "obj", "attrs": {name: node}}``, ``{"t": "json", "v": value}``,
        ``{"t": "float", "v": "nan"|"inf"|"-inf"}``, ``{"t": "np", "dtype": str, "v": value}``,
        ``{"t": "array", "key": str}`` (an entry of ``lanes.npz``),
        ``{"t": "list"|"tuple", "items": [node]}``, ``{"t": "dict", "items": [[key node, node]]}``,
        ``{"t": "generator", "state": node}``, ``{"t": "randomstate", "state": node}``,
        ``{"t": "ref"}`` (an object already visited: aliasing is kept by the fresh env),
        ``{"t": "provider", "lanes": [key]}`` (a lane backend's provider snapshots, below).
    ``lanes.npz``: the arrays, read with ``allow_pickle=False``.

Only objects whose class lives in ``gradlab``, ``gymnasium`` or ``stable_baselines3`` are walked.
A lane backend that holds something else (an emulator handle, a subprocess pipe) is saved as its
lanes' *provider snapshots* instead, where its provider captures them (``LaneBackend.capture_state``:
ALE's ``cloneState`` with its sticky-action RNG and the frame stack, stable-retro's emulator
state, ...): ``{"t": "provider", "lanes": [key]}``, each key a uint8 array of ``lanes.npz``; a
restore resets those lanes and loads the snapshots, so the episodes go on where they were.
Anything else that is not plain data (a provider that cannot capture, as ale-py's native vector
env) makes the env *unsupported*: :func:`capture` returns None and a resumed run resets its lanes
(counters, schedules, optimizer and RNG streams still continue).
"""

from __future__ import annotations

import functools
import json
import math
import types
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.errors import ContractViolation

FORMAT = "gradlab.lanes/2"
_READABLE = ("gradlab.lanes/1", FORMAT)  # /1: no provider snapshots
JSON_FILE = "lanes.json"
ARRAYS_FILE = "lanes.npz"
_WALKED = ("gradlab.", "gymnasium.", "stable_baselines3.")
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
_MAX_DEPTH = 24


class Unsupported(Exception):
    """The env holds state that is not plain data (reset its lanes instead)."""


def _static(value: Any) -> bool:
    """Values rebuilt from the spec, never saved: code, classes, dtypes, contracts."""
    from pydantic import BaseModel

    return isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
                              types.ModuleType, np.dtype, BaseModel, property, staticmethod, classmethod,
                              functools.partial, slice))


class _Encoder:
    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self._seen: set[int] = set()

    def node(self, value: Any, path: str, depth: int) -> dict[str, Any] | None:
        """The node for ``value``, or None for a static value (skipped)."""
        if depth > _MAX_DEPTH:
            raise Unsupported(f"{path}: nested deeper than {_MAX_DEPTH}")
        if value is None or isinstance(value, (bool, int, str)):
            return {"t": "json", "v": value}
        if isinstance(value, float):
            return {"t": "json", "v": value} if math.isfinite(value) else {"t": "float", "v": repr(value)}
        if isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                raise Unsupported(f"{path}: an object array")
            key = f"a{len(self.arrays)}"
            self.arrays[key] = np.ascontiguousarray(value)
            return {"t": "array", "key": key}
        if isinstance(value, np.generic):
            if isinstance(value, np.object_):
                raise Unsupported(f"{path}: an object scalar")
            return {"t": "np", "dtype": value.dtype.str, "v": value.item() if value.dtype.kind != "f" or
                    math.isfinite(value.item()) else repr(value.item())}
        if isinstance(value, np.random.Generator):
            return {"t": "generator", "state": self.node(value.bit_generator.state, f"{path}.state", depth + 1)}
        if isinstance(value, np.random.RandomState):
            return {"t": "randomstate", "state": self.node(value.get_state(legacy=False), f"{path}.state", depth + 1)}
        if _static(value):
            return None
        if isinstance(value, (list, tuple)):
            items = [self.node(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
            if items and all(i is None for i in items):
                return None  # static throughout (the slices of lane groups): rebuilt from the spec
            if any(i is None for i in items):
                raise Unsupported(f"{path}: a sequence holding code or contracts")
            return {"t": "list" if isinstance(value, list) else "tuple", "items": items}
        if isinstance(value, dict):
            out = []
            for k, v in value.items():
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise Unsupported(f"{path}: a dict key of type {type(k).__name__}")
                n = self.node(v, f"{path}[{k!r}]", depth + 1)
                if n is None:
                    continue
                out.append([{"t": "json", "v": k}, n])
            return {"t": "dict", "items": out}
        module = type(value).__module__ or ""
        if hasattr(value, "__dict__") and module.startswith(_WALKED):
            if id(value) in self._seen:
                return {"t": "ref"}
            self._seen.add(id(value))
            try:
                attrs = {}
                for name, attr in vars(value).items():
                    n = self.node(attr, f"{path}.{name}", depth + 1)
                    if n is not None:
                        attrs[name] = n
            except Unsupported:
                if (provider := self._provider(value, path)) is None:
                    raise
                return provider
            return {"t": "obj", "attrs": attrs}
        raise Unsupported(f"{path}: {module}.{type(value).__qualname__} is not plain data")

    def _provider(self, backend: Any, path: str) -> dict[str, Any] | None:
        """A lane backend holding an emulator as its lanes' provider snapshots, or None when ``backend``
        is not a lane backend or its provider cannot capture (its ``state_problem``)."""
        from gradlab.envs.backend import LaneBackend
        from gradlab.envs.snapshot import StateUnsupported

        if not isinstance(backend, LaneBackend) or backend.state_problem() is not None:
            return None
        keys = []
        for lane in range(backend.num_envs):
            try:
                blob = backend.capture_state(lane)
            except StateUnsupported as e:
                raise Unsupported(f"{path}: lane {lane}: {e}") from None
            key = f"a{len(self.arrays)}"
            self.arrays[key] = np.frombuffer(blob, dtype=np.uint8).copy()
            keys.append(key)
        return {"t": "provider", "lanes": keys}


def capture(env: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The env's state as (``lanes.json`` body, ``lanes.npz`` arrays), or None when unsupported.

    Args:
        env: the vector env below SB3's wrappers (gradlab's ``SB3VecEnv``).
    """
    enc = _Encoder()
    try:
        tree = enc.node(env, "env", 0)
    except Unsupported:
        return None
    return {"format": FORMAT, "tree": tree}, enc.arrays


def save(folder: Path, env: Any) -> bool:
    """Write ``lanes.json`` and ``lanes.npz`` into ``folder``; False (nothing written) when unsupported."""
    got = capture(env)
    if got is None:
        return False
    body, arrays = got
    (Path(folder) / JSON_FILE).write_text(json.dumps(body, allow_nan=False))
    with open(Path(folder) / ARRAYS_FILE, "wb") as f:
        np.savez(f, **arrays)
    return True


def unsupported_reason(env: Any) -> str | None:
    """Why :func:`capture` gives None for this env (the first non-data attribute), or None."""
    try:
        _Encoder().node(env, "env", 0)
    except Unsupported as e:
        return str(e)
    return None


class _Decoder:
    def __init__(self, arrays: Any, where: str):
        self.arrays = arrays
        self.where = where
        self.assignments: list[Any] = []

    def fail(self, path: str, expected: str, found: str) -> None:
        raise ContractViolation(f"{self.where}: {path}: expected {expected}, found {found}")

    def value(self, node: Any, path: str) -> Any:
        """A plain value from a data node (no objects are created but numpy generators)."""
        if not isinstance(node, dict) or "t" not in node:
            self.fail(path, "a node object", type(node).__name__)
        t = node["t"]
        if t == "json":
            v = node.get("v")
            if v is not None and not isinstance(v, (bool, int, float, str)):
                self.fail(path, "a JSON scalar", type(v).__name__)
            return v
        if t == "float":
            if node.get("v") not in ("nan", "inf", "-inf"):
                self.fail(path, "nan, inf or -inf", repr(node.get("v")))
            return float(node["v"])
        if t == "np":
            try:
                dtype = np.dtype(str(node["dtype"]))
            except TypeError:
                self.fail(path, "a numpy dtype", repr(node.get("dtype")))
            if dtype.hasobject:
                self.fail(path, "a numeric dtype", str(dtype))
            return dtype.type(float(node["v"]) if isinstance(node["v"], str) else node["v"])
        if t == "array":
            key = node.get("key")
            if key not in self.arrays:
                self.fail(path, f"an array of {ARRAYS_FILE}", repr(key))
            return np.array(self.arrays[key])
        if t in ("list", "tuple"):
            items = [self.value(n, f"{path}[{i}]") for i, n in enumerate(node.get("items", []))]
            return items if t == "list" else tuple(items)
        if t == "dict":
            return {self.value(k, f"{path}.key"): self.value(v, f"{path}[{i}]")
                    for i, (k, v) in enumerate(node.get("items", []))}
        if t == "generator":
            state = self.value(node["state"], f"{path}.state")
            name = state.get("bit_generator") if isinstance(state, dict) else None
            if name not in _BIT_GENERATORS:
                self.fail(path, f"a bit generator of {', '.join(_BIT_GENERATORS)}", repr(name))
            gen = np.random.Generator(getattr(np.random, name)())
            gen.bit_generator.state = state
            return gen
        if t == "randomstate":
            rs = np.random.RandomState()
            rs.set_state(self.value(node["state"], f"{path}.state"))
            return rs
        self.fail(path, "a data node", repr(t))

    def into(self, target: Any, node: dict[str, Any], path: str) -> None:
        """Plan assigning ``node``'s saved attributes into the existing object ``target``."""
        if node.get("t") != "obj":
            self.fail(path, "an object node", repr(node.get("t")))
        if not hasattr(target, "__dict__") or not (type(target).__module__ or "").startswith(_WALKED):
            self.fail(path, "an object of gradlab, gymnasium or SB3", type(target).__name__)
        current = vars(target)
        for name, child in node.get("attrs", {}).items():
            where = f"{path}.{name}"
            if name not in current:
                # Set lazily (a seeded RNG after the first reset): data may be added, objects not.
                if child.get("t") in ("obj", "ref"):
                    self.fail(where, "an attribute of the freshly built env", "none")
                self.assignments.append((target, name, None, self.value(child, where)))
                continue
            self.attr(target, name, current[name], child, where)

    def attr(self, owner: Any, name: Any, existing: Any, node: dict[str, Any], path: str) -> None:
        t = node.get("t")
        if t == "ref":
            return
        if t == "obj":
            self.into(existing, node, path)
            return
        if t == "provider":
            self.provider(existing, node, path)
            return
        if isinstance(existing, (list, tuple)) and t in ("list", "tuple") and any(
                n.get("t") == "obj" for n in node.get("items", [])):
            if len(existing) != len(node["items"]):
                self.fail(path, f"{len(node['items'])} items", str(len(existing)))
            for i, (item, child) in enumerate(zip(existing, node["items"], strict=True)):
                if child.get("t") == "obj":
                    self.into(item, child, f"{path}[{i}]")
                elif isinstance(existing, list):
                    self.attr(existing, i, item, child, f"{path}[{i}]")
            return
        if isinstance(existing, dict) and t == "dict" and any(v.get("t") == "obj" for _, v in node.get("items", [])):
            for k, child in node["items"]:
                key = self.value(k, f"{path}.key")
                if key not in existing:
                    self.fail(f"{path}[{key!r}]", "an entry of the freshly built env", "none")
                self.attr(existing, key, existing[key], child, f"{path}[{key!r}]")
            return
        value = self.value(node, path)
        self._check_kind(existing, value, path)
        self.assignments.append((owner, name, existing, value))

    def provider(self, backend: Any, node: dict[str, Any], path: str) -> None:
        """Plan restoring a lane backend's lanes from their provider snapshots (after resetting them,
        as a restore expects; the snapshot then replaces every lane's state)."""
        from gradlab.envs.backend import LaneBackend

        if not isinstance(backend, LaneBackend):
            self.fail(path, "a lane backend", type(backend).__name__)
        keys = node.get("lanes")
        if not isinstance(keys, list) or len(keys) != backend.num_envs:
            self.fail(path, f"{backend.num_envs} lane snapshots", str(len(keys) if isinstance(keys, list) else keys))
        blobs = []
        for i, key in enumerate(keys):
            if key not in self.arrays or self.arrays[key].dtype != np.uint8 or self.arrays[key].ndim != 1:
                self.fail(f"{path}[{i}]", f"a uint8 array of {ARRAYS_FILE}", repr(key))
            blobs.append(self.arrays[key].tobytes())
        self.assignments.append((_Restore(backend, blobs, path), None, None, None))

    def _check_kind(self, existing: Any, value: Any, path: str) -> None:
        if existing is None or value is None:
            return
        if isinstance(existing, np.ndarray) != isinstance(value, np.ndarray):
            self.fail(path, type(existing).__name__, type(value).__name__)
        if isinstance(existing, np.random.Generator) != isinstance(value, np.random.Generator):
            self.fail(path, type(existing).__name__, type(value).__name__)

    def apply(self) -> None:
        for owner, name, existing, value in self.assignments:
            if isinstance(owner, _Restore):
                owner.apply(self.where)
            elif isinstance(existing, np.ndarray) and isinstance(value, np.ndarray) and \
                    existing.shape == value.shape and existing.dtype == value.dtype and existing.flags.writeable:
                existing[...] = value  # in place: keeps views other objects hold
            elif isinstance(existing, np.random.Generator) and isinstance(value, np.random.Generator):
                existing.bit_generator.state = value.bit_generator.state
            elif isinstance(owner, (dict, list)):
                owner[name] = value
            else:
                vars(owner)[name] = value


class _Restore:
    """Lanes of one backend put back from their provider snapshots (planned, applied last-but-in-order)."""

    def __init__(self, backend: Any, blobs: list[bytes], path: str):
        self.backend, self.blobs, self.path = backend, blobs, path

    def apply(self, where: str) -> None:
        from gradlab.errors import IntegrityError

        lanes = list(range(self.backend.num_envs))
        self.backend.reset_lanes(lanes, [None] * len(lanes))
        for lane, blob in zip(lanes, self.blobs, strict=True):
            try:
                self.backend.restore_state(lane, blob)
            except IntegrityError as e:
                raise ContractViolation(f"{where}: {self.path}[{lane}]: not a snapshot of this lane: {e}") from None


def restore(folder: Path, env: Any) -> None:
    """Assign the state saved in ``folder`` into a freshly built ``env`` of the same spec.

    Nothing is assigned unless every saved path fits the fresh env; a provider snapshot's contents
    are checked by its provider as it is loaded (one of another game fails there, naming the lane,
    and leaves the fresh env, built for this restore only, partly restored).

    Raises:
        ContractViolation: a file is malformed, of another format, or does not fit the env
            (naming the file and the attribute path, what was expected and what was found).
    """
    folder = Path(folder)
    where = folder / JSON_FILE
    try:
        body = json.loads(where.read_text())
    except (OSError, ValueError) as e:
        raise ContractViolation(f"{where}: not readable lane state: {e}") from None
    if not isinstance(body, dict) or body.get("format") not in _READABLE:
        found = body.get("format") if isinstance(body, dict) else type(body).__name__
        raise ContractViolation(f"{where}: format expected {FORMAT}, found {found!r}")
    try:
        arrays = dict(np.load(folder / ARRAYS_FILE, allow_pickle=False))
    except (OSError, ValueError) as e:
        raise ContractViolation(f"{folder / ARRAYS_FILE}: not readable lane arrays: {e}") from None
    dec = _Decoder(arrays, str(where))
    try:
        dec.into(env, body.get("tree") or {}, "env")
    except (KeyError, TypeError, AttributeError) as e:
        raise ContractViolation(f"{where}: malformed lane state ({type(e).__name__}: {e})") from None
    dec.apply()
