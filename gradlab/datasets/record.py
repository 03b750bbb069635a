"""Recording: one chunk of a dataset's episode plan run by the evaluation runner, every step kept.

A chunk is a slice of the recording's episode plan (a goal's evaluation manifest, docs/ARCHITECTURE.md
section 7). :func:`record_chunk` runs it with :func:`gradlab.evaluation.runner.run_episodes`, the
evaluation's own loop and quota rule (each lane runs its quota of episodes; an episode a lane runs
beyond its quota is discarded), and an :class:`EpisodeRecorder` observing every step, which writes
each kept episode as ``episodes/<index:06d>.npz`` (+ ``frames/<index:06d>.mp4``) under the chunk's
staging folder. :func:`record_chunk_json` is the worker job the local evaluation workers run
(:meth:`gradlab.evaluation.backends.LocalBackend.submit_job`).
"""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.datasets.plan import ChunkResult, RecordingPlan
from gradlab.evaluation.manifest import EpisodeIdentity, EpisodeManifest
from gradlab.evaluation.result import EpisodeRow

#: The worker job of one chunk (``LocalBackend.submit_job``).
CHUNK_ENTRY = "gradlab.datasets.record:record_chunk_json"
FRAMES_FPS = 30.0


def steps_file(index: int) -> str:
    return f"episodes/{index:06d}.npz"


def frames_file(index: int) -> str:
    return f"frames/{index:06d}.mp4"


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Compressed npz written to bytes first, so the same arrays give the same bytes (no pickled objects)."""
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())


class _Lane:
    """One lane's episode so far."""

    def __init__(self, frames: bool):
        self.obs: list[np.ndarray] = []
        self.actions: list[np.ndarray] = []
        self.rewards: list[float] = []
        self.raw: list[float] = []
        self.terminated: list[bool] = []
        self.truncated: list[bool] = []
        self.events: list[list[bool]] = []
        self.final_obs: np.ndarray | None = None
        self.spool = tempfile.TemporaryFile() if frames else None
        self.frame_shape: tuple[int, ...] | None = None
        self.frame_count = 0

    def close(self) -> None:
        if self.spool is not None:
            self.spool.close()


class EpisodeRecorder:
    """A :class:`gradlab.evaluation.runner.StepObserver` that writes every kept episode's steps.

    Args:
        venv: the vector env being stepped (``render()`` is called before every step when ``frames``).
        out_dir: the chunk's staging folder.
        frames: also write each episode's rendered frames as an MP4 (one frame before every action).
        event_names: the task program's events (``(T, E)`` bool per episode).
    """

    def __init__(self, venv: Any, out_dir: Path, *, frames: bool, event_names: list[str]):
        self.venv = venv
        self.out_dir = Path(out_dir)
        self.frames = frames
        self.event_names = sorted(event_names)
        self.lanes = [_Lane(frames) for _ in range(venv.num_envs)]
        self.written: dict[int, tuple[str, str | None]] = {}

    def render(self) -> None:
        """Spool every lane's current frame (call before each step when recording frames)."""
        for lane, frame in zip(self.lanes, self.venv.render(), strict=True):
            frame = np.ascontiguousarray(frame, dtype=np.uint8)
            lane.frame_shape = lane.frame_shape or frame.shape
            lane.spool.write(frame.tobytes())  # type: ignore[union-attr]
            lane.frame_count += 1

    def started(self, obs: np.ndarray) -> None:
        if self.frames:
            self.render()  # every lane's first frame

    def step(self, obs: np.ndarray, actions: np.ndarray, result: Any) -> None:
        for i, lane in enumerate(self.lanes):
            lane.obs.append(np.array(obs[i]))
            lane.actions.append(np.array(actions[i]))
            lane.rewards.append(float(result.reward[i]))
            lane.raw.append(float(result.raw_reward[i]))
            lane.terminated.append(bool(result.terminated[i]))
            lane.truncated.append(bool(result.truncated[i]))
            lane.events.append([bool(result.events[name][i]) if name in result.events else False
                                for name in self.event_names])
            if i in result.final_obs:
                lane.final_obs = np.array(result.final_obs[i])
        if self.frames:
            self.render()  # the next step's frame (a finished lane: its next episode's first frame)

    def ended(self, lane_index: int, row: EpisodeRow | None) -> None:
        lane = self.lanes[lane_index]
        # With frames, the lane's spool holds this episode's frames and the next episode's first one.
        next_frame = self._pop_last_frame(lane) if self.frames else None
        if row is not None:
            self._write(lane, row)
        fresh = _Lane(self.frames)
        if next_frame is not None:
            fresh.frame_shape = lane.frame_shape
            fresh.spool.write(next_frame)  # type: ignore[union-attr]
            fresh.frame_count = 1
        lane.close()
        self.lanes[lane_index] = fresh

    @staticmethod
    def _pop_last_frame(lane: _Lane) -> bytes:
        size = int(np.prod(lane.frame_shape))
        lane.spool.seek(-size, 2)  # type: ignore[union-attr]
        last = lane.spool.read(size)  # type: ignore[union-attr]
        lane.spool.seek(-size, 2)  # type: ignore[union-attr]
        lane.spool.truncate()  # type: ignore[union-attr]
        lane.frame_count -= 1
        return last

    def _frames(self, lane: _Lane) -> Iterator[np.ndarray]:
        size = int(np.prod(lane.frame_shape))
        lane.spool.seek(0)  # type: ignore[union-attr]
        for _ in range(lane.frame_count):
            yield np.frombuffer(lane.spool.read(size), dtype=np.uint8).reshape(lane.frame_shape)  # type: ignore[union-attr]

    def _write(self, lane: _Lane, row: EpisodeRow) -> None:
        final = lane.final_obs if lane.final_obs is not None else lane.obs[-1]
        arrays = {
            "actions": np.stack(lane.actions),
            "rewards": np.asarray(lane.rewards, dtype=np.float32),
            "raw_rewards": np.asarray(lane.raw, dtype=np.float32),
            "terminated": np.asarray(lane.terminated, dtype=bool),
            "truncated": np.asarray(lane.truncated, dtype=bool),
            "events": np.asarray(lane.events, dtype=bool).reshape(len(lane.events), len(self.event_names)),
            "event_names": np.asarray(self.event_names, dtype=str),
            "observations": np.stack([*lane.obs, final]),
        }
        steps = steps_file(row.index)
        write_npz(self.out_dir / steps, arrays)
        frames = None
        if self.frames:
            from gradlab.video import write_mp4

            frames = frames_file(row.index)
            (self.out_dir / frames).parent.mkdir(parents=True, exist_ok=True)
            write_mp4(self.out_dir / frames, self._frames(lane), fps=FRAMES_FPS,
                      metadata={"episode_index": row.index, "seed": row.seed, "length": row.length})
        self.written[row.index] = (steps, frames)

    def close(self) -> None:
        for lane in self.lanes:
            lane.close()


