"""``train.curriculum.archive`` in ``gradlab.ppo``'s rollout: archived starts, episode origins, priorities.

docs/ARCHITECTURE.md section 12a. :class:`ArchiveCurriculumRunner` is called by
:func:`gradlab.learn.ppo_rollout.collect_rollout` at every env step and once after GAE:

* **Filling.** At a step where a lane of a *target-origin* episode (one begun by the goal's own
  reset) is in a cell the archive does not hold (the cell function on the task program's signals,
  or on the raw observation for frame cells), the lane's state is captured
  (``VectorEnv.capture_lane``) into the archive (:class:`gradlab.explore.curriculum.CurriculumArchive`,
  at most ``reservoir_size`` cells). Archive-origin episodes add no cells.
* **Starting.** When a lane's episode ends, the vector env has already reset it (same-step
  autoreset); with probability ``share`` the runner then restores an archived cell's state into
  the lane (``VectorEnv.restore_lane``), whose observation replaces the reset's. The episode
  continues the archived one: the task program's step count and return are restored with it, so
  its return and length count from the archived episode's reset. Under ``train.normalize`` the
  statistics were updated with the reset observation of that step, and the restored observation
  is normalised with them.
* **Origins.** Every finished episode is counted by its origin: target-origin episodes in the
  backend's ``episodes`` (so ``train/episode/*``, ``train/outcome/*`` and the early-stop rules see
  target-origin episodes only, and ``train/episode/return/{shaped,raw}/from/target/mean`` name
  them), archive-origin ones in :attr:`ArchiveCurriculumRunner.episodes`
  (``train/episode/return/{shaped,raw}/from/archive/mean``). Evaluation never sees the curriculum:
  it builds its own env from the goal.
* **Priorities.** After GAE, the |A_t| of each archive-origin episode's steps in the rollout
  (``b.advantages``: raw GAE, Schulman et al. 2016, before the update's minibatch normalisation)
  are added to the lane's running sum; when the episode ended in the rollout, the cell's priority
  EMA takes the trajectory's mean |A_t| over all its steps since the restore, across rollouts.

Resume: ``resume/curriculum.json`` (:meth:`CurriculumArchive.to_json` and the archive-origin
episode windows) and ``resume/states/<sha256>.bin`` (:func:`gradlab.explore.blobs.write_blobs`),
read back with :func:`gradlab.explore.blobs.read_blob`, which refuses a corrupted blob naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.errors import ConfigError, ContractViolation
from gradlab.explore.blobs import read_blob, write_blobs
from gradlab.explore.cells import make_cell_function, progress_of
from gradlab.explore.curriculum import CurriculumArchive
from gradlab.learn.ppo_state import read_required_json
from gradlab.learn.stats import EpisodeStats

CURRICULUM_FILE = "curriculum.json"
STATES_DIR = "states"
KEY = "train.curriculum.archive"


def lane_env(venv: Any, lane: int) -> tuple[Any, int]:
    """The ``VectorEnv`` that steps global lane ``lane`` of ``venv`` (a ``VectorEnv`` or lane groups) and its local index."""
    groups = getattr(venv, "groups", None)
    if groups is None:
        return venv, lane
    for group, sl in zip(groups, venv.slices, strict=True):
        if sl.start <= lane < sl.stop:
            return group, lane - sl.start
    raise ContractViolation(f"lane: expected 0..{venv.num_envs - 1}, found {lane}")


def origin_metrics(stats: EpisodeStats, origin: str) -> dict[str, float]:
    """``train/episode/return/{shaped,raw}/from/{origin}/mean`` of ``stats``' window (empty before an episode ended)."""
    if not stats.returns:
        return {}
    return {f"train/episode/return/shaped/from/{origin}/mean": float(np.mean(stats.returns)),
            f"train/episode/return/raw/from/{origin}/mean": float(np.mean(stats.raw_returns))}


