"""Provider state snapshots as portable bytes: the format every ``capture_state`` writes.

A snapshot is one lane's complete environment state (emulator memory, the lane's RNG, the
preprocessing's frame stack, step counters), so that restoring it in any process of the same
environment spec and stepping the same actions gives the same observations and rewards
(docs/ARCHITECTURE.md section 12a). No pickle anywhere: a snapshot is

    b"GLSTATE1" | header length (8 bytes, little-endian) | header (JSON, UTF-8) | payload

where the header is ``{"kind": str, "meta": {...}, "arrays": [{"name", "dtype", "shape",
"offset", "nbytes"}], "blobs": [{"name", "offset", "nbytes"}]}`` and the payload the arrays'
C-order bytes and the raw byte blobs (an emulator's own serialised state) back to back. The
encoding is canonical (sorted JSON keys, arrays in name order), so equal states give equal bytes
and the same sha256 (content addressing, :mod:`gradlab.explore.blobs`).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradlab.errors import ConfigError, IntegrityError

MAGIC = b"GLSTATE1"


class StateUnsupported(ConfigError):
    """The environment cannot capture or restore its state (the provider's API does not allow it)."""


@dataclass
class Snapshot:
    """A decoded snapshot: ``kind`` names who wrote it (``gradlab:KeyDoor-v0``, ``ale``...).

    Attributes:
        kind: the writer's name; a restorer refuses another kind.
        meta: JSON-able values (counters, RNG states as dicts).
        arrays: name -> numpy array (plain dtypes only).
        blobs: name -> bytes (an emulator's own serialised state).
    """

    kind: str
    meta: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)


def pack(snap: Snapshot) -> bytes:
    """The canonical bytes of ``snap`` (see the module docstring)."""
    parts: list[bytes] = []
    offset = 0
    arrays = []
    for name in sorted(snap.arrays):
        arr = np.ascontiguousarray(snap.arrays[name])
        if arr.dtype.hasobject:
            raise StateUnsupported(f"snapshot {snap.kind}: array {name!r} holds Python objects")
        data = arr.tobytes()
        arrays.append({"name": name, "dtype": arr.dtype.str, "shape": list(arr.shape), "offset": offset,
                       "nbytes": len(data)})
        parts.append(data)
        offset += len(data)
    blobs = []
    for name in sorted(snap.blobs):
        data = bytes(snap.blobs[name])
        blobs.append({"name": name, "offset": offset, "nbytes": len(data)})
        parts.append(data)
        offset += len(data)
    header = json.dumps({"kind": snap.kind, "meta": snap.meta, "arrays": arrays, "blobs": blobs},
                        sort_keys=True, separators=(",", ":")).encode()
    return MAGIC + struct.pack("<Q", len(header)) + header + b"".join(parts)


def unpack(data: bytes, *, kind: str | None = None) -> Snapshot:
    """Decode bytes written by :func:`pack`.

    Args:
        data: the snapshot bytes.
        kind: when given, the kind the caller can restore.

    Raises:
        IntegrityError: not a snapshot, truncated, or of another kind than ``kind``.
    """
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 8:
        raise IntegrityError("provider state: expected a gradlab state snapshot (magic GLSTATE1), found other bytes")
    (hlen,) = struct.unpack("<Q", data[len(MAGIC):len(MAGIC) + 8])
    start = len(MAGIC) + 8
    try:
        header = json.loads(data[start:start + hlen])
    except (ValueError, UnicodeDecodeError):
        raise IntegrityError("provider state: the snapshot header is not JSON") from None
    if kind is not None and header.get("kind") != kind:
        raise IntegrityError(f"provider state: expected a snapshot of {kind}, found one of {header.get('kind')!r}")
    body = memoryview(data)[start + hlen:]
    snap = Snapshot(kind=header["kind"], meta=header["meta"])
    for a in header["arrays"]:
        end = a["offset"] + a["nbytes"]
        if end > len(body):
            raise IntegrityError(f"provider state: array {a['name']!r} runs past the end of the snapshot")
        snap.arrays[a["name"]] = np.frombuffer(body[a["offset"]:end], dtype=np.dtype(a["dtype"])).reshape(
            a["shape"]).copy()
    for b in header["blobs"]:
        end = b["offset"] + b["nbytes"]
        if end > len(body):
            raise IntegrityError(f"provider state: blob {b['name']!r} runs past the end of the snapshot")
        snap.blobs[b["name"]] = bytes(body[b["offset"]:end])
    return snap


def generator_state(rng: np.random.Generator) -> dict[str, Any]:
    """A numpy Generator's bit-generator state as JSON-able data."""
    return _jsonable(rng.bit_generator.state)


def set_generator_state(rng: np.random.Generator, state: dict[str, Any]) -> None:
    """Assign a state from :func:`generator_state` into ``rng`` (same bit generator)."""
    rng.bit_generator.state = state


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
