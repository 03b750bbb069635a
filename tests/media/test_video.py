"""The shared MP4 writer: frame count and provenance tags read back by imageio and ffmpeg."""

from __future__ import annotations

import imageio.v2 as imageio
import numpy as np
import pytest

from gradlab.video import VideoError, count_frames, read_mp4_metadata, write_mp4


def _frames(n: int, h: int = 21, w: int = 33) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 255, size=(h, w, 3), dtype=np.uint8) for _ in range(n)]


def test_write_mp4_frames_and_metadata(tmp_path):
    out = tmp_path / "ep.mp4"
    meta = {"checkpoint_sha256": "ab" * 32, "goal": "CartPole-v1", "seed": 7, "episode_return": 12.5}
    assert write_mp4(out, _frames(17), fps=30, metadata=meta) == 17
    assert count_frames(out) == 17
    reader = imageio.get_reader(str(out))  # a person's viewer opens it
    assert sum(1 for _ in reader) == 17
    tags = read_mp4_metadata(out)
    assert tags["checkpoint_sha256"] == "ab" * 32
    assert tags["goal"] == "CartPole-v1" and tags["seed"] == "7" and tags["episode_return"] == "12.5"
    assert not list(tmp_path.glob(".*partial*"))


def test_write_mp4_refuses_bad_input(tmp_path):
    with pytest.raises(VideoError, match="no frames"):
        write_mp4(tmp_path / "a.mp4", [], fps=30, metadata={})
    with pytest.raises(VideoError, match="metadata key"):
        write_mp4(tmp_path / "a.mp4", _frames(2), fps=30, metadata={"Bad Key": 1})
    with pytest.raises(VideoError, match="frame 1"):
        write_mp4(tmp_path / "a.mp4", [_frames(1)[0], _frames(1, h=10)[0]], fps=30, metadata={})
    assert not (tmp_path / "a.mp4").exists()
