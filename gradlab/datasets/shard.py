"""Step shards: one ``.npz`` per chunk holding every episode of the chunk, written deterministically.

A shard (``episodes/chunk-<chunk:05d>.npz``, docs/ARCHITECTURE.md section 12) holds the arrays of
:mod:`gradlab.contracts.dataset` for all of its episodes, one after another in the order they ended;
the manifest's ``step_offset`` / ``observation_offset`` of an episode say where its ``length`` steps
and ``length + 1`` observations start. The bytes are a function of the arrays alone: every zip member
is dated 1980-01-01; integer and boolean members (images, actions, flags: redundant, so cheap to
deflate) are compressed with zlib at :data:`COMPRESS_LEVEL`, float members (which deflate
poorly and slowly: half the recording's time went there) are stored, so the same episodes give the
same shard sha256 on every run (with the same zlib).

:class:`StepBuffer` is the recorder's memory: whole-batch step arrays (one copy per field per vector
step, no per-lane Python work), gathered into episodes with one fancy index per field, in memory up
to :data:`SPILL_BYTES` and spilled to temporary files beyond it.
"""

from __future__ import annotations

import io
import shutil
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.errors import ContractViolation

#: zlib level of the integer and boolean members: 1 (fastest).
COMPRESS_LEVEL = 1
#: dtype kinds that are deflated (bool, signed and unsigned integers); the others are stored.
DEFLATED_KINDS = "biu"
#: Buffered step bytes (all lanes) past which finished episodes are gathered out of the step buffer.
GATHER_BYTES = 32 * 2**20
#: Gathered bytes per field kept in memory before they go to a temporary file.
SPILL_BYTES = 32 * 2**20
#: Fields with one row per step, then the one with one row per step plus one per episode.
STEP_FIELDS = ("actions", "rewards", "raw_rewards", "terminated", "truncated", "events")
FIELDS = (*STEP_FIELDS, "observations")
#: A step field kept only when the environment has an action profile: the provider-native action
#: each profile action became (``actions`` then holds the profile's indices).
NATIVE_FIELD = "native_actions"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def _member(name: str, dtype: np.dtype) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED if dtype.kind in DEFLATED_KINDS else zipfile.ZIP_STORED
    for attr in ("compress_level", "_compresslevel"):  # what ZipFile.open(info, "w") reads (3.13 / 3.11)
        if attr in zipfile.ZipInfo.__slots__:
            setattr(info, attr, COMPRESS_LEVEL)
    info.external_attr = 0o600 << 16
    info.create_system = 3
    return info


def _header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_2_0(buf, {"descr": np.lib.format.dtype_to_descr(dtype),
                                               "fortran_order": False, "shape": shape})
    return buf.getvalue()


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> tuple[str, int]:
    """A deterministic ``.npz`` of whole arrays (no pickled objects; see the module docstring);
    returns its (sha256, size in bytes)."""
    return write_members(path, {k: (np.asarray(a).dtype, np.asarray(a).shape, [np.ascontiguousarray(a)])
                                for k, a in arrays.items()})


def write_members(path: Path, members: dict[str, tuple[np.dtype, tuple[int, ...], Iterable[Any]]]) -> tuple[str, int]:
    """Write ``name -> (dtype, shape, pieces)`` as an ``.npz``; pieces are C-ordered arrays or binary files
    (read from the start) whose bytes, concatenated, are the array's data. Built in memory up to
    :data:`SPILL_BYTES` (else in ``path.part``), then renamed to ``path``.

    Returns:
        (sha256 hex, size in bytes) of the file's bytes as written.

    Raises:
        ContractViolation: an object dtype (it would need pickling).
    """
    import hashlib

    for name, (dtype, _, _) in members.items():
        if np.dtype(dtype).hasobject:
            raise ContractViolation(f"{path}: {name}: object arrays are not stored (they need pickling)")
    in_memory = all(isinstance(p, np.ndarray) for _, _, pieces in members.values() for p in pieces) and \
        sum(p.nbytes for _, _, pieces in members.values() for p in pieces) <= SPILL_BYTES
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".part")
    target: Any = io.BytesIO() if in_memory else tmp
    with zipfile.ZipFile(target, "w") as zf:
        for name in sorted(members):
            dtype, shape, pieces = members[name]
            with zf.open(_member(name, np.dtype(dtype)), "w", force_zip64=True) as out:
                out.write(_header(np.dtype(dtype), tuple(int(n) for n in shape)))
                for piece in pieces:
                    if isinstance(piece, np.ndarray):
                        out.write(piece.data if piece.flags.c_contiguous else piece.tobytes())
                    else:
                        piece.seek(0)
                        shutil.copyfileobj(piece, out, 1 << 20)
    if in_memory:
        data = target.getvalue()
        tmp.write_bytes(data)
        digest, size = hashlib.sha256(data).hexdigest(), len(data)
    else:
        from gradlab.checkpoints.bundle import file_sha256

        digest, size = file_sha256(tmp), tmp.stat().st_size
    tmp.replace(path)
    return digest, size


