"""The state archive: one entry per cell with the best trajectory that reached it and its state.

Go-Explore's archive (Ecoffet et al. 2019, "Go-Explore", section 2.1): every cell keeps the action
program from reset that reached it (its trajectory), that trajectory's return, length and progress,
and the provider state at its end (a content-addressed blob). A cell's trajectory is replaced when a
new one reaches it with a higher return, or the same return in fewer steps. Selection weights are
count based, ``1 / sqrt(1 + selections)`` (the paper's count score, section 2.1.2 and appendix
A.5), so rarely chosen cells come back; with ``success_guidance`` > 0 that share of selections is
drawn from the cells on the best successful trajectory's lineage instead. The archive is bounded:
past ``max_cells`` the cell with the lowest (return, progress) and most selections that is not on the
best lineage is evicted, and blobs no cell references are dropped (compaction).

Everything is JSON plus blobs (:mod:`gradlab.explore.blobs`), so an archive saved in a checkpoint
and loaded again continues identically (docs/ARCHITECTURE.md section 12a).
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gradlab.errors import IntegrityError
from gradlab.explore.blobs import blob_sha256

FORMAT = "gradlab.archive/1"
RECENT_WINDOW = 1000
"""Visits in the window of ``.../archive/recent_new_cell_rate``."""


@dataclass
class Cell:
    """One archived cell.

    Attributes:
        key: the cell key (:mod:`gradlab.explore.cells`).
        actions: the action program from reset that reached it (discrete action indices).
        return_: shaped return of that program. length: its steps. progress: the greatest sum of the
            goal's progress signals along it.
        state: sha256 of the provider state at its end (``VectorEnv.capture_lane`` bytes).
        parent: the key of the cell its exploration started from (None for a start cell).
        visits, selections: how often it was reached, and chosen to explore from.
        thumb: the cell's picture for frame cells (``FrameCells.thumbnail``: the downscaled frame
            whose hash is the key, as hex digits), None for signal cells.
    """

    key: str
    actions: list[int]
    return_: float
    length: int
    progress: float
    state: str
    parent: str | None = None
    visits: int = 0
    selections: int = 0
    thumb: str | None = None


@dataclass
class Trajectory:
    """The best completed (successful) trajectory found so far."""

    actions: list[int]
    return_: float
    length: int
    progress: float
    cell: str | None = None


@dataclass
class Archive:
    """Cells, blobs and counters (see the module docstring).

    Attributes:
        max_cells: bound on the cell count. success_guidance: share of selections from the best lineage.
    """

    max_cells: int = 10_000
    success_guidance: float = 0.0
    cells: dict[str, Cell] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    best: Trajectory | None = None
    visit_count: int = 0
    selection_count: int = 0
    update_count: int = 0
    guided_selection_count: int = 0
    improvement_count: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_WINDOW))

    # -- growing --------------------------------------------------------------------------
    def wants(self, key: str, return_: float, length: int) -> bool:
        """Whether a trajectory ending in ``key`` would be archived (new cell, or better than its)."""
        cell = self.cells.get(key)
        return cell is None or return_ > cell.return_ or (return_ == cell.return_ and length < cell.length)

    def visit(self, key: str, *, actions: list[int], return_: float, length: int, progress: float,
              state: bytes | None, parent: str | None, thumb: str | None = None) -> bool:
        """Count one visit of ``key`` and archive the trajectory if :meth:`wants` it.

        Args:
            actions: the program from reset (copied). state: the provider state at its end; required
                when the trajectory is archived (call :meth:`wants` first to capture only then).
            thumb: the cell's picture (frame cells), kept by a new cell.

        Returns:
            True when the trajectory was archived (a new cell or an update).
        """
        self.visit_count += 1
        cell = self.cells.get(key)
        self.recent.append(cell is None)
        if cell is not None:
            cell.visits += 1
        if not self.wants(key, return_, length):
            return False
        if state is None:
            raise IntegrityError(f"archive cell {key}: a trajectory to archive needs its provider state")
        sha = blob_sha256(state)
        self.blobs.setdefault(sha, state)
        if cell is None:
            self.cells[key] = Cell(key, list(actions), float(return_), int(length), float(progress), sha, parent, visits=1,
                                   thumb=thumb)
            self._bound()
        else:
            self.update_count += 1
            cell.actions, cell.return_, cell.length = list(actions), float(return_), int(length)
            cell.progress, cell.state, cell.parent = float(progress), sha, parent
            self.compact()
        return True

    def complete(self, *, actions: list[int], return_: float, length: int, progress: float,
                 cell: str | None) -> bool:
        """Offer a successful trajectory; kept when it beats :attr:`best` (return, then fewer steps).

        Returns:
            True when it became the best.
        """
        b = self.best
        if b is not None and not (return_ > b.return_ or (return_ == b.return_ and length < b.length)):
            return False
        if b is not None:
            self.improvement_count += 1
        self.best = Trajectory(list(actions), float(return_), int(length), float(progress), cell)
        return True

    # -- choosing -------------------------------------------------------------------------
    def lineage(self) -> list[str]:
        """Keys from the best trajectory's cell back to its start cell (empty without a best)."""
        return lineage({k: c.parent for k, c in self.cells.items()}, self.best.cell if self.best is not None else None)

    def weights(self) -> np.ndarray:
        """Selection probability per cell, in :attr:`cells` order: ``1 / sqrt(1 + selections)``, normalised."""
        w = np.array([1.0 / np.sqrt(1.0 + c.selections) for c in self.cells.values()], dtype=np.float64)
        return w / w.sum()

    def select(self, rng: np.random.Generator) -> Cell:
        """Choose a cell to explore from and count the selection.

        Raises:
            IntegrityError: the archive is empty.
        """
        if not self.cells:
            raise IntegrityError("archive: no cell to select (the search did not start)")
        lineage = self.lineage() if self.success_guidance > 0 else []
        if lineage and rng.random() < self.success_guidance:
            cell = self.cells[lineage[int(rng.integers(len(lineage)))]]
            self.guided_selection_count += 1
        else:
            keys = list(self.cells)
            cell = self.cells[keys[int(rng.choice(len(keys), p=self.weights()))]]
        cell.selections += 1
        self.selection_count += 1
        return cell

    def state(self, cell: Cell) -> bytes:
        """The provider state blob of ``cell``."""
        return self.blobs[cell.state]

    # -- bounding -------------------------------------------------------------------------
    def _bound(self) -> None:
        if len(self.cells) <= self.max_cells:
            return
        keep = set(self.lineage())
        victims = [c for c in self.cells.values() if c.key not in keep]
        victim = min(victims, key=lambda c: (c.return_, c.progress, -c.selections, -len(c.actions)))
        del self.cells[victim.key]
        self.compact()

    def compact(self) -> None:
        """Drop blobs no cell references."""
        used = {c.state for c in self.cells.values()}
        for sha in [s for s in self.blobs if s not in used]:
            del self.blobs[sha]

    # -- metrics and files -----------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """``train/algorithm/go_explore/archive/*``, ``.../success_guided/*`` and ``.../best/*`` (METRICS.md)."""
        p = "train/algorithm/go_explore"
        n = len(self.cells)
        out = {
            f"{p}/archive/cell_count": float(n),
            f"{p}/archive/entry_count": float(n),
            f"{p}/archive/blob_count": float(len(self.blobs)),
            f"{p}/archive/blob_bytes": float(sum(len(b) for b in self.blobs.values())),
            f"{p}/archive/selection_count": float(self.selection_count),
            f"{p}/archive/visit_count": float(self.visit_count),
            f"{p}/archive/update_count": float(self.update_count),
            f"{p}/archive/recent_new_cell_rate": float(np.mean(self.recent)) if self.recent else 0.0,
            f"{p}/archive/recent_visit_window": float(len(self.recent)),
            f"{p}/archive/visits_per_cell": float(self.visit_count / n) if n else 0.0,
            f"{p}/success_guided/cell_count": float(len(self.lineage())),
            f"{p}/success_guided/selection_count": float(self.guided_selection_count),
            f"{p}/best/completed": float(self.best is not None),
            f"{p}/best/improvement_count": float(self.improvement_count),
        }
        best = self.best or self.best_cell()
        if best is not None:
            out[f"{p}/best/progress"] = float(best.progress)
            out[f"{p}/best/return"] = float(best.return_)
            out[f"{p}/best/program_steps"] = float(len(best.actions))
            out[f"{p}/best/program_runs"] = float(count_runs(best.actions))
        return out

    def best_cell(self) -> Cell | None:
        """The cell with the highest (return, progress), fewest steps; None when empty."""
        if not self.cells:
            return None
        return max(self.cells.values(), key=lambda c: (c.return_, c.progress, -c.length))

    def program(self) -> tuple[list[int], bool]:
        """The best retained action program and whether it completed the task."""
        if self.best is not None:
            return list(self.best.actions), True
        cell = self.best_cell()
        return (list(cell.actions) if cell is not None else []), False

    def to_json(self) -> dict[str, Any]:
        """Everything but the blobs' bytes (cells name their blob by sha256)."""
        return {"format": FORMAT, "max_cells": self.max_cells, "success_guidance": self.success_guidance,
                "cells": [asdict(c) for c in self.cells.values()],
                "best": asdict(self.best) if self.best is not None else None,
                "counters": {"visit": self.visit_count, "selection": self.selection_count, "update": self.update_count,
                             "guided_selection": self.guided_selection_count, "improvement": self.improvement_count},
                "recent": [bool(x) for x in self.recent]}

    @classmethod
    def from_json(cls, data: dict[str, Any], blobs: dict[str, bytes], *, where: str) -> Archive:
        """The archive :meth:`to_json` wrote, with its blobs (already verified by address).

        Raises:
            IntegrityError: another format, or a cell whose blob is missing (naming ``where``).
        """
        if data.get("format") != FORMAT:
            raise IntegrityError(f"{where}: expected format {FORMAT}, found {data.get('format')!r}")
        a = cls(max_cells=int(data["max_cells"]), success_guidance=float(data["success_guidance"]))
        for c in data["cells"]:
            cell = Cell(**c)
            if cell.state not in blobs:
                raise IntegrityError(f"{where}: cell {cell.key} names provider state {cell.state}, which is missing")
            a.cells[cell.key] = cell
            a.blobs[cell.state] = blobs[cell.state]
        a.best = Trajectory(**data["best"]) if data["best"] is not None else None
        k = data["counters"]
        a.visit_count, a.selection_count, a.update_count = k["visit"], k["selection"], k["update"]
        a.guided_selection_count, a.improvement_count = k["guided_selection"], k["improvement"]
        a.recent.extend(data["recent"])
        return a


def lineage(parents: dict[str, str | None], cell: str | None) -> list[str]:
    """Keys from ``cell`` back through ``parents`` (cell key -> the key its exploration started from)
    to a start cell; stops at a key not in ``parents`` or seen already (empty for ``cell`` None)."""
    out: list[str] = []
    key = cell
    while key is not None and key in parents and key not in out:
        out.append(key)
        key = parents[key]
    return out


def count_runs(actions: list[int]) -> int:
    """Runs of equal consecutive actions in a program (``[1, 1, 2, 1]`` has 3)."""
    return sum(1 for i, a in enumerate(actions) if i == 0 or a != actions[i - 1])
