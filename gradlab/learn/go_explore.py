"""``gradlab.go_explore``: Go-Explore's exploration phase on provider state snapshots.

Ecoffet et al. 2019, "Go-Explore: a New Approach for Hard-Exploration Problems", section 2.1
(phase 1, "explore until solved"): every lane repeatedly

1. selects a cell of the archive (:class:`gradlab.explore.archive.Archive`, count-based weights),
2. *goes* there by restoring the provider state archived with it (``VectorEnv.restore_lane``: the
   emulator and the task program's episode state, so returns and step limits continue),
3. *explores* ``explore_steps`` steps with random actions, each repeating the previous one with
   ``repeat_action_probability`` (the paper's 95%),
4. archives every cell it reaches that is new, or reached with a higher return (or the same
   return in fewer steps), with the action program from reset and the provider state there.

An episode that ends in success offers its action program as the best trajectory. The learner
drives this like any backend (:mod:`gradlab.learn.backend`): one :meth:`collect` is ``n_steps``
per lane, :meth:`update` only reports the archive's metrics, checkpoints hold the best action
program as the evaluable artifact (:mod:`gradlab.checkpoints.program`) and the archive, the RNG
and every lane's state mid-exploration in ``resume/`` (JSON + content-addressed state blobs, no
pickle), so a resumed run continues exactly as an uninterrupted one.

Requires a discrete action space and a provider whose lanes capture their state (section 12a).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.checkpoints.manifest import RESUME_DIR
from gradlab.checkpoints.program import ProgramSpec, save_program_files
from gradlab.contracts.run_spec import RunSpec
from gradlab.envs.snapshot import generator_state, set_generator_state
from gradlab.errors import ConfigError, IntegrityError
from gradlab.explore.archive import Archive
from gradlab.explore.blobs import blob_sha256, read_blob, write_blobs
from gradlab.explore.cells import FrameCells, make_cell_function, progress_of
from gradlab.learn.backend_config import validate_backend_config
from gradlab.learn.search_backend import STATE_FILE, STATES_DIR, SearchBackend
from gradlab.learn.stats import EpisodeStats, RolloutStats

logger = logging.getLogger(__name__)

ARCHIVE_FILE = "archive.json"
_FORMAT = "gradlab.go_explore/1"


class GoExploreBackend(SearchBackend):
    """The Go-Explore search as a :class:`gradlab.learn.backend.Backend` (see the module docstring)."""

    backend_id = "gradlab.go_explore"
    algorithm = "go_explore"

    def __init__(self, backend_id: str):
        super().__init__(backend_id)
        self._pending: dict[str, Any] | None = None

    def setup(self, spec: RunSpec, venv: Any, *, device: str = "auto") -> None:
        self.spec = spec
        self.venv = venv
        self.cfg = validate_backend_config(spec.recipe.train, venv.num_envs)
        self.n_actions = self.discrete_actions(spec, venv)
        if (problem := venv.backend.state_problem()) is not None:
            raise ConfigError(f"train.backend.id: gradlab.go_explore restores provider states: {problem}")
        task = spec.environment.task
        self.cells = make_cell_function(self.cfg.cell, list(task.signals))
        self.progress_names = list(task.progress)
        self.rng = np.random.default_rng(spec.seed)
        self.archive = Archive(max_cells=self.cfg.max_cells, success_guidance=self.cfg.success_guidance)
        n = venv.num_envs
        self.actions: list[list[int]] = [[] for _ in range(n)]
        self.origin: list[str | None] = [None] * n
        self.progress = np.zeros(n, dtype=np.float64)
        self.left = np.zeros(n, dtype=np.int64)
        self.prev = np.zeros(n, dtype=np.int64)

    # -- the search ------------------------------------------------------------------------
    def _progress_of(self, signals: dict[str, Any]) -> float:
        return progress_of(signals, self.progress_names)

    def _go(self, lane: int) -> None:
        """Restore a selected cell into ``lane`` and start exploring from it."""
        cell = self.archive.select(self.rng)
        self.venv.restore_lane(lane, self.archive.state(cell))
        self.actions[lane] = list(cell.actions)
        self.origin[lane] = cell.key
        self.progress[lane] = cell.progress
        self.left[lane] = self.cfg.explore_steps
        self.prev[lane] = int(self.rng.integers(self.n_actions))

    def begin(self, *, resumed: bool) -> None:
        obs = self.venv.reset()
        if self._pending is not None:
            self._continue_lanes(self._pending)
            self._pending = None
            return
        for lane in range(self.venv.num_envs):
            signals = self.venv.task.lane_state(lane)["last"]
            key = self.cells.key(signals, obs[lane])
            progress = self._progress_of(signals)
            state = self.venv.capture_lane(lane) if self.archive.wants(key, 0.0, 0) else None
            self.archive.visit(key, actions=[], return_=0.0, length=0, progress=progress, state=state, parent=None,
                               thumb=self._thumb(key, state, obs[lane]))
        for lane in range(self.venv.num_envs):
            self._go(lane)

    def collect(self) -> bool:
        self.rollout = RolloutStats()
        import time

        venv, cfg, archive = self.venv, self.cfg, self.archive
        for _ in range(cfg.n_steps):
            n = venv.num_envs
            repeat = self.rng.random(n) < cfg.repeat_action_probability
            fresh = self.rng.integers(self.n_actions, size=n)
            actions = np.where(repeat, self.prev, fresh).astype(np.int64)
            t0 = time.perf_counter()
            res = venv.step(actions)
            self.rollout.env_seconds += time.perf_counter() - t0
            self.rollout.add_rewards(res.reward)
            self.prev = actions
            ended = {ep.lane: ep for ep in res.episodes}
            for lane in range(n):
                self.actions[lane].append(int(actions[lane]))
                ep = ended.get(lane)
                if ep is not None:
                    record = ep.as_json()
                    self.episodes.add(record)
                    if ep.outcome == "success":
                        progress = max(self.progress[lane], self._progress_of(ep.progress))
                        if archive.complete(actions=self.actions[lane], return_=ep.return_, length=ep.length,
                                            progress=progress, cell=self.origin[lane]):
                            logger.info("go-explore: success in %d steps (return %.3f) at step %d",
                                        ep.length, ep.return_, self._steps)
                    self._go(lane)
                    continue
                signals = {name: values[lane] for name, values in res.signals.items()}
                self.progress[lane] = max(self.progress[lane], self._progress_of(signals))
                key = self.cells.key(signals, res.obs[lane])
                ret, length = float(venv.task.returns[lane]), int(venv.task.steps[lane])
                state = venv.capture_lane(lane) if archive.wants(key, ret, length) else None
                if archive.visit(key, actions=self.actions[lane], return_=ret, length=length,
                                 progress=float(self.progress[lane]), state=state, parent=self.origin[lane],
                                 thumb=self._thumb(key, state, res.obs[lane])):
                    self.origin[lane] = key
                self.left[lane] -= 1
                if self.left[lane] <= 0:
                    self._go(lane)
            self._steps += n
        return True

    def _thumb(self, key: str, state: bytes | None, obs: np.ndarray) -> str | None:
        """A new frame cell's picture (only a cell about to be archived for the first time)."""
        if state is None or key in self.archive.cells or not isinstance(self.cells, FrameCells):
            return None
        return self.cells.thumbnail(obs)

    def update(self) -> dict[str, float]:
        return self.archive.metrics()

    # -- checkpoints -----------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        actions, completed = self.archive.program()
        best = self.archive.best or self.archive.best_cell()
        save_program_files(folder, actions, ProgramSpec(
            backend_id=self.id, algorithm=self.algorithm, n_actions=self.n_actions, length=len(actions),
            completed=completed, **{"return": float(best.return_) if best is not None else 0.0}))
        resume = folder / RESUME_DIR
        resume.mkdir()
        lane_states = [self.venv.capture_lane(lane) for lane in range(self.venv.num_envs)]
        blobs = dict(self.archive.blobs)
        blobs.update({blob_sha256(s): s for s in lane_states})
        write_blobs(resume / STATES_DIR, blobs)
        (resume / ARCHIVE_FILE).write_text(json.dumps(self.archive.to_json(), sort_keys=True))
        state = {"format": _FORMAT, "num_timesteps": self._steps, "rng": generator_state(self.rng),
                 "episodes": self.episodes.as_json(),
                 "lanes": [{"state": blob_sha256(s), "actions": a, "origin": o, "progress": float(p), "left": int(k),
                            "prev": int(v)}
                           for s, a, o, p, k, v in zip(lane_states, self.actions, self.origin, self.progress,
                                                       self.left, self.prev, strict=True)]}
        (resume / STATE_FILE).write_text(json.dumps(state, sort_keys=True))

    def restore(self, checkpoint: Path) -> bool:
        resume = Path(checkpoint) / RESUME_DIR
        path = resume / STATE_FILE
        state = self.read_state(resume, _FORMAT)
        data = json.loads((resume / ARCHIVE_FILE).read_text())
        needed = {c["state"] for c in data["cells"]} | {lane["state"] for lane in state["lanes"]}
        blobs = {sha: read_blob(resume / STATES_DIR, sha) for sha in sorted(needed)}
        self.archive = Archive.from_json(data, blobs, where=str(resume / ARCHIVE_FILE))
        if len(state["lanes"]) != self.venv.num_envs:
            raise IntegrityError(f"{path}: {len(state['lanes'])} lanes saved, this env has {self.venv.num_envs}")
        self._steps = int(state["num_timesteps"])
        set_generator_state(self.rng, state["rng"])
        self.episodes = EpisodeStats.from_json(state["episodes"])
        self._pending = {"lanes": state["lanes"], "blobs": blobs}
        return True

    def _continue_lanes(self, pending: dict[str, Any]) -> None:
        for lane, saved in enumerate(pending["lanes"]):
            self.venv.restore_lane(lane, pending["blobs"][saved["state"]])
            self.actions[lane] = list(saved["actions"])
            self.origin[lane] = saved["origin"]
            self.progress[lane] = saved["progress"]
            self.left[lane] = saved["left"]
            self.prev[lane] = saved["prev"]

