"""MP4 files of episodes, with their provenance in the container's metadata.

One writer for every caller that records episodes (``gradlab play --record``, ``gradlab eval
--video``, publication's ``replay.mp4``): frames go to ffmpeg through imageio-ffmpeg (its bundled
binary, no system ffmpeg needed), H.264 in an MP4 container, and the provenance (checkpoint
sha256, goal, seed, return, ...) is written as MP4 metadata tags that ``read_mp4_metadata`` (or
any ffmpeg/ffprobe) reads back.

Public names: ``write_mp4``, ``read_mp4_metadata``, ``count_frames``, ``read_frames``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np

from gradlab.errors import GradlabError

#: Metadata keys must be plain words: ffmpeg writes them as MP4 tags (``-movflags use_metadata_tags``).
_KEY_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_")


class VideoError(GradlabError, ValueError):
    """A video could not be written or read (bad frames, bad metadata, ffmpeg failed)."""


def _even(frame: np.ndarray) -> np.ndarray:
    """Pad to even height and width (H.264 with yuv420p needs both even)."""
    h, w = frame.shape[:2]
    if h % 2 == 0 and w % 2 == 0:
        return frame
    return np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")


def _as_rgb(frame: np.ndarray, path: Path) -> np.ndarray:
    frame = np.asarray(frame)
    if frame.dtype != np.uint8:
        raise VideoError(f"{path}: frames must be uint8, got {frame.dtype}")
    if frame.ndim == 2:
        frame = np.repeat(frame[:, :, None], 3, axis=2)
    if frame.ndim != 3 or frame.shape[2] not in (1, 3):
        raise VideoError(f"{path}: frames must be (H, W), (H, W, 1) or (H, W, 3), got {frame.shape}")
    if frame.shape[2] == 1:
        frame = np.repeat(frame, 3, axis=2)
    return _even(frame)


def write_mp4(path: Path, frames: Iterable[np.ndarray], *, fps: float, metadata: Mapping[str, object]) -> int:
    """Write frames as an H.264 MP4 with metadata tags; atomically (temp file, then rename).

    Args:
        path: the ``.mp4`` file to write; its folder must exist.
        frames: (H, W, 3), (H, W, 1) or (H, W) uint8 RGB/gray frames, all the same size.
        fps: frames per second of playback (> 0).
        metadata: tag name (lower-case letters, digits, ``_``) → value (written with ``str``).

    Returns:
        The number of frames written.

    Raises:
        VideoError: no frames, frames of different sizes or dtype, a bad tag name, ffmpeg failed.
    """
    import imageio_ffmpeg

    path = Path(path)
    if fps <= 0:
        raise VideoError(f"{path}: fps must be > 0, got {fps}")
    params: list[str] = ["-movflags", "use_metadata_tags+faststart"]
    for key, value in metadata.items():
        if not key or set(key) - _KEY_CHARS:
            raise VideoError(f"{path}: metadata key {key!r} must be lower-case letters, digits and '_'")
        params += ["-metadata", f"{key}={value}"]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial.mp4")
    count = 0
    writer = None
    size: tuple[int, ...] | None = None
    try:
        for raw in frames:
            frame = _as_rgb(raw, path)
            if writer is None:
                size = frame.shape
                writer = imageio_ffmpeg.write_frames(
                    str(tmp), (frame.shape[1], frame.shape[0]), fps=fps, codec="libx264",
                    pix_fmt_in="rgb24", pix_fmt_out="yuv420p", macro_block_size=1,
                    output_params=params, ffmpeg_log_level="error")
                writer.send(None)
            elif frame.shape != size:
                raise VideoError(f"{path}: frame {count} is {frame.shape}, the first was {size}")
            writer.send(np.ascontiguousarray(frame))
            count += 1
        if writer is None:
            raise VideoError(f"{path}: no frames to write")
        writer.close()
        writer = None
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:
        raise VideoError(f"{path}: ffmpeg could not write the video: {exc}") from exc
    finally:
        if writer is not None:
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass
        tmp.unlink(missing_ok=True)
    return count


def read_mp4_metadata(path: Path) -> dict[str, str]:
    """The metadata tags of an MP4 written by ``write_mp4`` (ffmpeg's ffmetadata dump).

    Raises:
        VideoError: the file is missing or ffmpeg cannot read it.
    """
    import imageio_ffmpeg

    path = Path(path)
    if not path.is_file():
        raise VideoError(f"{path}: no such video")
    proc = subprocess.run(
        [imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", str(path), "-f", "ffmetadata", "-"],
        capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise VideoError(f"{path}: ffmpeg cannot read it: {proc.stderr.strip()[-300:]}")
    tags: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if line.startswith(";") or "=" not in line or line.startswith("["):
            continue
        key, _, value = line.partition("=")
        tags[key] = value
    return tags


def count_frames(path: Path) -> int:
    """The number of decoded video frames in a file (imageio-ffmpeg's reader: what a viewer sees).

    Raises:
        VideoError: the file is missing or cannot be decoded.
    """
    import imageio_ffmpeg

    path = Path(path)
    if not path.is_file():
        raise VideoError(f"{path}: no such video")
    try:
        reader = imageio_ffmpeg.read_frames(str(path))
        next(reader)  # the header: size, fps, duration
        return sum(1 for _ in reader)
    except (OSError, RuntimeError, StopIteration) as exc:
        raise VideoError(f"{path}: cannot decode it: {exc}") from exc


def read_frames(path: Path, *, max_frames: int) -> Iterator[np.ndarray]:
    """The decoded frames of a video, in order (imageio-ffmpeg's reader).

    Args:
        path: the video file (a caller that read it from a store has checked its sha256 first).
        max_frames: stop with an error past this many frames (the caller's memory cap).

    Yields:
        (H, W, 3) uint8 RGB frames.

    Raises:
        VideoError: the file is missing, cannot be decoded, or holds more than ``max_frames`` frames.
    """
    import imageio_ffmpeg

    path = Path(path)
    if not path.is_file():
        raise VideoError(f"{path}: no such video")
    try:
        reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
        meta = next(reader)
        width, height = meta["size"]
        for count, raw in enumerate(reader):
            if count >= max_frames:
                reader.close()
                raise VideoError(f"{path}: more than {max_frames} frames")
            yield np.frombuffer(raw, dtype=np.uint8).reshape(height, width, 3)
    except (OSError, RuntimeError, StopIteration) as exc:
        raise VideoError(f"{path}: cannot decode it: {exc}") from exc
