"""Image preprocessing for single-lane emulators (ViZDoom, stable-retro): grayscale, resize, stack.

Output layout is channel-first uint8, (stack × C, H, W) with C = 1 (grayscale) or 3 (RGB), the
same layout as the ALE provider, so every image policy sees one convention.

Cost (``valgrind --tool=callgrind``, instructions per frame, see ``docs/BENCHMARKS.md``): the
PIL conversion is the work a hand-written loop does too (``Image.fromarray``, ``convert("L")``,
``resize``, ``np.asarray``: ~0.9 M for a 160×120 GRAY8 frame to 84×84, ~3.4 M for a 320×224
RGB frame); the stack itself is one ``np.concatenate`` of the kept frames (no shift in place,
no second copy).
"""

from __future__ import annotations

from collections import deque

import numpy as np

#: ITU-R BT.601 luma weights (the weights OpenCV's and PIL's RGB→L conversions use).
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


class FrameStack:
    """Turn raw frames into stacked, resized, channel-first observations.

    Every observation returned is a new array the caller owns; the stack keeps its frames
    privately (read-only), so writing to a returned observation never changes the next one.

    Args:
        grayscale: convert RGB input to one luma channel (input already (H, W) stays as is).
        resize: (height, width) in pixels, or None to keep the input size.
        stack: frames per observation (the newest last).
        in_shape: the raw frame shape, (H, W) or (H, W, 3).
    """

    def __init__(self, *, grayscale: bool, resize: tuple[int, int] | None, stack: int, in_shape: tuple[int, ...]):
        self.grayscale = grayscale or len(in_shape) == 2
        self.resize = tuple(resize) if resize is not None else None
        self.stack = stack
        h, w = self.resize if self.resize is not None else in_shape[:2]
        self.channels = 1 if self.grayscale else 3
        self.shape = (stack * self.channels, int(h), int(w))
        blank = np.zeros((self.channels, int(h), int(w)), dtype=np.uint8)
        blank.flags.writeable = False
        self._frames: deque[np.ndarray] = deque([blank] * stack, maxlen=stack)

    def _convert(self, frame: np.ndarray) -> np.ndarray:
        """(H, W) or (H, W, 3) uint8 → (C, h, w) uint8: PIL's "L" conversion (BT.601 luma, the
        ``LUMA`` weights) and bilinear resize. The result is a view of ``frame`` when there is
        nothing to convert, else a read-only array of its own."""
        gray = frame.ndim == 3 and self.grayscale
        resize = self.resize is not None and frame.shape[:2] != self.resize
        if gray or resize:
            from PIL import Image

            img = Image.fromarray(frame)
            if gray:
                img = img.convert("L")
            if resize:
                img = img.resize((self.resize[1], self.resize[0]), Image.BILINEAR)
            frame = np.asarray(img)  # read-only: backed by the bytes of the converted image
        if frame.ndim == 2:
            return frame[None]
        return frame.transpose(2, 0, 1)

    def _keep(self, frame: np.ndarray) -> np.ndarray:
        """The converted frame as a private read-only array (copied when it is a view of the caller's)."""
        f = self._convert(frame)
        if f.flags.writeable or f.base is frame or f.base is frame.base:
            f = f.copy()
            f.flags.writeable = False
        return f

    def reset(self, frame: np.ndarray) -> np.ndarray:
        """Fill the stack with ``frame``; returns the (stack × C, H, W) observation (a new array)."""
        f = self._keep(frame)
        self._frames.extend([f] * self.stack)
        return np.concatenate(self._frames) if self.stack > 1 else f.copy()

    def push(self, frame: np.ndarray) -> np.ndarray:
        """Append ``frame`` (dropping the oldest); returns the observation (a new array)."""
        f = self._keep(frame)
        self._frames.append(f)
        return np.concatenate(self._frames) if self.stack > 1 else f.copy()

    def frames(self) -> list[np.ndarray]:
        """The kept (C, H, W) uint8 frames, oldest first (a provider state snapshot saves them)."""
        return list(self._frames)

    def set_frames(self, frames: list[np.ndarray]) -> None:
        """Replace the kept frames with ``frames`` (from :meth:`frames`), oldest first.

        Raises:
            IntegrityError: not ``stack`` frames of this stack's (C, H, W) shape.
        """
        from gradlab.errors import IntegrityError

        shape = (self.channels, *self.shape[1:])
        if len(frames) != self.stack or any(tuple(f.shape) != shape or f.dtype != np.uint8 for f in frames):
            raise IntegrityError(f"provider state: expected {self.stack} uint8 frames of shape {shape}")
        kept = []
        for f in frames:
            f = np.array(f, dtype=np.uint8)
            f.flags.writeable = False
            kept.append(f)
        self._frames.extend(kept)

    def repeat_last(self) -> np.ndarray:
        """The current observation again (a new array), for a step that produced no new frame."""
        return np.concatenate(self._frames) if self.stack > 1 else self._frames[-1].copy()
