"""Playback of a recorded dataset episode (``gradlab dataset play``, ``/datasets/{name}/episodes/{k}``).

The server side (:func:`prepare_replay`) reads the dataset's manifest, checks the episode exists and
makes the verified local copy (:func:`gradlab.datasets.store.fetch_dataset`: every file against the
manifest's sha256). The playback worker (:mod:`gradlab.play.worker`) then runs a
:class:`ReplaySession` over that copy: it re-reads the copy's ``manifest.json`` and refuses it unless
its identity is the sha256 the server verified, reads the steps with
:func:`gradlab.datasets.store.load_steps`, and takes the episode's frames

* ``recorded``: decoded from its MP4 (``frames_file``), whose bytes are checked against the
  manifest's sha256 right before they are decoded (from a private copy of exactly those bytes);
* ``re-simulated``: when the dataset was recorded without frames and its goal is deterministic,
  rendered from a one-lane copy of the recorded environment reset with the episode's seed (and
  start) and stepped with the recorded actions, as ``gradlab dataset verify`` replays it;
* ``none``: otherwise (sticky or stochastic goals: the frames cannot be re-created), said on the page.

Frame ``t`` is the screen before the episode's action ``t`` (``t`` in ``[0, T)``), as the recorder
writes them. docs/ARCHITECTURE.md section 12.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.contracts.dataset import DatasetAgent, DatasetEpisode, DatasetManifest
from gradlab.errors import ContractViolation, IntegrityError, NotFound

#: Frames one episode may hold in a worker (JPEG-encoded; ALE's cap is 27,000 agent steps).
MAX_REPLAY_FRAMES = 30_000
#: Frames one ``frames`` request may ask for.
MAX_FRAMES_PER_REQUEST = 64


def dataset_cache(settings: Any) -> Path:
    """Where verified local copies of datasets are kept: ``$GRADLAB_HOME/cache/datasets``."""
    return Path(settings.home) / "cache" / "datasets"


def agent_label(agent: DatasetAgent) -> str:
    """Who chose the actions, in a few words: ``RUN:STEP`` for a checkpoint, else the agent kind."""
    if agent.kind == "checkpoint":
        return f"{agent.run_id}:{agent.checkpoint_step}" if agent.run_id else f"checkpoint {agent.checkpoint_sha256}"
    if agent.kind == "human" and agent.input_device:
        return f"human ({agent.input_device})"
    return agent.kind


def episode_of(manifest: DatasetManifest, index: int) -> DatasetEpisode:
    """The episode of ``manifest`` with ``index``.

    Raises:
        NotFound: no such episode (the message names the dataset and the valid range).
    """
    for episode in manifest.episodes:
        if episode.index == index:
            return episode
    indices = [e.index for e in manifest.episodes]
    span = f"{min(indices)}..{max(indices)}" if indices else "none"
    raise NotFound(f"dataset {manifest.name!r}: no episode {index} (expected an episode index in {span}, "
                   f"{len(indices)} episodes)")


def prepare_replay(settings: Any, name: str, index: int) -> tuple[DatasetManifest, Path]:
    """The manifest and the verified local copy of dataset ``name``, checking that episode ``index`` exists.

    Raises:
        NotFound: no such dataset in the configured dataset store, or no such episode.
        ContractViolation: the manifest does not validate (naming the key path), or the episode's
            offsets do not fit its shard (naming the file), as ``verify`` and ``export`` refuse it.
        IntegrityError: a stored file differs from the manifest (naming it).
    """
    from gradlab.datasets.store import fetch_dataset, load_steps, read_dataset
    from gradlab.stores import open_dataset_store

    store = open_dataset_store(settings)
    manifest = read_dataset(store, name)
    episode = episode_of(manifest, index)
    folder = fetch_dataset(store, manifest, dataset_cache(settings))
    load_steps(folder, episode)  # before serving: the episode's rows must be in its shard
    return manifest, folder


def _action_meanings(environment: Any, action_space: dict[str, Any]) -> list[str]:
    """The action meanings of a Discrete action space (:func:`gradlab.play.session.action_meanings`);
    empty for other spaces."""
    from gradlab.play.session import action_meanings

    if action_space.get("type") != "Discrete":
        return []
    return action_meanings(environment, int(action_space.get("n") or 0))


class ReplaySession:
    """One recorded episode, from a verified local copy, for the playback worker.

    Args:
        folder: the copy :func:`prepare_replay` made (``fetch_dataset``'s folder).
        manifest_sha256: the identity of the manifest the server read and verified the copy against.
        index: the episode's index.
        encode: (H, W, 3) uint8 frame -> image bytes (the worker's JPEG encoder); frames are kept encoded.

    Raises:
        IntegrityError: the copy's manifest is not the one verified, or the frames file's bytes differ
            from the manifest's sha256.
        NotFound: no such episode. ContractViolation: the frames file does not hold one frame per step.
        gradlab.video.VideoError: the MP4 cannot be decoded.
    """

    def __init__(self, folder: Path, manifest_sha256: str, index: int, *, encode: Any):
        import json

        from gradlab.contracts.environment import EnvironmentSpec
        from gradlab.datasets.store import load_steps

        folder = Path(folder)
        manifest = DatasetManifest.model_validate(json.loads((folder / "manifest.json").read_text()))
        if manifest.sha256 != manifest_sha256:
            raise IntegrityError(f"{folder / 'manifest.json'}: sha256 {manifest.sha256}, the verified dataset's "
                                 f"is {manifest_sha256}")
        self.manifest = manifest
        self.episode = episode_of(manifest, index)
        self.steps = load_steps(folder, self.episode)
        self.env_spec = EnvironmentSpec.model_validate(manifest.environment).model_copy(update={"n_envs": 1})
        self.action_meanings = _action_meanings(self.env_spec, manifest.action_space)
        length = len(self.steps["actions"])
        if self.episode.frames_file is not None:
            frames = self._recorded(folder, self.episode.frames_file, length, encode)
            self.frames_source, self.frames_note = "recorded", None
        elif manifest.determinism == "deterministic":
            frames, diverged = self._resimulated(length, encode)
            self.frames_source = "re-simulated"
            self.frames_note = ("re-simulated from the episode's seed and recorded actions (the dataset was "
                                "recorded without frames)" + (f"; the re-simulation diverges from the recording "
                                                              f"at step {diverged}" if diverged is not None else ""))
        else:
            frames = []
            self.frames_source = "none"
            why = ("its goal repeats actions at random (sticky actions)" if manifest.determinism == "sticky"
                   else "its goal draws randomness the recorded actions do not hold")
            self.frames_note = (f"no frames: the dataset was recorded without frames (--no-frames), and {why}, "
                                "so they cannot be re-simulated")
        self._jpegs: list[bytes] = frames

    def _recorded(self, folder: Path, rel: str, length: int, encode: Any) -> list[bytes]:
        from gradlab.stores import sha256_hex
        from gradlab.video import VideoError, read_frames

        entry = self.manifest.files.get(rel)
        path = folder / rel
        if entry is None:
            raise IntegrityError(f"{path}: the episode's frames file is not listed in the dataset's manifest")
        data = path.read_bytes()
        if sha256_hex(data) != entry.sha256:
            raise IntegrityError(f"{path}: sha256 differs from the manifest's {entry.sha256}")
        # ffmpeg reads a file: it decodes a private copy of the bytes just checked, not the path again.
        with tempfile.TemporaryDirectory(prefix="gradlab-replay-") as tmp:
            checked = Path(tmp) / "frames.mp4"
            checked.write_bytes(data)
            try:
                frames = [encode(f) for f in read_frames(checked, max_frames=min(length, MAX_REPLAY_FRAMES))]
            except VideoError as e:
                raise VideoError(str(e).replace(str(checked), str(path))) from None
        if len(frames) != length:
            raise ContractViolation(f"{path}: {len(frames)} frames, the episode has {length} steps "
                                    "(expected one frame before every action)")
        return frames

    def _resimulated(self, length: int, encode: Any) -> tuple[list[bytes], int | None]:
        """Render the episode again: frame t before action t; the first step whose reward or end flags
        differ from the recording (None when none does)."""
        from gradlab.envs import make_vector_env

        if length > MAX_REPLAY_FRAMES:
            raise ContractViolation(f"episode {self.episode.index}: {length} steps, more than the "
                                    f"{MAX_REPLAY_FRAMES} frames a replay holds")
        venv = make_vector_env(self.env_spec, seed=0, lane_seeds=[self.episode.seed], render_mode="rgb_array")
        diverged = None
        try:
            if self.episode.start is not None:
                venv.set_next_start(0, self.episode.start)
            venv.reset()
            frames = [encode(venv.render()[0])]
            actions = self.steps["actions"]
            for t in range(length):
                res = venv.step(np.asarray(actions[t:t + 1]))
                same = (np.float32(res.reward[0]).tobytes() == np.float32(self.steps["rewards"][t]).tobytes()
                        and bool(res.terminated[0]) == bool(self.steps["terminated"][t])
                        and bool(res.truncated[0]) == bool(self.steps["truncated"][t]))
                if not same and diverged is None:
                    diverged = t
                if t + 1 < length:
                    frames.append(encode(venv.render()[0]))
        finally:
            venv.close()
        return frames, diverged

    @property
    def n_frames(self) -> int:
        return len(self._jpegs)

    def frames(self, start: int, n: int) -> list[tuple[int, bytes]]:
        """JPEG frames ``start .. start + n - 1`` (clipped to the episode): ``[(t, jpeg), ...]``.

        Raises:
            ContractViolation: ``n`` outside ``1..MAX_FRAMES_PER_REQUEST`` or ``start`` negative.
        """
        if start < 0 or not 1 <= n <= MAX_FRAMES_PER_REQUEST:
            raise ContractViolation(f"frames: expected start >= 0 and 1 <= n <= {MAX_FRAMES_PER_REQUEST}, "
                                    f"found start {start}, n {n}")
        return [(t, self._jpegs[t]) for t in range(start, min(start + n, len(self._jpegs)))]

    def info(self) -> dict[str, Any]:
        """What the page shows (:class:`gradlab.play.protocol.ReplayReady` without the worker's pid).

        ``steps`` holds per step ``t`` (T values each): ``actions`` (provider-native, as JSON),
        ``rewards`` and ``raw_rewards`` (float, shaped and raw), ``returns`` and ``raw_returns`` (the
        sums up to and including step t), ``terminated``, ``truncated`` (bool) and ``events`` (the
        names that fired at step t).
        """
        s, e, m = self.steps, self.episode, self.manifest
        rewards = np.asarray(s["rewards"], dtype=np.float32)
        raw = np.asarray(s["raw_rewards"], dtype=np.float32)
        names = [str(n) for n in s["event_names"]]
        return {
            "dataset": m.name, "sha256": m.sha256, "episode": e.index, "episodes": len(m.episodes),
            "goal_id": m.goal_id, "env_id": self.env_spec.env_id, "action_meanings": self.action_meanings,
            "event_names": names, "frames": self.frames_source, "frames_note": self.frames_note,
            "n_frames": self.n_frames,
            "provenance": {"agent": agent_label(m.agent), **m.agent.model_dump(mode="json"),
                           "seed": e.seed, "start": e.start, "outcome": e.outcome, "reason": e.reason,
                           "length": e.length, "return": e.return_, "raw_return": e.raw_return,
                           "determinism": m.determinism, "recording_id": m.recording_id, "created_at": m.created_at},
            "steps": {
                "actions": np.asarray(s["actions"]).tolist(),
                "rewards": [float(x) for x in rewards], "raw_rewards": [float(x) for x in raw],
                "returns": [float(x) for x in np.cumsum(rewards, dtype=np.float64)],
                "raw_returns": [float(x) for x in np.cumsum(raw, dtype=np.float64)],
                "terminated": [bool(x) for x in s["terminated"]], "truncated": [bool(x) for x in s["truncated"]],
                "events": [[names[j] for j in np.flatnonzero(row)] for row in np.asarray(s["events"], dtype=bool)],
            },
        }

    def close(self) -> None:
        self._jpegs = []