class _Column:
    """One field's gathered rows: arrays in memory, moved to a temporary file past :data:`SPILL_BYTES`."""

    def __init__(self, name: str):
        self.name = name
        self.dtype: np.dtype | None = None
        self.row_shape: tuple[int, ...] | None = None
        self.rows = 0
        self.pieces: list[np.ndarray] = []
        self.held = 0
        self.spool: Any = None

    def add(self, rows: np.ndarray) -> None:
        if self.dtype is None:
            self.dtype, self.row_shape = rows.dtype, rows.shape[1:]
        elif rows.dtype != self.dtype or rows.shape[1:] != self.row_shape:
            raise ContractViolation(f"dataset steps: {self.name}: rows of {rows.dtype}{list(rows.shape[1:])} after "
                                    f"rows of {self.dtype}{list(self.row_shape or ())} (one dtype and shape per field)")
        rows = np.ascontiguousarray(rows)
        self.pieces.append(rows)
        self.rows += len(rows)
        self.held += rows.nbytes
        if self.held > SPILL_BYTES:
            if self.spool is None:
                self.spool = tempfile.TemporaryFile(prefix="gradlab-shard-")
            for piece in self.pieces:
                self.spool.write(piece.data)
            self.pieces, self.held = [], 0

    def member(self) -> tuple[np.dtype, tuple[int, ...], list[Any]]:
        return (self.dtype, (self.rows, *(self.row_shape or ())),
                ([self.spool] if self.spool is not None else []) + self.pieces)

    def close(self) -> None:
        if self.spool is not None:
            self.spool.close()


