"""The web player's wire protocol: every API payload and WebSocket message, as pydantic models.

``PROTOCOL_VERSION`` is in every API payload and in the WebSocket's first server message; the page
refuses to run against another version. Binary WebSocket messages are frames:
``FRAME_MAGIC`` (4 bytes) + uint32 little-endian sequence number + uint32 episode step + JPEG bytes.
"""

from __future__ import annotations

import struct
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

PROTOCOL_VERSION = 1
FRAME_MAGIC = b"GLF1"
#: The agent's observation image of the same step (sent after its screen frame, image observations only).
OBS_MAGIC = b"GLO1"
FRAME_HEADER = struct.Struct("<4sII")


def frame_message(seq: int, t: int, jpeg: bytes, *, magic: bytes = FRAME_MAGIC) -> bytes:
    """A binary frame message: header (magic, seq, episode step) + JPEG bytes."""
    return FRAME_HEADER.pack(magic, seq, t) + jpeg


class Payload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    protocol: int = PROTOCOL_VERSION


class ProjectRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    project: str
    title: str
    description: str = ""
    goals: int = Field(description="Goals in the project.")
    runs: int = Field(description="Runs of those goals in the stores.")


class ProjectsPage(Payload):
    projects: list[ProjectRow]
    stores: dict[str, str] = Field(description="Store URLs the runs were read from (no credentials).")


class GoalRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    goal_id: str
    family: str | None = Field(default=None, description="The goal's family (its id's parent path), None at top level.")
    title: str = ""
    description: str = ""
    env: str = ""
    runs: int = 0
    error: str | None = Field(default=None, description="The contract error when the goal does not validate.")


class ProjectPage(Payload):
    project: str
    title: str
    description: str = ""
    goals: list[GoalRow]


class RunRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    recipe_id: str
    seed: int
    outcome: str | None = Field(description="The latest attempt's terminal outcome; 'running' without a receipt.")
    final_step: int | None = None
    promoted_step: int | None = None
    best_return_mean: float | None = Field(default=None, description="Best evaluation return mean.")
    best_return_ci95: tuple[float, float] | None = Field(
        default=None, description="Normal-approximation 95% interval of that mean (mean ± 1.96 std / sqrt(n)).")
    started_at: str
    duration_s: float | None = Field(default=None, description="Seconds from the first attempt's start to the "
                                                                 "terminal receipt's sealed_at.")


class DatasetRow(BaseModel):
    """One dataset of a goal, as its goal page lists it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    sha256: str = Field(description="The dataset's identity (sha256 of its manifest).")
    agent: str = Field(description="Who chose the actions: RUN:STEP, random, noop, human (device).")
    episodes: int
    steps: int = Field(description="Steps over all episodes.")
    return_mean: float = Field(description="Mean shaped episode return.")
    frames: bool = Field(description="Rendered frames were recorded (MP4 per episode).")
    determinism: str = Field(description="deterministic | sticky | stochastic: whether a replay re-creates it.")
    created_at: str


class GoalPage(Payload):
    project: str
    goal_id: str
    title: str = ""
    error: str | None = None
    runs: list[RunRow]
    datasets: list[DatasetRow] = Field(default_factory=list, description="The goal's datasets in the dataset store.")
    datasets_error: str | None = Field(default=None, description="Why the dataset store could not be read "
                                                                 "(the runs are still listed).")


class EpisodeRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    index: int
    seed: int
    start: str | None = None
    outcome: str
    reason: str
    length: int = Field(description="Steps.")
    return_: float = Field(alias="return", serialization_alias="return", description="Shaped return.")
    raw_return: float
    frames: bool = Field(description="The episode's frames were recorded.")


class DatasetPage(Payload):
    """A dataset and its episodes (``/api/datasets/{name}``)."""

    name: str
    project: str | None
    goal_id: str
    summary: DatasetRow
    provenance: dict[str, Any] = Field(description="The agent (DatasetAgent JSON).")
    episodes: list[EpisodeRow]


class CheckpointRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int
    sha256: str
    purpose: str
    evaluation: str | None = Field(description="accepted | rejected | failed; with no result: running (asked) or "
                                   "queued (not yet asked) while the run is open, deferred (not evaluated) once "
                                   "it is sealed; None for a pinned checkpoint outside any store.")
    return_mean: float | None = None
    promoted: bool = False
    size_bytes: int


class RunPage(Payload):
    run_id: str
    project: str | None
    goal_id: str
    recipe_id: str
    seed: int
    outcome: str | None
    checkpoints: list[CheckpointRow]


class PlaybackPage(Payload):
    run_id: str
    project: str | None
    goal_id: str
    recipe_id: str
    step: int
    sha256: str
    promoted: bool
    previous_step: int | None
    next_step: int | None
    error: str | None = Field(default=None, description="Why this checkpoint cannot be played (contract, integrity).")
    archive: bool = Field(default=False, description="A search checkpoint with an archive of cells "
                                                     "(``/api/runs/{run}/checkpoints/{step}/archive``).")
    sequences: bool = Field(default=False, description="A JERK checkpoint with retained sequences "
                                                       "(``/api/runs/{run}/checkpoints/{step}/sequences``).")


class ArchiveCell(BaseModel):
    """One cell of a search checkpoint's archive (:mod:`gradlab.play.archive`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    key: str
    coordinates: dict[str, int] | None = Field(description="Signal cells: the binned value per cell signal; "
                                                            "frame cells: None.")
    thumbnail: str | None = Field(default=None, description="Frame cells: the downscaled frame, row-major, a "
                                  "pixel as 1 hex digit (up to 16 grey levels) or 2 (ArchivePage.thumbnail_size); "
                                  "None for signal cells and archives written before cells kept one.")
    return_: float = Field(alias="return", description="Shaped return of the best program that reached it.")
    length: int = Field(description="Steps of that program.")
    progress: float
    visits: int
    selections: int
    parent: str | None
    lineage: bool = Field(description="On the best successful trajectory's lineage.")


