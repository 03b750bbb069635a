"""A search run's archive as the player shows it: cells, counts, the best lineage, a cell's program.

A ``gradlab.go_explore`` checkpoint keeps its archive in ``resume/archive.json``
(:mod:`gradlab.explore.archive`, docs/ARCHITECTURE.md section 12a). The player reads it from a
resolved checkpoint folder, its bytes checked against the sha256 the manifest lists for it first
(JSON only; nothing is unpickled), and serves

* :func:`archive_page`: every cell with its coordinates (signal cells: the binned value of each
  signal the recipe's ``cell.signals`` names) or its thumbnail (frame cells: the downscaled frame
  whose hash is its key, checked to be so), return, length, progress, visit and selection counts
  and whether it is on the best lineage;
* :func:`sequences_page`: a ``gradlab.jerk`` checkpoint's retained sequences (``resume/search.json``,
  verified the same way), ranked as JERK ranks them, with their length and scores per replay;
* :func:`cell_program`: the action program from reset that reached one cell, or a retained
  sequence (``sequence:<rank>``), which playback replays open loop
  (:class:`gradlab.play.session.PlaybackSession` ``cell=``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gradlab.errors import IntegrityError, NotFound
from gradlab.play.protocol import ArchiveBest, ArchiveCell, ArchivePage, RetainedSequence, SequencesPage

#: The one backend whose checkpoints hold an archive of cells.
ARCHIVE_BACKEND = "gradlab.go_explore"
#: The backend whose checkpoints hold retained action sequences; their keys (``sequence:<rank>``)
#: replay like cells.
SEQUENCES_BACKEND = "gradlab.jerk"
SEQUENCE_PREFIX = "sequence:"
#: Cells an archive page lists at most (the best by return, then progress); the page says how many were left out.
MAX_CELLS_SHOWN = 5000
#: Longest cell key accepted from a request (signal keys name a few signals; frame keys are 24 hex digits).
MAX_CELL_KEY = 512
#: Longest frame-cell thumbnail read from an archive (hex digits: the largest frame cell, 160 x 210
#: pixels, at two a pixel).
MAX_THUMB = 160 * 210 * 2

_Count = Annotated[int, Field(strict=True, ge=0, le=2**62)]
_Number = Annotated[float, Field(allow_inf_nan=False)]
_Action = Annotated[int, Field(strict=True, ge=0, le=2**31)]


class _StoredCell(BaseModel):
    """One cell as ``gradlab.explore.archive.Archive.to_json`` writes it (checked before use)."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=MAX_CELL_KEY)
    actions: list[_Action]
    return_: _Number
    length: _Count
    progress: _Number
    state: str
    parent: str | None = None
    visits: _Count = 0
    selections: _Count = 0
    thumb: str | None = Field(default=None, max_length=MAX_THUMB)


class _StoredBest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    actions: list[_Action]
    return_: _Number
    length: _Count
    progress: _Number
    cell: str | None = None


