"""Recording: one chunk of a dataset's episode plan run by the evaluation runner, every step kept.

A chunk is a slice of the recording's episode plan (a goal's evaluation manifest, docs/ARCHITECTURE.md
section 7). :func:`record_chunk` runs it with :func:`gradlab.evaluation.runner.run_episodes`, the
evaluation's own loop and quota rule (each lane runs its quota of episodes; an episode a lane runs
beyond its quota is discarded), and an :class:`EpisodeRecorder` observing every step, which writes
the chunk's kept episodes into one shard ``episodes/chunk-<chunk:05d>.npz`` (:mod:`gradlab.datasets.shard`)
and, with frames, ``frames/<index:06d>.mp4`` per episode under the chunk's staging folder. :func:`record_chunk_json` is the worker job the local evaluation workers run
(:meth:`gradlab.evaluation.backends.LocalBackend.submit_job`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import TypeAdapter

from gradlab.datasets.plan import ChunkResult, RecordingPlan
from gradlab.evaluation.manifest import EpisodeIdentity, EpisodeManifest
from gradlab.evaluation.result import EpisodeRow

_ROWS = TypeAdapter(list[EpisodeRow])  # every row's JSON in one call

#: The worker job of one chunk (``LocalBackend.submit_job``).
CHUNK_ENTRY = "gradlab.datasets.record:record_chunk_json"
FRAMES_FPS = 30.0


def steps_file(chunk: int) -> str:
    """The chunk's step shard (:mod:`gradlab.datasets.shard`)."""
    return f"episodes/chunk-{chunk:05d}.npz"


def frames_file(index: int) -> str:
    return f"frames/{index:06d}.mp4"


class _Frames:
    """One lane's rendered frames so far, spooled to a temporary file."""

    def __init__(self) -> None:
        self.spool = tempfile.TemporaryFile()
        self.shape: tuple[int, ...] | None = None
        self.count = 0

    def add(self, frame: bytes) -> None:
        self.spool.write(frame)
        self.count += 1

    def pop_last(self) -> bytes:
        size = int(np.prod(self.shape))
        self.spool.seek(-size, 2)
        last = self.spool.read(size)
        self.spool.seek(-size, 2)
        self.spool.truncate()
        self.count -= 1
        return last

    def frames(self) -> Iterator[np.ndarray]:
        size = int(np.prod(self.shape))
        self.spool.seek(0)
        for _ in range(self.count):
            yield np.frombuffer(self.spool.read(size), dtype=np.uint8).reshape(self.shape)  # type: ignore[arg-type]

    def close(self) -> None:
        self.spool.close()