class ArchiveBest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    return_: float = Field(alias="return")
    length: int
    progress: float
    cell: str | None


class ArchivePage(Payload):
    """A ``gradlab.go_explore`` checkpoint's archive: its cells best first, counts and the best lineage."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    run_id: str
    step: int
    cell_kind: str = Field(description="'signals' (coordinates per cell) or 'frame' (downscaled frames: none).")
    coordinates: list[str] = Field(description="The cell signals, in key order (empty for frame cells).")
    thumbnail_size: list[int] | None = Field(default=None, description="Frame cells: [width, height, grey levels] "
                                             "of each cell's thumbnail; None for signal cells.")
    cell_count: int
    cells_left_out: int = Field(description="Cells past the page's limit (the weakest), not listed.")
    max_cells: int
    visit_count: int
    selection_count: int
    best: ArchiveBest | None = Field(description="The best successful trajectory, None before one is found.")
    lineage: list[str] = Field(description="Cell keys from the start cell to the best trajectory's cell.")
    cells: list[ArchiveCell]


class RetainedSequence(BaseModel):
    """One action sequence a ``gradlab.jerk`` checkpoint retained (:mod:`gradlab.play.archive`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(description="``sequence:<rank>``: what ``hello.cell`` names to replay it.")
    rank: int = Field(description="1 is the best (the checkpoint's own program): mean score, then fewer steps.")
    length: int = Field(description="Steps of the sequence.")
    replays: int = Field(description="Times it was scored: its first episode and each replay since.")
    return_mean: float = Field(description="Mean of its scores (shaped return where it ends, or at its peak when new).")
    return_last: float
    return_best: float
    successes: int = Field(description="Scorings whose episode ended in success through the whole sequence.")


class SequencesPage(Payload):
    """A ``gradlab.jerk`` checkpoint's retained sequences, best first."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    step: int
    sequence_count: int
    sequences: list[RetainedSequence]


# -- WebSocket -------------------------------------------------------------------------------
class Hello(BaseModel):
    """The client's first WebSocket message: the token and what to play."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["hello"]
    protocol: int
    token: str
    run_id: str
    step: int
    seed: int | None = Field(default=None, ge=0, description="None: the launch's --seed.")
    deterministic: bool | None = Field(default=None, description="None: the launch's mode.")
    fps: float | None = Field(default=None, ge=0.0, le=1000.0, description="None: the launch's --fps.")
    cell: str | None = Field(default=None, min_length=1, max_length=512,
                             description="Replay this archive cell's program (gradlab.go_explore checkpoints) "
                                         "or this retained sequence (sequence:<rank>, gradlab.jerk checkpoints) "
                                         "instead of the checkpoint's own.")


class Command(BaseModel):
    """A control message from the page."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["play", "pause", "step", "reset", "fps", "mode"]
    n: int = Field(default=1, ge=1, le=10000, description="step: how many steps.")
    seed: int | None = Field(default=None, ge=0, description="reset: the episode seed (None = the current one).")
    fps: float | None = Field(default=None, ge=0.0, le=1000.0, description="fps: 0 = as fast as possible.")
    deterministic: bool | None = None


class Ready(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["ready"] = "ready"
    protocol: int = PROTOCOL_VERSION
    run_id: str
    step: int
    goal_id: str
    env_id: str
    checkpoint_sha256: str
    action_meanings: list[str]
    gamma: float
    signals: list[str]
    events: list[str]
    seed: int
    deterministic: bool
    fps: float
    worker_pid: int | None = Field(default=None, description="The playback worker's process id (shown in the page).")
    screen: str = Field(default="render", description="What the frames show: 'colour screen' (kept apart from the "
                                                      "observation, ALE) or the provider's 'render'.")
    program: dict[str, Any] | None = Field(default=None, description="An action program's replay: {'length': steps, "
                                           "'cell': archive cell key or None}; None for a network policy.")


class StepMessage(BaseModel):
    """Telemetry of one step; the binary frame with the same ``seq`` follows it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["step"] = "step"
    seq: int
    t: int
    probs: list[float] | None
    action: Any
    value: float | None = Field(description="V(s) after the step; None for an action program (it has no value).")
    value_acted: float | None
    reward_raw: float
    reward_shaped: float
    episode_return: float
    episode_raw_return: float
    signals: dict[str, Any]
    events: list[str]
    episode: dict[str, Any] | None
    obs: list[float | None] | None = Field(default=None, description="A small vector observation after the step; "
                                                                     "image observations come as OBS_MAGIC frames.")
    reward_components: dict[str, float] = Field(
        default_factory=dict, description="Reward component -> its part of this step's task reward (before "
        "reward_scale and clipping); empty when the reward is the native reward alone.")


class StateMessage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["state"] = "state"
    playing: bool
    fps: float
    deterministic: bool
    seed: int


class ErrorMessage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["error"] = "error"
    message: str


# -- human play (/api/human) -------------------------------------------------------------------
class HumanHello(BaseModel):
    """The first message of a human-play WebSocket: the token, the goal, and what to record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["hello"]
    protocol: int
    token: str
    goal_id: str
    dataset: str | None = Field(default=None, description="Record the episodes into this new dataset (None: "
                                                          "play without recording).")
    episodes: int = Field(default=1, ge=1, le=1000, description="Episodes to record before the dataset lands.")
    frames: bool = Field(default=True, description="Also record each episode's rendered frames (MP4).")
    seed: int | None = Field(default=None, ge=0, description="Without a dataset: the first episode's seed "
                                                             "(None: the launch's --seed).")
    fps: float | None = Field(default=None, gt=0.0, le=240.0, description="Real-time goals: steps per second "
                                                                          "(None: HUMAN_FPS).")


class KeysCommand(BaseModel):
    """The keys the person holds now (``KeyboardEvent.key`` values, in press order); ``press``: this
    message is a key press (a turn-based goal steps once on it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["keys"]
    held: list[Annotated[str, Field(max_length=32)]] = Field(default_factory=list, max_length=16)
    press: bool = False


class HumanReady(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["ready"] = "ready"
    protocol: int = PROTOCOL_VERSION
    goal_id: str
    env_id: str
    action_meanings: list[str]
    keymap: list[dict[str, Any]] = Field(description="One row per action: {action, meaning, keys, labels, noop} "
                                         "(gradlab.play.human.KeyMap.as_json).")
    mode: Literal["realtime", "turn"]
    noop: int | None
    fps: float = Field(description="Real-time goals: steps per second.")
    seed: int
    worker_pid: int | None = None
    screen: str = "render"
    recording: dict[str, Any] | None = Field(default=None, description="{dataset, episodes, landed, published}; "
                                             "None when not recording.")


# -- recorded episodes (/api/replay) ---------------------------------------------------------------
class ReplayHello(BaseModel):
    """The first message of a replay WebSocket: the token and the recorded episode to show."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["hello"]
    protocol: int
    token: str
    dataset: str = Field(max_length=200)
    episode: int = Field(ge=0)


class ReplayCommand(BaseModel):
    """Ask for recorded frames ``start .. start + n - 1``; each comes back as a binary frame message
    whose sequence number and step are both ``t``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["frames"]
    start: int = Field(ge=0)
    n: int = Field(default=16, ge=1, le=64)


class ReplayReady(BaseModel):
    """A recorded episode, loaded (gradlab.play.replay.ReplaySession.info): everything but its frames."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["ready"] = "ready"
    protocol: int = PROTOCOL_VERSION
    dataset: str
    sha256: str
    episode: int
    episodes: int
    goal_id: str
    env_id: str
    action_meanings: list[str]
    event_names: list[str]
    frames: Literal["recorded", "re-simulated", "none"]
    frames_note: str | None = None
    n_frames: int
    provenance: dict[str, Any]
    steps: dict[str, list[Any]] = Field(description="Per step t: actions, rewards, raw_rewards, returns, "
                                        "raw_returns, terminated, truncated, events (names fired).")
    worker_pid: int | None = None
