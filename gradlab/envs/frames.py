"""Image preprocessing for single-lane emulators (ViZDoom, stable-retro): grayscale, resize, stack.

Output layout is channel-first uint8, (stack × C, H, W) with C = 1 (grayscale) or 3 (RGB), the
same layout as the ALE provider, so every image policy sees one convention.
"""

from __future__ import annotations

import numpy as np

#: ITU-R BT.601 luma weights (the weights OpenCV's and PIL's RGB→L conversions use).
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


class FrameStack:
    """Turn raw frames into stacked, resized, channel-first observations.

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
        self._buf = np.zeros(self.shape, dtype=np.uint8)

    def _convert(self, frame: np.ndarray) -> np.ndarray:
        """(H, W) or (H, W, 3) uint8 → (C, h, w) uint8: PIL's "L" conversion (BT.601 luma, the
        ``LUMA`` weights) and bilinear resize."""
        gray = frame.ndim == 3 and self.grayscale
        resize = self.resize is not None and frame.shape[:2] != self.resize
        if gray or resize:
            from PIL import Image

            img = Image.fromarray(frame)
            if gray:
                img = img.convert("L")
            if resize:
                img = img.resize((self.resize[1], self.resize[0]), Image.BILINEAR)
            frame = np.asarray(img)
        if frame.ndim == 2:
            return frame[None]
        return frame.transpose(2, 0, 1)

    def reset(self, frame: np.ndarray) -> np.ndarray:
        """Fill the stack with ``frame``; returns a copy of the (stack × C, H, W) observation."""
        f = self._convert(frame)
        for i in range(self.stack):
            self._buf[i * self.channels:(i + 1) * self.channels] = f
        return self._buf.copy()

    def push(self, frame: np.ndarray) -> np.ndarray:
        """Append ``frame`` (dropping the oldest); returns a copy of the observation."""
        c = self.channels
        if self.stack > 1:
            self._buf[:-c] = self._buf[c:]
        self._buf[-c:] = self._convert(frame)
        return self._buf.copy()

    def repeat_last(self) -> np.ndarray:
        """The current observation again (a copy), for a step that produced no new frame."""
        return self._buf.copy()
