"""The dataset contract: a named, immutable, content-addressed set of recorded episodes of one goal.

A dataset's ``manifest.json`` (docs/ARCHITECTURE.md section 12) says what was recorded, under which
goal and environment contract, by which agent, and lists every file with its sha256 and size, as a
checkpoint's manifest does. Format ``gradlab.dataset/2``: per chunk of the recording one shard
``episodes/chunk-<chunk:05d>.npz`` holds the steps of all of the chunk's episodes, one after another
(arrays below, concatenated along the first axis; ``T`` = an episode's length); an episode's
``step_offset`` is the row of its first step and ``observation_offset`` the row of its first
observation (an episode has ``T`` step rows and ``T + 1`` observation rows). ``event_names`` is
stored once per shard. ``frames/<index:06d>.mp4`` holds an episode's rendered frames when recorded.
Format ``gradlab.dataset/1`` (read, no longer written): one ``episodes/<index:06d>.npz`` per
episode, no offsets. :func:`gradlab.datasets.store.load_steps` gives one episode's arrays either way:

==================  ====================  ===========================================================
array               shape, dtype          meaning
==================  ====================  ===========================================================
``actions``         (T, *action_shape)    the action of each step in the goal's action space (the
                                          provider-native action, unless the environment has an
                                          action profile: then the profile action's index, int64)
``native_actions``  (T, *native_shape)    with an action profile only: the provider-native action
                                          each profile action became (stable-retro's buttons, ALE's
                                          full-set action, ViZDoom's button vector)
``rewards``         (T,) float32          the task program's shaped reward
``raw_rewards``     (T,) float32          the provider's native reward
``terminated``      (T,) bool             the episode ended for good at this step
``truncated``       (T,) bool             the episode was cut at this step (never with terminated)
``events``          (T, E) bool           which of ``event_names`` fired at each step
``event_names``     (E,) str              the task program's event names, sorted
``observations``    (T + 1, *obs_shape)   the observation before each step, then the final one
==================  ====================  ===========================================================

The dataset's identity (:attr:`DatasetManifest.sha256`) is the sha256 of the manifest's canonical JSON
without ``recording_id`` and ``created_at`` (which recording wrote the files, and when: not what was
recorded), so the same episodes recorded twice under the same name have the same sha256 (format 1:
the whole manifest).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from gradlab.contracts.base import Contract
from gradlab.contracts.hashing import sha256_json
from gradlab.contracts.task import Outcome

DATASET_FORMAT = "gradlab.dataset/2"
#: Formats read; only :data:`DATASET_FORMAT` is written.
DatasetFormat = Literal["gradlab.dataset/1", "gradlab.dataset/2"]
#: Manifest keys outside the dataset's identity (format 2).
UNHASHED_KEYS = ("recording_id", "created_at")
#: Agents a dataset can come from: a checkpoint's policy, the reference policies, a person.
AgentKind = Literal["checkpoint", "random", "noop", "human"]
#: How far a dataset can be re-simulated: ``deterministic`` (same seed + actions give the same
#: episode, bit for bit), ``sticky`` (the provider repeats actions at random: ALE's
#: ``repeat_action_probability`` > 0), ``stochastic`` (any other randomness outside the recorded actions).
Determinism = Literal["deterministic", "sticky", "stochastic"]


class DatasetFile(Contract):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size_bytes: int = Field(ge=0)


class DatasetAgent(Contract):
    """Who chose the actions."""

    kind: AgentKind
    checkpoint_sha256: str | None = Field(default=None, description="The policy file's sha256 (kind checkpoint).")
    checkpoint_step: int | None = Field(default=None, ge=0)
    run_id: str | None = None
    publication: str | None = Field(default=None, description="Where the checkpoint was read: a store URL, "
                                    "hf://OWNER/NAME or a folder.")
    policy_mode: Literal["deterministic", "stochastic"] | None = None
    input_device: str | None = Field(default=None, description="kind human: keyboard, gamepad...")


class DatasetEpisode(Contract):
    """One recorded episode: its manifest identity and what happened."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    index: int = Field(ge=0, description="Position in the recording's episode plan.")
    seed: int = Field(ge=0, lt=2**32, description="Reset seed.")
    start: str | None = None
    return_: float = Field(alias="return", description="Shaped return (task program reward), summed.")
    raw_return: float
    length: int = Field(ge=1, description="Steps.")
    outcome: Outcome
    reason: str
    steps_file: str = Field(description="Path of the .npz holding the episode's steps inside the dataset "
                            "(format 2: its chunk's shard).")
    step_offset: int | None = Field(default=None, ge=0, description="Format 2: row of the episode's first step "
                                    "in steps_file (None in format 1: the file is the episode's alone).")
    observation_offset: int | None = Field(default=None, ge=0, description="Format 2: row of its first "
                                           "observation in steps_file.")
    frames_file: str | None = Field(default=None, description="Path of its .mp4, when frames were recorded.")


class DatasetManifest(Contract):
    """``manifest.json`` of a dataset (see the module docstring)."""

    format: DatasetFormat = DATASET_FORMAT
    name: str
    recording_id: str = Field(description="The recording that wrote the files (their key prefix).")
    goal_id: str
    goal: dict[str, Any] = Field(description="The goal contract JSON the episodes were recorded under.")
    environment: dict[str, Any] = Field(description="The environment contract JSON (one lane).")
    goal_contract_sha256: str
    environment_sha256: str
    episode_plan_sha256: str = Field(description="sha256 of the planned (index, seed, start) list.")
    determinism: Determinism
    agent: DatasetAgent
    episodes: list[DatasetEpisode]
    frames: bool
    observation_space: dict[str, Any] = Field(description="{type, shape, dtype[, low, high, n]}.")
    action_space: dict[str, Any]
    native_action_space: dict[str, Any] | None = Field(
        default=None, description="With an action profile: the provider's native action space (the "
        "native_actions array); None without one (and then left out of the manifest and its sha256).")
    files: dict[str, DatasetFile]
    versions: dict[str, str]
    created_at: str

    @model_validator(mode="after")
    def _offsets_match_the_format(self) -> DatasetManifest:
        with_offsets = self.format != "gradlab.dataset/1"
        for i, e in enumerate(self.episodes):
            if (e.step_offset is not None and e.observation_offset is not None) != with_offsets or \
                    (e.step_offset is None) != (e.observation_offset is None):
                raise ValueError(f"episodes[{i}]: step_offset and observation_offset are "
                                 + ("required in " if with_offsets else "not part of ") + self.format)
        return self

    @property
    def sha256(self) -> str:
        """The dataset's identity (see the module docstring)."""
        doc = self.as_json()
        if self.format != "gradlab.dataset/1":
            for key in UNHASHED_KEYS:
                doc.pop(key)
        return sha256_json(doc)

    def as_json(self) -> dict[str, Any]:
        doc = self.model_dump(mode="json", by_alias=True)
        if doc.get("native_action_space") is None:  # datasets without a profile keep their identity
            doc.pop("native_action_space", None)
        if self.format == "gradlab.dataset/1":  # as format 1 wrote it (its sha256 stays)
            for episode in doc["episodes"]:
                del episode["step_offset"], episode["observation_offset"]
        return doc
