"""Replay videos of manifest episodes (``gradlab eval --video``, publication's ``replay.mp4``).

Each recorded episode is replayed alone on a one-lane copy of the evaluation environment, reset
with the manifest episode's seed (and start), so under a deterministic policy it is the episode
the evaluation ran (lanes are independent). One frame is rendered before every action, so the
video has exactly ``length`` frames. Frames are spooled to a temporary file while the episode
runs (a CartPole episode is ~360 MB of raw frames) and then encoded by :func:`gradlab.video.write_mp4`
with the provenance as MP4 tags: ``checkpoint_sha256``, ``checkpoint_step``, ``run_id``,
``goal_id``, ``episode_index``, ``seed``, ``start``, ``policy``, ``return``, ``length``,
``outcome``, ``evaluation_return`` (the evaluation row's return) and ``replay_matches_evaluation``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.evaluation.manifest import EpisodeIdentity
from gradlab.evaluation.result import EpisodeRow

DEFAULT_FPS = 30.0


@dataclass(frozen=True)
class RecordedEpisode:
    """One written video: its path, frame count and the replayed episode's return and length."""

    path: Path
    frames: int
    return_: float
    length: int
    outcome: str
    matches_evaluation: bool | None


def _spooled_frames(spool: Any, shape: tuple[int, ...], count: int) -> Iterator[np.ndarray]:
    size = int(np.prod(shape))
    spool.seek(0)
    for _ in range(count):
        yield np.frombuffer(spool.read(size), dtype=np.uint8).reshape(shape)


def record_episode(policy: Any, *, environment: EnvironmentSpec, episode: EpisodeIdentity, deterministic: bool,
                   rng: np.random.Generator, path: Path, metadata: Mapping[str, object],
                   row: EpisodeRow | None = None, fps: float = DEFAULT_FPS, max_steps: int = 1_000_000) -> RecordedEpisode:
    """Replay one manifest episode with rendering and write it as an MP4.

    Args:
        policy: ``act(obs (1, *obs_shape), *, deterministic, rng) -> (1,) actions``.
        environment: the evaluation environment (its lane count is replaced by 1).
        episode: the manifest identity (seed, start) to replay.
        rng: action-sampling generator (stochastic policies).
        path: the ``.mp4`` to write. metadata: extra tags (checkpoint sha256, goal, ...).
        row: the evaluation's row for this episode, to record whether the replay matches it.

    Raises:
        gradlab.video.VideoError: ffmpeg failed. ContractViolation: the episode did not end within
        ``max_steps``.
    """
    from gradlab.envs import make_vector_env
    from gradlab.errors import ContractViolation
    from gradlab.video import write_mp4

    venv = make_vector_env(environment.model_copy(update={"n_envs": 1}), seed=0, lane_seeds=[episode.seed],
                           render_mode="rgb_array")
    shape: tuple[int, ...] | None = None
    frames = 0
    record = None
    with tempfile.TemporaryFile() as spool:
        try:
            if episode.start is not None:
                venv.set_next_start(0, episode.start)
            obs = venv.reset()
            for _ in range(max_steps):
                frame = np.ascontiguousarray(venv.render()[0], dtype=np.uint8)
                shape = shape or frame.shape
                spool.write(frame.tobytes())
                frames += 1
                res = venv.step(np.asarray(policy.act(obs, deterministic=deterministic, rng=rng)))
                obs = res.obs
                if res.episodes:
                    record = res.episodes[0]
                    break
        finally:
            venv.close()
        if record is None:
            raise ContractViolation(f"episode {episode.index} (seed {episode.seed}) did not end within {max_steps} steps")
        matches = None
        if row is not None:
            matches = (row.length, row.outcome) == (record.length, record.outcome) and \
                abs(row.return_ - record.return_) <= 1e-6 * max(1.0, abs(row.return_))
        tags: dict[str, object] = {
            **metadata, "episode_index": episode.index, "seed": episode.seed, "start": episode.start or "",
            "policy": "deterministic" if deterministic else "stochastic", "return": repr(float(record.return_)),
            "length": record.length, "outcome": record.outcome,
        }
        if row is not None:
            tags.update(evaluation_return=repr(float(row.return_)), replay_matches_evaluation=str(matches).lower())
        written = write_mp4(path, _spooled_frames(spool, shape, frames), fps=fps, metadata=tags)  # type: ignore[arg-type]
    return RecordedEpisode(path=Path(path), frames=written, return_=float(record.return_), length=record.length,
                           outcome=record.outcome, matches_evaluation=matches)


def record_evaluation_videos(policy: Any, *, result: Any, goal: Any, environment: EnvironmentSpec, out_dir: Path,
                             count: int, metadata: Mapping[str, object], prefix: str) -> list[RecordedEpisode]:
    """Record the first ``count`` manifest episodes of an evaluation into ``out_dir``.

    Files: ``<prefix>__ep<index:04d>.mp4``. The action mode is the result's; the sampling
    generator is the evaluation's (seeded from the manifest hash).
    """
    from gradlab.evaluation.manifest import build_manifest
    from gradlab.evaluation.runner import policy_rng

    manifest = build_manifest(goal, episodes=result.planned)
    rows = {r.index: r for r in result.episodes}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    deterministic = result.policy == "deterministic"
    rng = policy_rng(manifest)
    tags = {"checkpoint_sha256": result.checkpoint_sha256, "checkpoint_step": result.checkpoint_step,
            "run_id": result.run_id or "", "goal_id": result.goal_id, **metadata}
    return [record_episode(policy, environment=environment, episode=ident, deterministic=deterministic, rng=rng,
                           path=out_dir / f"{prefix}__ep{ident.index:04d}.mp4", metadata=tags, row=rows.get(ident.index))
            for ident in manifest.episodes[:count]]