def chunk_manifest(plan: RecordingPlan, chunk: int) -> EpisodeManifest:
    """The chunk's episodes as an evaluation manifest: its own lanes (``min(n_lanes, len(chunk))``),
    episode ``j`` of the chunk on lane ``j % lanes``; indices, seeds and starts are the plan's."""
    episodes = plan.chunks[chunk]
    lanes = min(plan.n_lanes, len(episodes))
    return EpisodeManifest(base_seed=plan.base_seed, n_lanes=lanes, episodes=[
        EpisodeIdentity(index=e.index, lane=j % lanes, seed=e.seed, start=e.start) for j, e in enumerate(episodes)])


def record_chunk(plan: RecordingPlan, chunk: int) -> ChunkResult:
    """Run chunk ``chunk`` of ``plan`` and write its episodes under ``<plan.staging_dir>/chunk-<chunk>/``.

    Returns:
        The chunk's rows and files (paths relative to the chunk folder, with sha256 and size).

    Raises:
        IntegrityError, ContractViolation: the checkpoint does not verify (as ``gradlab eval``).
        ContractViolation: see :func:`gradlab.evaluation.runner.run_episodes`.
    """
    from gradlab.checkpoints.bundle import file_sha256
    from gradlab.contracts.environment import EnvironmentSpec
    from gradlab.datasets.plan import make_policy, space_json
    from gradlab.envs import make_vector_env
    from gradlab.evaluation.runner import policy_rng, run_episodes

    manifest = chunk_manifest(plan, chunk)
    environment = EnvironmentSpec.model_validate(plan.environment)
    out_dir = Path(plan.staging_dir) / f"chunk-{chunk:05d}"
    out_dir.mkdir(parents=True, exist_ok=True)
    queues = manifest.lane_queues()
    venv = make_vector_env(environment.model_copy(update={"n_envs": manifest.n_lanes}), seed=plan.base_seed,
                           lane_seeds=[q[0].seed for q in queues], render_mode="rgb_array" if plan.frames else None)
    try:
        policy = make_policy(plan, venv.single_action_space)
    except BaseException:
        venv.close()
        raise
    recorder = EpisodeRecorder(venv, out_dir, frames=plan.frames, event_names=list(environment.task.events))
    try:
        rows = run_episodes(venv, manifest, policy, deterministic=plan.agent.policy_mode == "deterministic",
                            rng=policy_rng(manifest), observer=recorder)
    finally:
        recorder.close()
        venv.close()
    files = {}
    for steps, frames in recorder.written.values():
        for rel in (steps, frames):
            if rel is not None:
                files[rel] = {"sha256": file_sha256(out_dir / rel), "size_bytes": (out_dir / rel).stat().st_size}
    result = ChunkResult(chunk=chunk, folder=str(out_dir), rows=[r.as_json() for r in rows], files=files,
                         written={str(i): list(w) for i, w in recorder.written.items()},
                         spaces={"observation": space_json(venv.single_observation_space),
                                 "action": space_json(venv.single_action_space)})
    (out_dir / "chunk.json").write_text(json.dumps(result.model_dump(mode="json"), sort_keys=True))
    return result


def record_chunk_json(payload: dict[str, Any]) -> dict[str, Any]:
    """JSON in (``{"plan": RecordingPlan, "chunk": int}``), JSON out (:class:`ChunkResult`): the worker job."""
    plan = RecordingPlan.model_validate(payload["plan"])
    return record_chunk(plan, int(payload["chunk"])).model_dump(mode="json")


def record_chunk_in_worker(plan: RecordingPlan, chunk: int, *, poll_interval_s: float = 0.1) -> ChunkResult:
    """Run :func:`record_chunk` in a local evaluation worker process (a warm spare when one is kept).

    The worker is ended when this call is interrupted (cancelled task, Ctrl-C).

    Raises:
        The worker's error (as :meth:`gradlab.evaluation.backends.LocalBackend.poll`).
    """
    import time

    from gradlab.evaluation.backends import LocalBackend

    backend = LocalBackend(max_workers=1)
    handle = backend.submit_job(CHUNK_ENTRY, {"plan": plan.model_dump(mode="json"), "chunk": chunk},
                                checkpoint_sha256=plan.agent.checkpoint_sha256 or "", checkpoint_step=plan.agent.checkpoint_step or 0)
    try:
        while (answer := backend.poll_json(handle)) is None:
            time.sleep(poll_interval_s)
    finally:
        backend.close()
    return ChunkResult.model_validate(answer)
