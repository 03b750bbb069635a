"""``gradlab.jerk``: Just Enough Retained Knowledge, a search over action sequences.

Nichol et al. 2018, "Gotta Learn Fast: A New Benchmark for Generalization in RL", section 4.1 and
appendix: episodes are either *explored* (runs of one action held for a random length in
``run_length``, each step replaced by a random other action with ``jump_probability``, the game's
"jump") or *exploit* the best retained sequence (the highest mean return over its replays),
replayed from reset and then explored on. An episode exploits with probability
``exploit_bias + (1 - exploit_bias) * steps / timesteps``, growing over the budget. What a finished
episode retains is its *best prefix*: its actions up to the first step where its cumulative reward
peaked, scored with that peak (the Retro Contest baseline's ``TrackedEnv.best_sequence``), so a
replay stops short of what lost the episode (a death after the last point) and exploration goes on
from the best point. A replay scores its sequence again with the cumulative reward at the
sequence's end, so lucky sequences regress to their mean; it retains a new sequence only when its
peak comes after the replayed part. At most ``max_retained`` sequences (the best by mean score) are
kept. It needs no provider state: episodes start from reset, so it runs on any provider with
a discrete action space.

Driven by the learner like any backend (:mod:`gradlab.learn.backend`); checkpoints hold the best
retained sequence as the evaluable action program (:mod:`gradlab.checkpoints.program`) and in
``resume/search.json`` the retained sequences, the RNG and the lanes' bookkeeping, with the lanes'
states where the provider captures them (else a resumed run starts new episodes).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.checkpoints.manifest import RESUME_DIR
from gradlab.checkpoints.program import ProgramSpec, save_program_files
from gradlab.contracts.run_spec import RunSpec
from gradlab.envs.snapshot import generator_state, set_generator_state
from gradlab.errors import ConfigError
from gradlab.explore.blobs import blob_sha256, read_blob, write_blobs
from gradlab.learn.backend_config import validate_backend_config
from gradlab.learn.search_backend import STATE_FILE, STATES_DIR, SearchBackend
from gradlab.learn.stats import EpisodeStats, RolloutStats

FORMAT = "gradlab.jerk/2"


def retained_rank(seq: Mapping[str, Any]) -> tuple[float, int]:
    """The sort key of a retained sequence, best first: the higher mean score (over its first
    episode and every replay), then fewer actions. ``seq``: ``{"actions": [...], "returns": [...]}``."""
    return -float(np.mean(seq["returns"])), len(seq["actions"])


class JerkBackend(SearchBackend):
    """JERK as a :class:`gradlab.learn.backend.Backend` (see the module docstring)."""

    backend_id = "gradlab.jerk"
    algorithm = "jerk"

    def __init__(self, backend_id: str):
        super().__init__(backend_id)
        self._pending: list[bytes] | None = None

    def setup(self, spec: RunSpec, venv: Any, *, device: str = "auto") -> None:
        self.spec, self.venv = spec, venv
        self.cfg = validate_backend_config(spec.recipe.train, venv.num_envs)
        self.n_actions = self.discrete_actions(spec, venv)
        lo, hi = self.cfg.run_length
        if not 1 <= lo <= hi:
            raise ConfigError(f"train.backend.config.run_length: expected 1 <= min <= max, found {[lo, hi]}")
        self.timesteps = spec.recipe.train.timesteps
        self.rng = np.random.default_rng(spec.seed)
        #: Retained sequences: {"actions", "returns", "successes"}.
        self.retained: list[dict[str, Any]] = []
        self.selected_means: list[float] = []
        n = venv.num_envs
        self.lanes: list[dict[str, Any]] = [self._fresh_lane() for _ in range(n)]

    # -- the search ------------------------------------------------------------------------
    def exploit_probability(self) -> float:
        b = self.cfg.exploit_bias
        return b + (1.0 - b) * min(1.0, self._steps / max(self.timesteps, 1))

    def _best(self) -> dict[str, Any] | None:
        if not self.retained:
            return None
        return min(self.retained, key=retained_rank)

    def _fresh_lane(self) -> dict[str, Any]:
        # cum: the episode's cumulative reward; peak / peak_len: its highest value and the length of
        # the first prefix reaching it; replay_score: the cumulative reward where the replay ended
        return {"actions": [], "replay": [], "replayed": None, "run_action": 0, "run_left": 0,
                "cum": 0.0, "peak": None, "peak_len": 0, "replay_score": None}

    def _start_episode(self, lane: int) -> None:
        state = self._fresh_lane()
        best = self._best()
        if best is not None and self.rng.random() < self.exploit_probability():
            state["replay"] = list(best["actions"])
            state["replayed"] = self.retained.index(best)
            self.selected_means.append(float(np.mean(best["returns"])))
        self.lanes[lane] = state

    def _action(self, lane: int) -> int:
        s = self.lanes[lane]
        t = len(s["actions"])
        if t < len(s["replay"]):
            return int(s["replay"][t])
        if s["run_left"] <= 0:
            s["run_action"] = int(self.rng.integers(self.n_actions))
            s["run_left"] = int(self.rng.integers(self.cfg.run_length[0], self.cfg.run_length[1] + 1))
        s["run_left"] -= 1
        if self.rng.random() < self.cfg.jump_probability:
            return int(self.rng.integers(self.n_actions))
        return int(s["run_action"])

    def _record(self, lane: int, action: int, reward: float) -> None:
        s = self.lanes[lane]
        s["actions"].append(action)
        s["cum"] += reward
        if s["peak"] is None or s["cum"] > s["peak"]:
            s["peak"], s["peak_len"] = s["cum"], len(s["actions"])
        if len(s["actions"]) == len(s["replay"]):
            s["replay_score"] = s["cum"]

    def _retain(self, lane: int, success: bool) -> None:
        """Score the replayed sequence, and retain the episode's best prefix when it is new.

        ``success``: the episode ended in success; its best prefix is a success when it is the
        whole episode (the success step is the peak)."""
        s = self.lanes[lane]
        whole = s["peak_len"] == len(s["actions"])
        if s["replayed"] is not None:
            seq = self.retained[s["replayed"]]
            score = s["replay_score"] if s["replay_score"] is not None else s["cum"]  # ended inside the replay
            seq["returns"].append(float(score))
            seq["successes"] += int(success and len(s["replay"]) >= len(s["actions"]))
        if s["peak"] is not None and s["peak_len"] > len(s["replay"]):
            self.retained.append({"actions": s["actions"][:s["peak_len"]], "returns": [float(s["peak"])],
                                  "successes": int(success and whole)})
        if len(self.retained) > self.cfg.max_retained:
            self.retained.sort(key=retained_rank)
            del self.retained[self.cfg.max_retained:]

    def begin(self, *, resumed: bool) -> None:
        self.venv.reset()
        if self._pending is not None:
            for lane, blob in enumerate(self._pending):
                self.venv.restore_lane(lane, blob)
            self._pending = None
            return
        for lane in range(self.venv.num_envs):
            self._start_episode(lane)

    def collect(self) -> bool:
        self.rollout = RolloutStats()
        venv = self.venv
        for _ in range(self.cfg.n_steps):
            actions = np.array([self._action(lane) for lane in range(venv.num_envs)], dtype=np.int64)
            t0 = time.perf_counter()
            res = venv.step(actions)
            self.rollout.env_seconds += time.perf_counter() - t0
            self.rollout.add_rewards(res.reward)
            for lane in range(venv.num_envs):
                self._record(lane, int(actions[lane]), float(res.reward[lane]))
            for ep in res.episodes:
                self.episodes.add(ep.as_json())
                self._retain(ep.lane, ep.outcome == "success")
                self._start_episode(ep.lane)
            self._steps += venv.num_envs
        return True

    def update(self) -> dict[str, float]:
        p = "train/algorithm/jerk"
        out = {f"{p}/retained/count": float(len(self.retained)), f"{p}/exploit/probability": self.exploit_probability()}
        best = self._best()
        if best is not None:
            out[f"{p}/best/return_mean"] = float(np.mean(best["returns"]))
            out[f"{p}/best/sequence_length"] = float(len(best["actions"]))
        if self.selected_means:
            out[f"{p}/archive/selected_prefix_return_mean"] = float(np.mean(self.selected_means))
        return out

    # -- checkpoints -----------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        best = self._best()
        actions = list(best["actions"]) if best is not None else []
        save_program_files(folder, actions, ProgramSpec(
            backend_id=self.id, algorithm=self.algorithm, n_actions=self.n_actions, length=len(actions),
            completed=bool(best is not None and best["successes"] > 0),
            **{"return": float(np.mean(best["returns"])) if best is not None else 0.0}))
        resume = folder / RESUME_DIR
        resume.mkdir()
        lane_states = None
        if self.venv.backend.state_problem() is None:
            lane_states = [self.venv.capture_lane(lane) for lane in range(self.venv.num_envs)]
            write_blobs(resume / STATES_DIR, {blob_sha256(b): b for b in lane_states})
        state = {"format": FORMAT, "num_timesteps": self._steps, "rng": generator_state(self.rng),
                 "episodes": self.episodes.as_json(), "retained": self.retained, "selected_means": self.selected_means,
                 "lanes": self.lanes, "lane_states": None if lane_states is None else [blob_sha256(b) for b in lane_states]}
        (resume / STATE_FILE).write_text(json.dumps(state, sort_keys=True))

    def restore(self, checkpoint: Path) -> bool:
        resume = Path(checkpoint) / RESUME_DIR
        state = self.read_state(resume, FORMAT)
        self._steps = int(state["num_timesteps"])
        set_generator_state(self.rng, state["rng"])
        self.episodes = EpisodeStats.from_json(state["episodes"])
        self.retained, self.selected_means = state["retained"], state["selected_means"]
        if state["lane_states"] is None or len(state["lane_states"]) != self.venv.num_envs:
            self.lanes = [self._fresh_lane() for _ in range(self.venv.num_envs)]
            return False
        self.lanes = state["lanes"]
        self._pending = [read_blob(resume / STATES_DIR, sha) for sha in state["lane_states"]]
        return True

