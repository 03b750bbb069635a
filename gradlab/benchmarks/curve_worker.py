"""One run of ``gradlab benchmark curves`` in its own process: train, record every episode, keep the record current.

The command (:mod:`gradlab.benchmarks.curves`) starts ``python -m gradlab.benchmarks.curve_worker
ARGS`` per run (``ARGS``: one JSON object: goal, side, seed, steps, threads, out, parent_pid,
horizon). The worker trains with gradlab's own learner (:func:`gradlab.learn.learner.run_learner`)
on a vector env wrapped by :class:`EpisodeLog`, rewrites its JSON record (``runs/<side>-s<seed>.json``)
every :data:`WORKER_FLUSH_S` seconds and at the end, checks the recorded episodes against the
learner's outbox (``outbox_check``), and counts the time it was stopped or not scheduled
(``stalled_s``, :class:`_Heartbeat`). A SIGTERM or SIGINT stops it at the learner's next update
boundary (before the learner's own handler is in place: it trains nothing).
"""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gradlab.benchmarks.curve_sides import Side, run_spec
from gradlab.benchmarks.curve_stats import WINDOW

WORKER_FLUSH_S = 10.0
STALL_S = 2.0
TICK_S = 0.5


class EpisodeLog:
    """A gradlab ``VectorEnv`` that records every finished episode's env step and raw return.

    Every attribute but :meth:`step` and :meth:`restore_lane` is the wrapped env's. ``steps`` counts
    lane steps (``num_envs`` per :meth:`step`); ``episode_steps[i]`` (int) is ``steps`` after the step
    that ended episode i, ``returns[i]`` (float) its ``EpisodeRecord.raw_return``. ``on_step``
    (optional) is called after each step.

    With an archive curriculum (docs/ARCHITECTURE.md section 12a) an episode whose lane was restored
    from an archived state (``restore_lane``, on this env or on one of its lane groups) is of archive
    origin: it goes to ``archive_episode_steps`` / ``archive_returns`` instead, as the learner's
    ``train/episode/*`` metrics leave it out, so the curve is the target-origin one.
    """

    def __init__(self, venv: Any, on_step: Any = None):
        self._venv = venv
        self._on_step = on_step
        self.steps = 0
        self.episode_steps: list[int] = []
        self.returns: list[float] = []
        self.archive_episode_steps: list[int] = []
        self.archive_returns: list[float] = []
        self._archive_lanes: set[int] = set()
        # Lane groups (gradlab.envs.groups): gradlab.ppo's rollout steps each group on its own, so
        # every group's step_wait is where episodes are recorded (LaneGroups.step goes through them).
        self._groups = list(getattr(venv, "groups", None) or [])
        slices = list(getattr(venv, "slices", None) or [])
        for group, sl in zip(self._groups, slices, strict=True):
            offset = sl.start or 0
            group.step_wait = functools.partial(self._group_wait, group, group.step_wait, offset)
            if hasattr(group, "restore_lane"):
                group.restore_lane = functools.partial(self._restore, group.restore_lane, offset)

    def _record(self, res: Any, lanes: int, offset: int = 0) -> None:
        self.steps += lanes
        for ep in res.episodes:
            lane = offset + ep.lane
            if lane in self._archive_lanes:
                self._archive_lanes.discard(lane)
                self.archive_episode_steps.append(self.steps)
                self.archive_returns.append(float(ep.raw_return))
            else:
                self.episode_steps.append(self.steps)
                self.returns.append(float(ep.raw_return))
        if self._on_step is not None:
            self._on_step()

    def _group_wait(self, group: Any, wait: Any, offset: int) -> Any:
        res = wait()
        self._record(res, group.num_envs, offset)
        return res

    def _restore(self, restore: Any, offset: int, lane: int, state: bytes) -> Any:
        obs = restore(lane, state)
        self._archive_lanes.add(offset + lane)
        return obs

    def restore_lane(self, lane: int, state: bytes) -> Any:
        """The wrapped env's ``restore_lane``; the lane's current episode is then of archive origin."""
        return self._restore(self._venv.restore_lane, 0, lane, state)

    def step(self, actions: Any) -> Any:
        res = self._venv.step(actions)
        if not self._groups:
            self._record(res, self._venv.num_envs)
        return res

    def __getattr__(self, name: str) -> Any:
        if name == "venv":  # gradlab.ppo unwraps an SB3VecEnv through .venv: this is no adapter
            raise AttributeError(name)
        return getattr(self._venv, name)