class ArchiveCurriculumRunner:
    """The archive curriculum of one ``gradlab.ppo`` run (see the module docstring).

    Args:
        spec: the run spec (``recipe.train.curriculum.archive`` set). venv: the run's vector env or lane groups.

    Attributes:
        state: the :class:`CurriculumArchive`. episodes: archive-origin episode statistics.

    Raises:
        ConfigError: naming ``train.curriculum.archive``: the provider cannot capture its lanes'
            state, or the cell function does not fit the goal (signals it lacks, frames of a
            non-image observation).
    """

    def __init__(self, spec: Any, venv: Any):
        cfg = spec.recipe.train.archive_curriculum
        env = spec.environment
        groups = getattr(venv, "groups", None) or [venv]
        for group in groups:
            if (problem := group.backend.state_problem()) is not None:
                raise ConfigError(f"{KEY}: restores provider states, which {env.provider}:{env.env_id} cannot "
                                  f"capture: {problem}")
        try:
            self.cells = make_cell_function(cfg.cell, list(env.task.signals))
        except ConfigError as e:
            raise ConfigError(str(e).replace("train.backend.config.cell", f"{KEY}.cell")) from None
        if cfg.cell.kind == "frame" and len(venv.single_observation_space.shape) != 3:
            raise ConfigError(f"{KEY}.cell.kind: frame cells need image observations (C, H, W), "
                              f"found shape {venv.single_observation_space.shape}")
        self.progress_names = list(env.task.progress)
        self.venv = venv
        n = venv.num_envs
        self.state = CurriculumArchive(n, share=cfg.share, reservoir_size=cfg.reservoir_size,
                                       priority_metric=cfg.priority_metric, ema_rate=cfg.ema_rate, seed=spec.seed)
        self.episodes = EpisodeStats()
        self._seg_start = np.zeros(n, dtype=np.int64)
        self._segments: list[tuple[int, int, int, str | None, bool]] = []
        self.last_segments: list[tuple[int, int, int, str | None, bool]] = []

    # -- the rollout ---------------------------------------------------------------------------
    def begin(self) -> None:
        """After the first reset of every lane: each lane's episode is of target origin."""
        for lane in range(self.venv.num_envs):
            self.state.start(lane)

    def begin_rollout(self) -> None:
        self._seg_start[:] = 0
        self._segments = []

    def _progress(self, signals: dict[str, Any]) -> float:
        return progress_of(signals, self.progress_names)

    def after_step(self, t: int, offset: int, res: Any, next_obs: np.ndarray, target_episodes: EpisodeStats,
                   normaliser: Any = None) -> None:
        """Step ``t``'s result ``res`` of lanes ``offset .. offset + len(res.obs)`` (local indices in ``res``).

        Counts each finished episode by origin (target-origin ones into ``target_episodes``), starts
        the lanes' next episodes (restoring an archived state into ``next_obs`` in place, normalised
        with ``normaliser`` when given), and archives the new cells of target-origin lanes.
        """
        st = self.state
        ended = set()
        for ep in res.episodes:
            lane = offset + ep.lane
            ended.add(ep.lane)
            key = st.origin[lane]
            self._segments.append((lane, int(self._seg_start[lane]), t, key, True))
            self._seg_start[lane] = t + 1
            (target_episodes if key is None else self.episodes).add(ep.as_json())
            cell = st.start(lane)
            if cell is not None:
                env, local = lane_env(self.venv, lane)
                obs = env.restore_lane(local, st.archive.state(cell))
                next_obs[ep.lane] = normaliser.normalize_obs(obs[None])[0] if normaliser is not None else obs
        n = len(res.obs)
        for i in range(n):
            lane = offset + i
            if i in ended or st.origin[lane] is not None:
                continue
            signals = {name: values[i] for name, values in res.signals.items()}
            key = self.cells.key(signals, res.obs[i])
            if st.wants(key):
                env, local = lane_env(self.venv, lane)
                st.add(key, env.capture_lane(local), return_=float(env.task.returns[local]),
                       length=int(env.task.steps[local]), progress=self._progress(signals))

    def after_gae(self, advantages: Any) -> None:
        """Fold the rollout's |A_t| ((n_steps, n_envs), raw GAE) into the archive-origin episodes' sums and priorities."""
        adv = np.abs(advantages.detach().float().cpu().numpy()) if hasattr(advantages, "detach") else np.abs(advantages)
        n_steps = adv.shape[0]
        segments = list(self._segments)
        for lane in range(self.venv.num_envs):
            if self._seg_start[lane] < n_steps:
                segments.append((lane, int(self._seg_start[lane]), n_steps - 1, self.state.origin[lane], False))
        segments.sort(key=lambda s: (s[2], s[0]))  # by end step: priorities fold in completion order
        for lane, t0, t1, key, ended in segments:
            if key is not None:
                self.state.add_advantages(lane, key, adv[t0:t1 + 1, lane], ended=ended)
        self.last_segments = segments

    def metrics(self, target_episodes: EpisodeStats) -> dict[str, float]:
        """``train/curriculum/archive/*`` and the training returns by origin (METRICS.md)."""
        return {**self.state.metrics(), f"{KEY.replace('.', '/')}/episode_count": float(self.episodes.count),
                **origin_metrics(target_episodes, "target"), **origin_metrics(self.episodes, "archive")}

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self, resume: Path) -> None:
        """Write ``curriculum.json`` and the archive's state blobs (``states/``) into ``resume``."""
        write_blobs(resume / STATES_DIR, self.state.archive.blobs)
        data = {**self.state.to_json(), "episodes": self.episodes.as_json()}
        (resume / CURRICULUM_FILE).write_text(json.dumps(data, sort_keys=True))

    def restore(self, resume: Path, *, lanes_restored: bool) -> None:
        """Read what :meth:`save` wrote; every blob is checked against its address.

        Args:
            lanes_restored: the lanes continue mid-episode; else every lane restarts at target origin.

        Raises:
            ContractViolation: ``curriculum.json`` is missing or not JSON. NotFound: a blob is
                missing. IntegrityError: a blob is corrupted (naming its file) or the state does not
                fit this run (naming ``curriculum.json``).
        """
        path = resume / CURRICULUM_FILE
        data = read_required_json(path, f"this recipe sets {KEY}")
        needed = sorted({c["state"] for c in data.get("archive", {}).get("cells", [])})
        blobs = {sha: read_blob(resume / STATES_DIR, sha) for sha in needed}
        self.state.load_json(data, blobs, where=str(path))
        self.episodes = EpisodeStats.from_json(data["episodes"])
        if not lanes_restored:
            self.state.reset_lanes()