class StepBuffer:
    """Whole-batch step arrays of a vector env, gathered into episodes (see the module docstring).

    Each field is one preallocated ``(capacity, N, ...)`` array (doubled when full), so a step is one
    assignment per field.

    Args:
        n_lanes: N. event_names: the task program's events, sorted (the ``events`` columns).
        native: with an action profile, maps (N,) profile actions to (N, *native_shape) provider-native
            ones (:meth:`gradlab.envs.action_profile.ProfiledBackend.native`), kept as :data:`NATIVE_FIELD`.
    """

    def __init__(self, n_lanes: int, event_names: list[str], native: Any = None):
        self.n = n_lanes
        self.event_names = list(event_names)
        self.native = native
        self.step_fields = (*STEP_FIELDS, NATIVE_FIELD) if native is not None else STEP_FIELDS
        self.base = 0  # absolute step index of row 0 of the arrays
        self.used = 0  # rows in use
        self.arrays: dict[str, np.ndarray] = {}
        self.start = [0] * n_lanes  # absolute step of each lane's episode start
        self.finished: list[tuple[int, int, int, np.ndarray]] = []  # (lane, start, end, final obs) not yet gathered
        self.columns = {k: _Column(k) for k in (*self.step_fields, "observations")}
        self.offsets: list[tuple[int, int, int]] = []  # per gathered episode: (step offset, observation offset, length)
        self.finals: dict[int, np.ndarray] = {}
        self.row_bytes = 0  # bytes of one buffered step, all lanes and fields

    @property
    def now(self) -> int:
        return self.base + self.used

    def _allocate(self, obs: np.ndarray, actions: np.ndarray, rows: int) -> None:
        n = self.n
        self.arrays = {
            "observations": np.empty((rows, *obs.shape), dtype=obs.dtype),
            "actions": np.empty((rows, *actions.shape), dtype=actions.dtype),
            "rewards": np.empty((rows, n), dtype=np.float32), "raw_rewards": np.empty((rows, n), dtype=np.float32),
            "terminated": np.empty((rows, n), dtype=bool), "truncated": np.empty((rows, n), dtype=bool),
            "events": np.zeros((rows, n, len(self.event_names)), dtype=bool),
        }
        if self.native is not None:
            native = np.asarray(self.native(actions))
            self.arrays[NATIVE_FIELD] = np.empty((rows, *native.shape), dtype=native.dtype)
        self.row_bytes = sum(a[0].nbytes for a in self.arrays.values())

    def _grow(self) -> None:
        for name, a in self.arrays.items():
            bigger = np.zeros((2 * len(a), *a.shape[1:]), dtype=a.dtype)
            bigger[:self.used] = a[:self.used]
            self.arrays[name] = bigger

    def step(self, obs: np.ndarray, actions: np.ndarray, result: Any) -> None:
        """Keep one vector step: ``obs`` (N, *obs_shape) the actions were chosen on, ``actions`` (N, ...)."""
        if not self.arrays:
            self._allocate(np.asarray(obs), np.asarray(actions), 64)
        elif self.used == len(self.arrays["actions"]):
            self._grow()
        t, a = self.used, self.arrays
        a["observations"][t] = obs
        a["actions"][t] = actions
        if self.native is not None:
            a[NATIVE_FIELD][t] = self.native(actions)
        a["rewards"][t] = result.reward
        a["raw_rewards"][t] = result.raw_reward
        a["terminated"][t] = result.terminated
        a["truncated"][t] = result.truncated
        if self.event_names and result.events:
            ev = a["events"][t]
            for j, name in enumerate(self.event_names):
                if name in result.events:
                    ev[:, j] = result.events[name]
        self.used = t + 1
        self.finals = result.final_obs

    def ended(self, lane: int, keep: bool) -> int | None:
        """The lane's episode ended at the last step; kept (``keep``) or discarded. Returns its position
        among the kept episodes (the order of :attr:`offsets`), or None when discarded."""
        start, end = self.start[lane], self.now
        self.start[lane] = end
        if not keep:
            return None
        final = self.finals[lane] if lane in self.finals else self.arrays["observations"][self.used - 1, lane]
        self.finished.append((lane, start, end, np.array(final)))
        if self.used * self.row_bytes > GATHER_BYTES:
            self.gather()
            return len(self.offsets) - 1
        return len(self.offsets) + len(self.finished) - 1

    def gather(self) -> None:
        """Move the finished episodes' rows into the columns; drop the steps no live episode needs."""
        if self.finished:
            base, a = self.base, self.arrays
            lanes = np.asarray([f[0] for f in self.finished], dtype=np.int64)
            starts = np.asarray([f[1] for f in self.finished], dtype=np.int64) - base
            lengths = np.asarray([f[2] - f[1] for f in self.finished], dtype=np.int64)
            total = int(lengths.sum())
            first = np.cumsum(lengths) - lengths
            j = np.arange(total) - np.repeat(first, lengths)
            t_rows, l_rows = np.repeat(starts, lengths) + j, np.repeat(lanes, lengths)
            for name in self.step_fields:
                self.columns[name].add(a[name][t_rows, l_rows])
            # Observations: each episode's ``length`` rows, then its final observation.
            k = len(self.finished)
            o_lengths = lengths + 1
            o_first = np.cumsum(o_lengths) - o_lengths
            oj = np.arange(total + k) - np.repeat(o_first, o_lengths)
            inside = oj < np.repeat(lengths, o_lengths)
            obs = a["observations"][np.where(inside, np.repeat(starts, o_lengths) + oj, 0), np.repeat(lanes, o_lengths)]
            obs[~inside] = np.stack([f[3] for f in self.finished])
            self.columns["observations"].add(obs)
            step0 = self.columns["actions"].rows - total
            obs0 = self.columns["observations"].rows - total - k
            self.offsets.extend(zip((first + step0).tolist(), (o_first + obs0).tolist(), lengths.tolist(), strict=True))
            self.finished = []
        keep_from = min(self.start) - self.base
        if keep_from > 0 and self.arrays:
            live = self.used - keep_from
            for arr in self.arrays.values():
                arr[:live] = arr[keep_from:self.used]
            self.base += keep_from
            self.used = live

    def write(self, path: Path) -> tuple[list[tuple[int, int, int]], str, int]:
        """Write the shard of every kept episode; returns their (step offset, observation offset, length)
        in the order they ended, and the shard's sha256 and size in bytes.

        Raises:
            ContractViolation: no episode was kept, or a field changed dtype or shape between steps.
        """
        self.gather()
        if not self.offsets:
            raise ContractViolation(f"{path}: no episode to write")
        members = {name: col.member() for name, col in self.columns.items()}
        names = np.asarray(self.event_names, dtype=str)
        members["event_names"] = (names.dtype, names.shape, [names])
        digest, size = write_members(path, members)
        return list(self.offsets), digest, size

    def close(self) -> None:
        for col in self.columns.values():
            col.close()


class ShardCache:
    """The arrays of the last shard read, keyed by its path and stat (size, mtime, inode), so reading every
    episode of a chunk in turn decompresses its shard once. The arrays are read-only. Never unpickles."""

    def __init__(self) -> None:
        self.entry: tuple[tuple[Any, ...], dict[str, np.ndarray]] | None = None

    def get(self, path: Path) -> dict[str, np.ndarray]:
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
        entry = self.entry  # one read: another thread may replace it
        if entry is None or entry[0] != key:
            with np.load(path, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
            for a in arrays.values():
                a.setflags(write=False)
            entry = self.entry = (key, arrays)
        return entry[1]
