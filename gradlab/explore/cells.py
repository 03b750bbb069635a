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

    def small(self, obs: np.ndarray | None) -> np.ndarray:
        """The downscaled, quantised frame of one lane's observation: (height, width) uint8, values
        in ``0 .. levels - 1``. ``obs``: (C, H, W) uint8 channel-first, the newest frame last (its
        last channel is used: the grey frame of a grayscale stack).

        Raises:
            ConfigError: ``obs`` is not an image (C, H, W).
        """
        from PIL import Image

        if obs is None or obs.ndim != 3:
            raise ConfigError("cell.kind frame: expected an image observation (C, H, W)")
        frame = obs[-1]  # the newest frame's last channel: the luma plane of a grayscale stack
        img = Image.fromarray(np.asarray(frame, dtype=np.uint8)).resize((self.width, self.height), Image.BOX)
        return (np.asarray(img, dtype=np.uint16) * self.levels // 256).astype(np.uint8)

    def key(self, signals: Mapping[str, Any], obs: np.ndarray | None = None) -> str:
        """The cell of one lane's observation: the first 24 hex digits of the sha256 of
        :meth:`small`'s bytes (row-major)."""
        return key_of_small(self.small(obs))

    def thumbnail(self, obs: np.ndarray | None) -> str:
        """The cell's picture as text: :meth:`small` row-major, :func:`thumbnail_digits` hex digits
        a pixel (``height * width`` times that many characters); :func:`decode_thumbnail` reads it."""
        digits = thumbnail_digits(self.levels)
        return "".join(f"{int(v):0{digits}x}" for v in self.small(obs).ravel())


def key_of_small(small: np.ndarray) -> str:
    """The frame cell key of a downscaled, quantised frame (uint8, row-major)."""
    return hashlib.sha256(np.ascontiguousarray(small, dtype=np.uint8).tobytes()).hexdigest()[:24]


def thumbnail_digits(levels: int) -> int:
    """Hex digits a pixel takes in a frame cell's thumbnail: 1 up to 16 levels, else 2."""
    return 1 if levels <= 16 else 2


def decode_thumbnail(text: str, width: int, height: int, levels: int) -> np.ndarray:
    """A :meth:`FrameCells.thumbnail` back as (height, width) uint8.

    Raises:
        ValueError: not ``width * height`` pixels of hex digits, or a value at or past ``levels``.
    """
    digits = thumbnail_digits(levels)
    if len(text) != width * height * digits:
        raise ValueError(f"expected {width * height * digits} hex digits ({width} x {height} pixels), found {len(text)}")
    try:
        values = [int(text[i:i + digits], 16) for i in range(0, len(text), digits)]
    except ValueError:
        raise ValueError("not hex digits") from None
    if max(values, default=0) >= levels:
        raise ValueError(f"a pixel at {max(values)}, past the {levels} grey levels")
    return np.array(values, dtype=np.uint8).reshape(height, width)


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