class EpisodeRecorder:
    """A :class:`gradlab.evaluation.runner.StepObserver` that keeps every kept episode's steps.

    Steps are kept as whole-batch arrays (:class:`gradlab.datasets.shard.StepBuffer`), with the
    provider-native action of each step too when the env has an action profile; :meth:`result`
    writes them as the chunk's one shard ``episodes/chunk-<chunk:05d>.npz``. Frames, when recorded,
    go to ``frames/<index:06d>.mp4`` as each episode ends.

    Args:
        venv: the vector env being stepped (``render()`` is called before every step when ``frames``).
        out_dir: the chunk's staging folder.
        frames: also write each episode's rendered frames as an MP4 (one frame before every action).
        event_names: the task program's events (``(T, E)`` bool per episode).
        chunk: the chunk's number (names its shard).
    """

    def __init__(self, venv: Any, out_dir: Path, *, frames: bool, event_names: list[str], chunk: int = 0):
        from gradlab.datasets.shard import StepBuffer
        from gradlab.envs.action_profile import ProfiledBackend

        backend = getattr(venv, "backend", None)
        self.profiled: ProfiledBackend | None = backend if isinstance(backend, ProfiledBackend) else None
        self.venv = venv
        self.out_dir = Path(out_dir)
        self.frames = frames
        self.event_names = sorted(event_names)
        self.steps_file = steps_file(chunk)
        self.buffer = StepBuffer(venv.num_envs, self.event_names,
                                 native=self.profiled.native if self.profiled is not None else None)
        self.lanes = [_Frames() for _ in range(venv.num_envs)] if frames else []
        self.kept: dict[int, int] = {}  # episode index -> its position in the shard
        self.frame_files: dict[int, str] = {}

    def render(self) -> None:
        """Spool every lane's current frame (call before each step when recording frames)."""
        for lane, frame in zip(self.lanes, self.venv.render(), strict=True):
            frame = np.ascontiguousarray(frame, dtype=np.uint8)
            lane.shape = lane.shape or frame.shape
            lane.add(frame.tobytes())

    def started(self, obs: np.ndarray) -> None:
        if self.frames:
            self.render()  # every lane's first frame

    def step(self, obs: np.ndarray, actions: np.ndarray, result: Any) -> None:
        self.buffer.step(obs, actions, result)
        if self.frames:
            self.render()  # the next step's frame (a finished lane: its next episode's first frame)

    def ended(self, lane_index: int, row: EpisodeRow | None) -> None:
        position = self.buffer.ended(lane_index, row is not None)
        if row is not None:
            self.kept[row.index] = position  # type: ignore[assignment]
        if not self.frames:
            return
        # The lane's spool holds this episode's frames and the next episode's first one.
        lane = self.lanes[lane_index]
        next_frame = lane.pop_last()
        if row is not None:
            from gradlab.video import write_mp4

            rel = frames_file(row.index)
            (self.out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            write_mp4(self.out_dir / rel, lane.frames(), fps=FRAMES_FPS,
                      metadata={"episode_index": row.index, "seed": row.seed, "length": row.length})
            self.frame_files[row.index] = rel
        fresh = _Frames()
        fresh.shape = lane.shape
        fresh.add(next_frame)
        lane.close()
        self.lanes[lane_index] = fresh

    def result(self, chunk: int, rows: list[EpisodeRow], spaces: dict[str, dict[str, Any]]) -> ChunkResult:
        """Write the shard and describe the chunk's files (sha256 and size of each, read back).

        Raises:
            ContractViolation: no episode was kept, or a field changed dtype or shape between steps.
        """
        from gradlab.checkpoints.bundle import file_sha256
        from gradlab.datasets.plan import space_json

        if self.profiled is not None:
            spaces = {**spaces, "native_action": space_json(self.profiled.inner.single_action_space)}
        offsets, digest, size = self.buffer.write(self.out_dir / self.steps_file)
        files = {self.steps_file: {"sha256": digest, "size_bytes": size}}
        for rel in sorted(self.frame_files.values()):
            path = self.out_dir / rel
            files[rel] = {"sha256": file_sha256(path), "size_bytes": path.stat().st_size}
        # Built from this recorder's own typed values, so not validated again (the reader validates).
        return ChunkResult.model_construct(
            chunk=chunk, folder=str(self.out_dir), rows=_ROWS.dump_python(rows, mode="json", by_alias=True), files=files,
            written={str(i): [self.steps_file, self.frame_files.get(i)] for i in sorted(self.kept)},
            offsets={str(i): [offsets[p][0], offsets[p][1]] for i, p in sorted(self.kept.items())}, spaces=spaces)

    def close(self) -> None:
        self.buffer.close()
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
    recorder = EpisodeRecorder(venv, out_dir, frames=plan.frames, event_names=list(environment.task.events), chunk=chunk)
    try:
        rows = run_episodes(venv, manifest, policy, deterministic=plan.agent.policy_mode == "deterministic",
                            rng=policy_rng(manifest), observer=recorder)
        result = recorder.result(chunk, rows, {"observation": space_json(venv.single_observation_space),
                                               "action": space_json(venv.single_action_space)})
    finally:
        recorder.close()
        venv.close()
    (out_dir / "chunk.json").write_text(result.model_dump_json())  # the chunk is staged
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