class _StoredArchive(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: str
    max_cells: _Count
    success_guidance: _Number
    cells: list[_StoredCell]
    best: _StoredBest | None
    counters: dict[str, _Count]
    recent: list[bool]


def _verified_json(folder: Path, name: str, what: str, backend: str) -> tuple[Path, Any]:
    """``resume/<name>`` of a checkpoint, its bytes checked against the manifest, parsed as JSON.

    Raises:
        NotFound: the manifest lists no such file (``what`` and ``backend`` name what keeps one).
        IntegrityError: unreadable, a size or sha256 other than the manifest's, or not JSON.
    """
    from gradlab.checkpoints import read_manifest
    from gradlab.checkpoints.manifest import RESUME_DIR

    manifest = read_manifest(folder)
    rel = f"{RESUME_DIR}/{name}"
    entry = manifest.files.get(rel)
    if entry is None:
        raise NotFound(f"{folder}: no {what} ({rel} is not in the manifest; only {backend} "
                       f"checkpoints keep one, this is {manifest.backend_id})")
    path = folder / rel
    try:
        data = path.read_bytes()
    except OSError as e:
        raise IntegrityError(f"{path}: listed in the manifest but unreadable ({e.strerror})") from None
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != entry.size_bytes:
        raise IntegrityError(f"{path}: size expected {entry.size_bytes} bytes, found {len(data)}")
    if digest != entry.sha256:
        raise IntegrityError(f"{path}: sha256 expected {entry.sha256}, found {digest}")
    try:
        return path, json.loads(data)
    except ValueError as e:
        raise IntegrityError(f"{path}: not JSON ({e})") from None


def _checked(model: type[BaseModel], path: Path, value: Any) -> Any:
    """``value`` validated as ``model``; IntegrityError names the file and the first key path at fault."""
    try:
        return model.model_validate(value)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise IntegrityError(f"{path}: {where}: {first['msg']}") from None


def read_archive(folder: Path) -> dict[str, Any]:
    """The archive JSON of a search checkpoint, its bytes verified against the manifest.

    Args:
        folder: a checkpoint folder (``manifest.json`` beside ``resume/archive.json``).

    Returns:
        The ``gradlab.archive/1`` object as plain JSON (``cells``, ``best``, ``counters``...), every
        field checked (types, finite numbers, non-negative counts and actions, unique cell keys).

    Raises:
        NotFound: the checkpoint holds no archive (not a ``gradlab.go_explore`` checkpoint).
        IntegrityError: the file's sha256 or size is not the manifest's, or it is not a valid
            archive (naming the file and the key path at fault).
    """
    from gradlab.explore.archive import FORMAT
    from gradlab.learn.go_explore import ARCHIVE_FILE

    path, archive = _verified_json(Path(folder), ARCHIVE_FILE, "archive", ARCHIVE_BACKEND)
    if not isinstance(archive, dict) or archive.get("format") != FORMAT:
        raise IntegrityError(f"{path}: expected an archive of format {FORMAT}")
    checked = _checked(_StoredArchive, path, archive)
    keys = [c.key for c in checked.cells]
    if len(set(keys)) != len(keys):
        dup = next(k for i, k in enumerate(keys) if k in keys[:i])
        raise IntegrityError(f"{path}: cell {dup!r} is listed twice")
    return checked.model_dump()


def archive_page(run_id: str, step: int, folder: Path, spec: dict[str, Any]) -> ArchivePage:
    """The archive of a resolved search checkpoint as the player's page.

    Args:
        run_id, step: what the page is of. folder: the verified local checkpoint folder.
        spec: its run spec JSON (the recipe's ``cell`` config names the coordinates).

    Raises:
        NotFound, IntegrityError: as :func:`read_archive`.
    """
    from gradlab.evaluation.runner import parse_spec
    from gradlab.explore.archive import lineage as lineage_of
    from gradlab.explore.cells import SignalCells

    archive = read_archive(folder)
    run_spec = parse_spec(spec, source=f"run {run_id} spec")
    cell_cfg = getattr(run_spec.recipe.train.backend.typed_config(), "cell", None)
    kind = cell_cfg.kind if cell_cfg is not None else "signals"
    names = list(cell_cfg.signals) if cell_cfg is not None and kind == "signals" else []
    signal_cells = SignalCells(names=tuple(names), bins={}) if names else None
    cells = archive["cells"]
    best = archive.get("best")
    lineage = lineage_of({c["key"]: c["parent"] for c in cells}, best["cell"] if best else None)
    on_lineage = set(lineage)
    ranked = sorted(cells, key=lambda c: (-c["return_"], -c["progress"], c["length"], c["key"]))
    shown = ranked[:MAX_CELLS_SHOWN]
    size = [cell_cfg.width, cell_cfg.height, cell_cfg.levels] if cell_cfg is not None and kind == "frame" else None
    rows = [ArchiveCell(key=c["key"], coordinates=signal_cells.coordinates(c["key"]) if signal_cells else None,
                        thumbnail=_checked_thumbnail(folder, c, size) if size else None,
                        return_=c["return_"],
                        length=c["length"], progress=c["progress"], visits=c["visits"], selections=c["selections"],
                        parent=c.get("parent"), lineage=c["key"] in on_lineage) for c in shown]
    counters = archive.get("counters", {})
    return ArchivePage(
        run_id=run_id, step=step, cell_kind=kind, coordinates=names, cell_count=len(cells),
        cells_left_out=len(cells) - len(shown), max_cells=int(archive.get("max_cells", 0)), thumbnail_size=size,
        visit_count=int(counters.get("visit", 0)), selection_count=int(counters.get("selection", 0)),
        best=(ArchiveBest(return_=best["return_"], length=best["length"], progress=best["progress"],
                          cell=best.get("cell")) if best else None),
        lineage=list(reversed(lineage)), cells=rows)


def _checked_thumbnail(folder: Path, cell: dict[str, Any], size: list[int]) -> str | None:
    """A frame cell's thumbnail, checked to be the picture its key hashes (None for an archive
    written before cells kept one).

    Raises:
        IntegrityError: a thumbnail of the wrong size or values, or of another cell (naming it).
    """
    from gradlab.explore.cells import decode_thumbnail, key_of_small

    thumb = cell.get("thumb")
    if thumb is None:
        return None
    where = f"{folder / 'resume' / 'archive.json'}: cell {cell['key']}: thumb"
    try:
        small = decode_thumbnail(thumb, *size)
    except ValueError as e:
        raise IntegrityError(f"{where}: {e}") from None
    if key_of_small(small) != cell["key"]:
        raise IntegrityError(f"{where}: the picture is not the cell's (its hash is not the key)")
    return thumb


class _StoredSequence(BaseModel):
    """One sequence JERK retained (``gradlab.learn.jerk``: its actions and its score per replay)."""

    model_config = ConfigDict(extra="forbid")

    actions: list[_Action]
    returns: list[_Number] = Field(min_length=1)
    successes: _Count = 0


class _StoredJerk(BaseModel):
    model_config = ConfigDict(extra="allow")  # the lanes' bookkeeping and the RNG: not shown

    format: str
    retained: list[_StoredSequence]


def read_sequences(folder: Path) -> list[dict[str, Any]]:
    """The sequences a ``gradlab.jerk`` checkpoint retained, ranked as JERK ranks them (mean score,
    then fewer steps), each ``{"key": "sequence:<rank>", "rank", "actions", "returns", "successes"}``; the file
    verified against the manifest first and every field checked.

    Raises:
        NotFound: not a ``gradlab.jerk`` checkpoint.
        IntegrityError: the file does not match the manifest, or is not a JERK search state (naming
            the file and the key path at fault).
    """
    from gradlab.learn.jerk import FORMAT, retained_rank
    from gradlab.learn.search_backend import STATE_FILE

    path, state = _verified_json(Path(folder), STATE_FILE, "retained sequences", SEQUENCES_BACKEND)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise IntegrityError(f"{path}: expected a JERK search state of format {FORMAT}")
    checked = _checked(_StoredJerk, path, state)
    ranked = sorted(checked.retained, key=lambda q: retained_rank(q.model_dump()))
    return [{"key": f"{SEQUENCE_PREFIX}{i}", "rank": i, "actions": list(q.actions), "returns": list(q.returns),
             "successes": q.successes} for i, q in enumerate(ranked, start=1)]


def sequences_page(run_id: str, step: int, folder: Path) -> SequencesPage:
    """The retained sequences of a resolved ``gradlab.jerk`` checkpoint as the player's page.

    Raises:
        NotFound, IntegrityError: as :func:`read_sequences`.
    """
    seqs = read_sequences(folder)
    return SequencesPage(run_id=run_id, step=step, sequence_count=len(seqs), sequences=[
        RetainedSequence(key=q["key"], rank=q["rank"], length=len(q["actions"]), replays=len(q["returns"]),
                         return_mean=sum(q["returns"]) / len(q["returns"]), return_last=q["returns"][-1],
                         return_best=max(q["returns"]), successes=q["successes"]) for q in seqs])


def cell_program(folder: Path, key: str) -> list[int]:
    """The action program from reset that reached cell ``key`` of a search checkpoint's archive, or
    a JERK checkpoint's retained sequence ``sequence:<rank>`` (:func:`read_sequences`).

    Raises:
        NotFound: no archive, or no such cell in it (naming the key and the cell count); no such
            retained sequence.
        IntegrityError: as :func:`read_archive` or :func:`read_sequences`.
    """
    if key.startswith(SEQUENCE_PREFIX):
        seqs = read_sequences(folder)
        found = next((q for q in seqs if q["key"] == key), None)
        if found is None:
            raise NotFound(f"{folder}: no retained sequence {key!r} ({len(seqs)} retained)")
        return found["actions"]
    archive = read_archive(folder)
    cell = next((c for c in archive["cells"] if c.get("key") == key), None)
    if cell is None:
        raise NotFound(f"{folder}: no cell {key!r} in its archive ({len(archive['cells'])} cells)")
    return list(cell["actions"])