class _Heartbeat(threading.Thread):
    """Adds to ``stalled_s`` every stretch longer than :data:`STALL_S` in which this process did not run."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="curves-heartbeat")
        self.stalled_s = 0.0

    def run(self) -> None:
        last = time.monotonic()
        while True:
            time.sleep(TICK_S)
            now = time.monotonic()
            if now - last > STALL_S:
                self.stalled_s += now - last - TICK_S
            last = now


def _cpu_seconds() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def write_json(path: Path, doc: dict) -> None:
    """Write ``doc`` as JSON to ``path`` atomically (:func:`gradlab.fsync.write_atomic`): a reader never sees
    half a file."""
    from gradlab.fsync import write_atomic

    write_atomic(path, json.dumps(doc).encode())


def _outbox_check(outbox_path: Path, returns: list[float]) -> dict:
    """The learner's last ``train/episode/return/raw/mean`` against the mean of the last 100 recorded."""
    from gradlab.outbox import Outbox

    outbox = Outbox(outbox_path, readonly=True)
    try:
        last = None
        for event in outbox.read(0, limit=10_000_000, kind="metrics"):
            value = event.payload.get("metrics", {}).get("train/episode/return/raw/mean")
            if value is not None:
                last = float(value)
    finally:
        outbox.close()
    recorded = sum(returns[-WINDOW:]) / len(returns[-WINDOW:]) if returns else None
    match = (last is None and recorded is None) or (
        last is not None and recorded is not None and math.isclose(last, recorded, rel_tol=1e-9, abs_tol=1e-9))
    return {"outbox_raw_mean": last, "recorded_raw_mean": recorded, "match": match}


_EARLY_STOP = [False]
"""Set by :func:`_early_stop`, the worker process's SIGTERM/SIGINT handler until the learner installs its own."""


def _early_stop(signum: int, frame: Any) -> None:
    _EARLY_STOP[0] = True


def _ignore_stops() -> None:
    """Trained: later SIGTERMs (the command repeats them) must not kill the process while it writes its
    record or exits (Python puts its own handlers back to the default at exit; an ignored signal stays so)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def worker(goal: str, side: Side, seed: int, steps: int, threads: int, out: Path, parent_pid: int,
           horizon: str = "recipe") -> dict:
    """Train one run for ``steps`` env steps (:func:`run_spec`), keeping ``out`` (its JSON record)
    current; returns the final record (``status`` ``done`` once ``steps`` were trained).

    Raises:
        ContractViolation / ConfigError / NotFound: as :func:`run_learner` and :func:`run_spec`.
    """
    import tempfile

    from gradlab.envs import make_vector_env
    from gradlab.learn.learner import OUTBOX_FILE, run_learner

    spec = run_spec(goal, side, seed, steps, threads, horizon)
    heartbeat = _Heartbeat()
    record: dict[str, Any] = {"side": side.label, "backend": side.backend, "precision": side.precision, "seed": seed,
                              "ref": f"{spec.goal_id}/{spec.recipe_id}", "threads": threads, "budget": steps,
                              "schedule_timesteps": spec.recipe.train.timesteps,
                              "status": "running", "pid": os.getpid()}
    c0, t0 = _cpu_seconds(), time.monotonic()
    last_flush = [t0]

    def snapshot(status: str) -> dict:
        seconds = time.monotonic() - t0
        active = max(seconds - heartbeat.stalled_s, 1e-9)
        record.update(status=status, steps=log.steps, episode_steps=log.episode_steps, returns=log.returns,
                      archive_episodes=len(log.archive_returns), seconds=seconds, cpu_seconds=_cpu_seconds() - c0, stalled_s=heartbeat.stalled_s,
                      steps_per_s=log.steps / active)
        return record

    def on_step() -> None:
        now = time.monotonic()
        if now - last_flush[0] >= WORKER_FLUSH_S:
            last_flush[0] = now
            write_json(out, snapshot("running"))

    # Each side's own vector env: gradlab.ppo's is two lane groups on ale-py (its pipelined rollout).
    if side.backend == "gradlab.ppo":
        from gradlab.learn.ppo import PPOBackend

        venv = PPOBackend.make_env(spec)
    else:
        venv = make_vector_env(spec.environment, seed=spec.seed)
    log = EpisodeLog(venv, on_step)
    heartbeat.start()
    write_json(out, snapshot("running"))
    if side.backend == "sb3.ppo":
        from gradlab.envs.sb3 import SB3VecEnv

        env: Any = SB3VecEnv(log)  # type: ignore[arg-type]  # an EpisodeLog is a VectorEnv by delegation
    else:
        env = log
    if _EARLY_STOP[0]:  # SIGTERM/SIGINT before the learner's own handler was in place: train nothing
        _ignore_stops()
        record.update(stop_reason="sigterm", final_step=0)
        final = snapshot("stopped")
        write_json(out, final)
        return final
    with tempfile.TemporaryDirectory(prefix="gradlab-curves-") as tmp:
        result = run_learner(spec, Path(tmp) / "run", env=env, stop_at_step=steps, watch_parent=True,
                             parent_pid=parent_pid)
        _ignore_stops()
        record["stop_reason"] = result.stop_reason
        record["final_step"] = result.final_step
        record["outbox_check"] = _outbox_check(Path(tmp) / "run" / OUTBOX_FILE, log.returns)
    done = result.final_step >= steps and result.stop_reason in ("budget", "stop_requested")
    final = snapshot("done" if done else "stopped")
    write_json(out, final)
    return final


if __name__ == "__main__":  # one run: python -m gradlab.benchmarks.curve_worker '{"goal": ..., "side": ..., ...}'
    import logging

    signal.signal(signal.SIGTERM, _early_stop)
    signal.signal(signal.SIGINT, _early_stop)
    logging.basicConfig(level=logging.WARNING)
    _a = json.loads(sys.argv[1])
    worker(_a["goal"], Side.parse(_a["side"]), int(_a["seed"]), int(_a["steps"]), int(_a["threads"]), Path(_a["out"]),
           int(_a["parent_pid"]), _a["horizon"])
