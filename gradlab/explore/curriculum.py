"""The archive curriculum's state: archived start cells, their priorities, and each lane's episode origin.

docs/ARCHITECTURE.md section 12a. A :class:`CurriculumArchive` is what ``train.curriculum.archive``
keeps besides the learner's own state:

* the cells (:class:`gradlab.explore.archive.Archive`, bounded by ``reservoir_size``: the cell
  with the lowest (return, progress) and most selections is evicted, unreferenced blobs dropped),
  filled from target-origin episodes only;
* each cell's priority: with ``priority_metric: value_error`` the EMA, rate ``ema_rate``, of the
  mean |A_t| (raw GAE advantages, Schulman et al. 2016, before minibatch normalisation) over each
  completed archive-origin trajectory started from it (the first trajectory sets it). A start cell
  is drawn with weight ``max(p, FLOOR * max p)``; a cell not tried yet gets the highest priority
  held (1 while none is held), so every new cell is tried soon. ``uniform``: equal weights;
* each lane's episode origin (``None``: the goal's own reset, the *target* origin; else the key of
  the archived cell it started from) and, for archive-origin lanes, the running sum and count of
  |A_t| over the episode's steps so far (an episode can span rollouts);
* its own random stream (start draws), counters, and the episode windows of archive-origin
  episodes (:class:`gradlab.learn.stats.EpisodeStats` data, kept here as JSON by the learner).

Everything is JSON plus the archive's blobs, so a checkpoint restores it exactly. The module
imports neither torch nor a provider.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gradlab.envs.snapshot import generator_state, set_generator_state
from gradlab.errors import IntegrityError
from gradlab.explore.archive import Archive, Cell

FORMAT = "gradlab.curriculum.archive/1"
FLOOR = 0.05
"""Least selection weight of a cell, as a share of the highest priority held."""
PREFIX = "train/curriculum/archive"


class CurriculumArchive:
    """Archived start cells, priorities and lane origins (see the module docstring).

    Args:
        n_envs: lanes of the run. share: probability in [0, 1) that an episode starts from the archive.
        reservoir_size: most cells kept. priority_metric: ``value_error`` or ``uniform``.
        ema_rate: in (0, 1], the weight of a new mean |A_t| in a cell's priority. seed: the start-draw stream's seed.

    Attributes:
        archive: the cells and blobs. priority: cell key -> priority (absent: not tried yet).
        origin: per lane, None (target origin) or the archived cell key the episode started from.
        adv_sum, adv_count: (n_envs,) float64 / int64, sum and count of |A_t| of each archive-origin
            lane's current episode so far.
        rng: the start-draw generator. archive_starts, target_starts: episodes begun from each
            origin since the run started. priority_updates: completed archive-origin trajectories counted.
    """

    def __init__(self, n_envs: int, *, share: float, reservoir_size: int, priority_metric: str,
                 ema_rate: float, seed: int):
        self.share, self.priority_metric, self.ema_rate = float(share), str(priority_metric), float(ema_rate)
        self.archive = Archive(max_cells=int(reservoir_size))
        self.priority: dict[str, float] = {}
        self.origin: list[str | None] = [None] * n_envs
        self.adv_sum = np.zeros(n_envs, dtype=np.float64)
        self.adv_count = np.zeros(n_envs, dtype=np.int64)
        self.rng = np.random.default_rng(np.random.SeedSequence([0xA2C1, int(seed)]))
        self.archive_starts = 0
        self.target_starts = 0
        self.priority_updates = 0

    # -- filling ---------------------------------------------------------------------------
    def wants(self, key: str) -> bool:
        """Whether a state in cell ``key`` would be archived now (a cell not held yet)."""
        return key not in self.archive.cells

    def add(self, key: str, state: bytes, *, return_: float, length: int, progress: float) -> bool:
        """Archive ``state`` (``VectorEnv.capture_lane`` bytes) as cell ``key``, once per cell.

        Args:
            return_, length: the episode's shaped return and steps so far. progress: the goal's progress there.

        Returns:
            True when the cell is new (it may evict the weakest cell past ``reservoir_size``).
        """
        if not self.wants(key):
            return False
        self.archive.visit(key, actions=[], return_=return_, length=length, progress=progress, state=state, parent=None)
        for gone in [k for k in self.priority if k not in self.archive.cells]:
            del self.priority[gone]
        return key in self.archive.cells

    # -- starting episodes -------------------------------------------------------------------
    def weights(self) -> np.ndarray:
        """Selection probability per cell, in :attr:`archive` cell order (see the module docstring).

        Returns:
            (cells,) float64 summing to 1.
        """
        keys = list(self.archive.cells)
        if self.priority_metric == "uniform" or not keys:
            return np.full(len(keys), 1.0 / max(len(keys), 1))
        top = max(self.priority.values(), default=1.0)
        p = np.array([self.priority.get(k, top) for k in keys], dtype=np.float64)
        if not np.isfinite(top) or top <= 0:
            return np.full(len(keys), 1.0 / len(keys))
        p = np.maximum(p, FLOOR * top)
        return p / p.sum()

    def start(self, lane: int) -> Cell | None:
        """Decide where ``lane``'s new episode begins and record its origin.

        With probability ``share`` (and at least one archived cell) a cell drawn by :meth:`weights`
        (its selection counted); else None, the goal's own reset.
        """
        cell = None
        if self.archive.cells and self.rng.random() < self.share:
            keys = list(self.archive.cells)
            cell = self.archive.cells[keys[int(self.rng.choice(len(keys), p=self.weights()))]]
            cell.selections += 1
            self.archive.selection_count += 1
            self.archive_starts += 1
        else:
            self.target_starts += 1
        self.origin[lane] = cell.key if cell is not None else None
        return cell

    # -- priorities --------------------------------------------------------------------------
    def add_advantages(self, lane: int, key: str, abs_adv: np.ndarray, *, ended: bool) -> float | None:
        """Add a stretch of ``lane``'s episode started from cell ``key``: |A_t| of its steps in one rollout.

        Stretches of one lane come in time order; the sums carry over between rollouts until the
        episode ends.

        Args:
            abs_adv: (k,) float, |raw GAE advantage| of the stretch's steps, in order.
            ended: the episode ended at the stretch's last step; the cell's priority is then updated
                and the lane's sums start again.

        Returns:
            The trajectory's mean |A_t| over all its steps when it ended, else None.
        """
        self.adv_sum[lane] += float(np.sum(abs_adv, dtype=np.float64))
        self.adv_count[lane] += int(np.size(abs_adv))
        if not ended:
            return None
        n = int(self.adv_count[lane])
        mean = float(self.adv_sum[lane] / n) if n else 0.0
        if n:
            self.update_priority(key, mean)
        self.adv_sum[lane], self.adv_count[lane] = 0.0, 0
        return mean

    def update_priority(self, key: str, value: float) -> None:
        """Fold one trajectory's mean |A_t| ``value`` into cell ``key``'s EMA (an evicted cell is skipped)."""
        if key not in self.archive.cells:
            return
        old = self.priority.get(key)
        self.priority[key] = float(value) if old is None else (1.0 - self.ema_rate) * old + self.ema_rate * float(value)
        self.priority_updates += 1

    # -- metrics and files -----------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """``train/curriculum/archive/*`` (METRICS.md)."""
        starts = self.archive_starts + self.target_starts
        pri = list(self.priority.values())
        return {
            f"{PREFIX}/cell_count": float(len(self.archive.cells)),
            f"{PREFIX}/blob_bytes": float(sum(len(b) for b in self.archive.blobs.values())),
            f"{PREFIX}/start_count": float(self.archive_starts),
            f"{PREFIX}/start_share": float(self.archive_starts / starts) if starts else 0.0,
            f"{PREFIX}/priority/tried_cell_count": float(len(pri)),
            f"{PREFIX}/priority/mean": float(np.mean(pri)) if pri else 0.0,
            f"{PREFIX}/priority/max": float(np.max(pri)) if pri else 0.0,
            f"{PREFIX}/priority/update_count": float(self.priority_updates),
        }

    def to_json(self) -> dict[str, Any]:
        """Everything but the blobs' bytes (cells name their blob by sha256)."""
        return {"format": FORMAT, "share": self.share, "priority_metric": self.priority_metric,
                "ema_rate": self.ema_rate, "archive": self.archive.to_json(),
                "priority": dict(sorted(self.priority.items())), "origin": list(self.origin),
                "adv_sum": [float(x) for x in self.adv_sum], "adv_count": [int(x) for x in self.adv_count],
                "rng": generator_state(self.rng),
                "counters": {"archive_starts": self.archive_starts, "target_starts": self.target_starts,
                             "priority_updates": self.priority_updates}}

    def load_json(self, data: dict[str, Any], blobs: dict[str, bytes], *, where: str) -> None:
        """Take the state :meth:`to_json` wrote (its blobs already read and verified by address).

        Raises:
            IntegrityError: naming ``where``: another format, another lane count, or a cell whose blob is missing.
        """
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise IntegrityError(f"{where}: expected format {FORMAT}, found {found!r}")
        if len(data["origin"]) != len(self.origin):
            raise IntegrityError(f"{where}: {len(data['origin'])} lanes saved, this env has {len(self.origin)}")
        archive = Archive.from_json(data["archive"], blobs, where=where)
        if archive.max_cells != self.archive.max_cells:
            raise IntegrityError(f"{where}: reservoir_size {archive.max_cells} saved, this recipe has "
                                 f"{self.archive.max_cells}")
        self.archive = archive
        self.priority = {str(k): float(v) for k, v in data["priority"].items()}
        self.origin = [None if o is None else str(o) for o in data["origin"]]
        self.adv_sum = np.asarray(data["adv_sum"], dtype=np.float64)
        self.adv_count = np.asarray(data["adv_count"], dtype=np.int64)
        set_generator_state(self.rng, data["rng"])
        k = data["counters"]
        self.archive_starts, self.target_starts = int(k["archive_starts"]), int(k["target_starts"])
        self.priority_updates = int(k["priority_updates"])

    def reset_lanes(self) -> None:
        """Every lane back to the target origin (a resumed run whose lanes were reset)."""
        self.origin = [None] * len(self.origin)
        self.adv_sum[:] = 0.0
        self.adv_count[:] = 0
