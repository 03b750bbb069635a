"""Episodes of a playback session as one MP4 (``gradlab play --record`` and the page's video button).

Frame t of an episode is the state the policy acted on at step t, so an episode of length T gives T
frames. The video goes through :func:`gradlab.video.write_mp4` with the checkpoint sha256, goal,
recipe, seed, policy mode and episode returns in its metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def record_episodes(session: Any, out: Path, *, episodes: int, fps: float, seed: int,
                    on_episode: Callable[[float], None] | None = None) -> tuple[int, list[float]]:
    """Play ``episodes`` episodes from ``reset(seed)`` and write them to ``out``.

    Args:
        session: a :class:`gradlab.play.session.PlaybackSession`.
        out: the ``.mp4`` file (its folder must exist).
        episodes: >= 1. fps: playback speed of the video (> 0). seed: the first episode's seed.
        on_episode: called with each finished episode's return (progress).

    Returns:
        (frames written, episode returns).

    Raises:
        VideoError: ffmpeg could not write the file.
    """
    from gradlab.video import write_mp4

    frames: list[Any] = [session.reset(seed).frame]
    returns: list[float] = []
    while len(returns) < episodes:
        report = session.step()
        if report.episode is not None:
            returns.append(float(report.episode["return"]))
            if on_episode is not None:
                on_episode(returns[-1])
            if len(returns) < episodes:
                frames.append(report.frame)  # the next episode's first frame
        else:
            frames.append(report.frame)
    spec = session.run_spec
    count = write_mp4(out, frames, fps=fps, metadata={
        "checkpoint_sha256": session.manifest.sha256, "checkpoint_step": session.manifest.step,
        "run_id": spec.run_id, "goal": spec.goal_id, "recipe": spec.recipe_id, "seed": seed,
        "episodes": episodes, "policy": "deterministic" if session.deterministic else "stochastic",
        "return": ",".join(f"{r:g}" for r in returns),
    })
    return count, returns
