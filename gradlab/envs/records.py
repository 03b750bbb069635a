"""Plain records that cross the vector-env boundary: one finished episode, one vector step.

Dataclasses, not pydantic models: they are built in the stepping loop, thousands of times a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: ``seed`` in :meth:`EpisodeRecord.as_gym_info` for an episode whose reset named no seed.
NO_SEED = -1


@dataclass(frozen=True)
class EpisodeRecord:
    """One finished episode of one lane, as the task program saw it.

    Attributes:
        lane: lane index in its vector env.
        seed: the seed its reset used, or None when the lane continued its own RNG stream.
        return_: sum of shaped (task-program) rewards, float.
        raw_return: sum of the provider's native rewards, float.
        length: policy steps in the episode (frame skip stays inside the environment).
        outcome: "success" | "failure" | "timeout" | "ended".
        reason: the event name that decided the outcome, or "max_episode_steps",
            "native_terminated", "native_time_limit".
        progress: last value of each ``task.progress`` signal.
        start: the named start state its reset used (:meth:`gradlab.envs.vector.VectorEnv.set_next_start`),
            or None for the environment's default start.
    """

    lane: int
    seed: int | None
    return_: float
    raw_return: float
    length: int
    outcome: str
    reason: str
    progress: dict[str, float] = field(default_factory=dict)
    start: str | None = None

    def as_json(self) -> dict[str, Any]:
        """``{"lane","seed","return","raw_return","length","outcome","reason","progress"}``, plus
        ``"start"`` when the episode began from a named start state."""
        out = {
            "lane": self.lane, "seed": self.seed, "return": self.return_, "raw_return": self.raw_return,
            "length": self.length, "outcome": self.outcome, "reason": self.reason, "progress": dict(self.progress),
        }
        if self.start is not None:
            out["start"] = self.start
        return out

    def as_gym_info(self) -> dict[str, Any]:
        """The record as gymnasium info: the keys of :meth:`as_json`, each with one type for a whole run.

        gymnasium's vector envs batch each info key into one numpy array per step, typed by the
        first lane that reports it (``VectorEnv._add_info``), so a key that is an int in one lane
        and None in another cannot be merged, and a key present only sometimes changes the
        batch's keys. Here ``seed`` is always an int, ``NO_SEED`` (-1) when the lane continued its
        own RNG stream (gradlab and numpy seeds are never negative), and ``start`` is always a
        str, ``""`` for the environment's default start. ``progress`` holds the same signals in
        every episode of a goal.

        Returns:
            ``{"lane": int, "seed": int, "return": float, "raw_return": float, "length": int,
            "outcome": str, "reason": str, "progress": {str: float}, "start": str}``.
        """
        out = self.as_json()
        out["seed"] = NO_SEED if self.seed is None else int(self.seed)
        out["start"] = self.start or ""
        return out


@dataclass
class StepResult:
    """One step of every lane of a :class:`gradlab.envs.vector.VectorEnv`.

    Attributes:
        obs: (N, *obs_shape), observation dtype. For a lane whose episode ended this step it is
            already the first observation of the lane's next episode (same-step autoreset).
        reward: (N,) float32, shaped reward (task program applied).
        raw_reward: (N,) float32, the provider's native reward.
        terminated: (N,) bool, the episode ended for good (no bootstrap).
        truncated: (N,) bool, the episode was cut (bootstrap from ``final_obs``); never True
            together with ``terminated``.
        final_obs: lane -> the true final observation of the episode that ended this step.
        episodes: one record per episode that ended this step, in lane order.
        infos: (N,) per-lane info dicts of this step (the final step's info for ended lanes, with
            ``"gradlab_episode"`` holding the record's JSON).
        signals: task-program signal name -> (N,) values read this step (before any reset).
        events: task-program event name -> (N,) bool, the events that fired this step (empty for
            a program without events).
        components: reward component name -> (N,) float64, each named part of this step's task
            reward before ``reward_scale`` and ``reward_clip`` (empty when the reward is native alone).
    """

    obs: np.ndarray
    reward: np.ndarray
    raw_reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: dict[int, np.ndarray]
    episodes: list[EpisodeRecord]
    infos: list[dict[str, Any]]
    signals: dict[str, np.ndarray] = field(default_factory=dict)
    events: dict[str, np.ndarray] = field(default_factory=dict)
    components: dict[str, np.ndarray] = field(default_factory=dict)
