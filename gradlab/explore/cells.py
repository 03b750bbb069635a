"""Cell functions: what makes two states the same cell of the archive.

* :class:`SignalCells`: named task-program signals (RAM x-position, room, lives, a maze's
  ``x, y, has_key``), each divided by its bin width and floored.
* :class:`FrameCells`: the observation's newest frame, grey, downscaled to ``width`` × ``height``
  (PIL's area-averaging ``BOX`` filter) and quantised to ``levels`` grey levels: the cell of
  Ecoffet et al. 2019, "Go-Explore: a New Approach for Hard-Exploration Problems", section 2.1.1
  (11 × 8 pixels, 8 levels for Montezuma's Revenge).

A cell key is a short string, so an archive is JSON.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gradlab.errors import ConfigError


@dataclass(frozen=True)
class SignalCells:
    """Cells from signal values: ``name=floor(value / bin)`` joined by ``;``.

    Attributes:
        names: the signals, in key order (each must be a signal of the goal's task program).
        bins: signal -> bin width (default 1.0).
    """

    names: tuple[str, ...]
    bins: Mapping[str, float]

    def key(self, signals: Mapping[str, Any], obs: np.ndarray | None = None) -> str:
        """The cell of one lane: ``signals`` maps each name to its value (None or NaN -> ``nan``)."""
        parts = []
        for name in self.names:
            v = signals.get(name)
            try:
                f = float(v)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                f = math.nan
            parts.append(f"{name}={math.floor(f / self.bins.get(name, 1.0)) if math.isfinite(f) else 'nan'}")
        return ";".join(parts)


    def coordinates(self, key: str) -> dict[str, int] | None:
        """The binned value per signal of a key :meth:`key` made (``x=3;y=1`` -> {"x": 3, "y": 1});
        None when the key is not of these signals or holds a ``nan``."""
        out: dict[str, int] = {}
        for part in key.split(";"):
            name, _, value = part.partition("=")
            try:
                out[name] = int(value)
            except ValueError:
                return None
        return out if tuple(out) == self.names else None


@dataclass(frozen=True)
class FrameCells:
    """Cells from the newest observation frame, grey, downscaled and quantised (see the module docstring).

    Attributes:
        width, height: the downscaled size in pixels. levels: grey levels kept (2..256).
    """

    width: int = 11
    height: int = 8
    levels: int = 8

    def key(self, signals: Mapping[str, Any], obs: np.ndarray | None = None) -> str:
        """The cell of one lane's observation: (C, H, W) uint8 channel-first, the newest frame last
        (its last channel is used: the grey frame of a grayscale stack)."""
        from PIL import Image

        if obs is None or obs.ndim != 3:
            raise ConfigError("cell.kind frame: expected an image observation (C, H, W)")
        frame = obs[-1]  # the newest frame's last channel: the luma plane of a grayscale stack
        img = Image.fromarray(np.asarray(frame, dtype=np.uint8)).resize((self.width, self.height), Image.BOX)
        small = (np.asarray(img, dtype=np.uint16) * self.levels // 256).astype(np.uint8)
        return hashlib.sha256(small.tobytes()).hexdigest()[:24]


def make_cell_function(cell: Any, signal_names: list[str]) -> SignalCells | FrameCells:
    """The cell function a recipe's ``cell`` config names.

    Args:
        cell: a :class:`gradlab.contracts.recipe.CellConfig`.
        signal_names: the goal's task-program signals.

    Raises:
        ConfigError: a signal that the task program does not define, naming the key.
    """
    if cell.kind == "frame":
        return FrameCells(width=cell.width, height=cell.height, levels=cell.levels)
    missing = [n for n in cell.signals if n not in signal_names]
    if missing or not cell.signals:
        raise ConfigError(f"train.backend.config.cell.signals: expected signals of the goal's task program "
                          f"({', '.join(signal_names) or 'none'}), found {list(cell.signals)}")
    return SignalCells(names=tuple(cell.signals), bins=dict(cell.bins))


def progress_of(signals: Mapping[str, Any], names: list[str]) -> float:
    """The goal's progress at one step: the sum of the signals ``names`` (the task program's
    ``progress``) in ``signals``; a missing, non-numeric or non-finite value counts 0."""
    total = 0.0
    for name in names:
        try:
            v = float(signals.get(name))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        total += v if np.isfinite(v) else 0.0
    return total
