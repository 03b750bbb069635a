"""The learner process: one training run, phase by phase, with no network I/O.

Order of one iteration (the one place that orders the phases)::

    rollout (n_steps per lane) → update → metrics event → stop check → checkpoint (periodic or final)

* ``stop_requested`` (outbox control table), SIGTERM/SIGINT, the supervisor check and the early-stop
  rules are read only after an update, so a checkpoint always holds a consistent
  model/optimizer/RNG state.
* Stop on acceptance at checkpoint boundaries (:mod:`gradlab.learn.stop_rule`): when the
  supervisor announces the ``at_checkpoint`` rule, a stop request for an acceptance waits for the
  next checkpoint boundary, and at each boundary after the lineage's first checkpoint the learner
  waits for the verdict on the checkpoint before it (an ``accepted`` one ends the run there), so
  the same seed stops at the same step however fast evaluation runs. Each wait is a ``metrics``
  event with ``orchestration/learner/eval_wait_seconds`` and the awaited step and verdict.
* Early stop: one :class:`gradlab.learn.early_stop.EarlyStopMonitor` over the goal's
  ``train.early_stop.conditions`` is updated once per rollout after the update; its
  ``train/early_stop/{condition}/...`` metrics go into that rollout's ``metrics`` event, and a
  ``stop`` condition that triggers ends the run with ``early_stop:<name>`` (``observe`` conditions
  only emit). Its state is saved in every checkpoint (``resume/early_stop.json``) and restored on
  resume, so holding streaks and bests continue.
* Supervisor lost: the learner runs in its own session, so it does not die with its supervisor.
  When the supervising process (``--parent-pid``, default the parent at start; a learner forked
  by the warm zygote has the zygote as parent) has exited — killed or cancelled —, it stops as for SIGTERM with
  ``stop_reason: "supervisor_lost"`` (final checkpoint, ``learner_finished``, exit 0).
* Periodic checkpoints: at the first rollout boundary at or past each multiple of
  ``RunSpec.checkpoint_freq`` env steps. When the learner stops (budget, stop request, signal,
  early stop) it writes one ``final`` checkpoint at the current step instead.
* Every checkpoint is followed by a ``checkpoint_ready`` event; the last event is
  ``learner_finished`` with ``final_step`` and ``stop_reason``.
* Supervised from the first step (``await_supervisor``, ``--await-supervisor``): a learner started
  before its supervisor is watching (``gradlab train`` starts it while Prefect starts) does its
  imports and builds its envs, then waits until the outbox says its attempt's supervisor loop is
  running (:meth:`gradlab.outbox.Outbox.mark_supervised`) before its first rollout. Every
  checkpoint is then published, evaluated and able to stop the run as on a warm start; a stop,
  signal, fence or lost supervisor while waiting ends it at its start step with no checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradlab.checkpoints.bundle import CHECKPOINTS_DIR, verify_checkpoint, versions, write_checkpoint
from gradlab.checkpoints.manifest import RESUME_DIR, CheckpointManifest
from gradlab.contracts.hashing import sha256_json
from gradlab.contracts.run_spec import RunSpec
from gradlab.envs.task import component_metrics
from gradlab.errors import ContractViolation, IntegrityError
from gradlab.learn.backend import Backend, make_backend
from gradlab.learn.early_stop import EarlyStopMonitor
from gradlab.learn.stop_rule import (
    EVAL_WAIT_METRIC,
    FENCED,
    SUPERVISOR_LOST,
    await_verdict,
    defers_acceptance,
)
from gradlab.learn.watch import ProcessWatch
from gradlab.metrics.registry import check_names
from gradlab.outbox import Outbox

logger = logging.getLogger(__name__)

OUTBOX_FILE = "outbox.sqlite"
EARLY_STOP_FILE = "early_stop.json"
"""Early-stop monitor state inside a checkpoint's ``resume/`` folder (``EarlyStopMonitor.state_dict()``)."""


@dataclass(frozen=True)
class LearnerResult:
    """What a finished learner reports (also the ``learner_finished`` payload)."""

    final_step: int
    stop_reason: str
    checkpoints: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return {"final_step": self.final_step, "stop_reason": self.stop_reason}


class _SignalFlag:
    """SIGTERM/SIGINT set a flag; the loop reads it at the next safe boundary."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: signals stay with the caller
                return

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is None:
            logger.info("received %s: stopping after the current update", signal.Signals(signum).name)
        self.signal = "sigterm"

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def backend_config_sha256(spec: RunSpec) -> str:
    """sha256 of the backend id and its validated config (canonical JSON)."""
    backend = spec.recipe.train.backend
    return sha256_json({"id": backend.id, "config": backend.config})


def run_learner(spec: RunSpec, run_dir: Path, *, resume_from: Path | None = None,
                stop_at_step: int | None = None, env: Any | None = None,
                watch_parent: bool = True, parent_pid: int | None = None,
                await_supervisor: bool = False) -> LearnerResult:
    """Train one run to its budget or a stop, writing the outbox and checkpoints in ``run_dir``.

    Args:
        spec: the resolved run spec.
        run_dir: the run directory (``outbox.sqlite`` and ``checkpoints/`` go here).
        resume_from: a checkpoint folder to continue from (verified first; the supervisor verifies
            it against its publication receipt too). Nothing of it is unpickled.
        stop_at_step: behave as if a stop were requested once ``num_timesteps >= stop_at_step``
            (for tests and manual runs; the stop reason is ``stop_requested``).
        env: a vector env to train on instead of the backend's ``make_env(spec)`` (benchmarks, tests): an
            SB3 VecEnv for ``sb3.*``, a gradlab ``VectorEnv`` (or an ``SB3VecEnv`` over one) for ``gradlab.ppo``.
        parent_pid: the supervisor's pid as its starter saw it (``--parent-pid``), so a supervisor
            that died while this process was still importing is noticed too; default: the parent now.
        watch_parent: stop with ``supervisor_lost`` once the supervisor (``parent_pid``) has exited
            (watched through a pidfd, so a recycled pid is not mistaken for it).
        await_supervisor: take the first step only once the supervisor loop of the outbox's
            current attempt is watching (see the module docstring).

    Returns:
        The final step and stop reason.

    Raises:
        IntegrityError: the resume checkpoint fails verification.
        ContractViolation: the resume checkpoint belongs to another run configuration, or a
            metric name is not registered.
    """
    import torch

    supervisor = ProcessWatch(parent_pid or os.getppid()) if watch_parent else None
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    train = spec.recipe.train
    torch.set_num_threads(train.torch_threads)
    torch.distributions.Distribution.set_default_validate_args(False)
    outbox = Outbox(run_dir / OUTBOX_FILE)
    outbox.adopt_fence(starting=True)  # stamp every event with the attempt and epoch that started this learner
    flag = _SignalFlag()
    flag.install()
    backend = make_backend(train.backend.id)
    config_sha = backend_config_sha256(spec)
    manifest_fields = {
        "run_id": spec.run_id, **spec.hashes, "backend_id": backend.id,
        "backend_config_sha256": config_sha, "versions": versions(spec.environment.provider),
        **({"init_from_sha256": spec.init_from.checkpoint_sha256} if spec.init_from is not None else {}),
    }
    written: list[str] = []
    try:
        monitor = EarlyStopMonitor(spec.goal.train.early_stop.conditions)
        resumed_manifest: CheckpointManifest | None = None
        if resume_from is not None:
            resumed_manifest = verify_checkpoint(Path(resume_from))
            _check_resume_compatible(resumed_manifest, spec, config_sha, Path(resume_from))
        venv = env if env is not None else backend.make_env(spec)
        backend.setup(spec, venv)
        inner = getattr(venv, "venv", venv)  # SB3VecEnv -> VectorEnv; lane groups hold several
        tasks = [g.task for g in getattr(inner, "groups", [inner]) if getattr(g, "task", None) is not None]
        env_restored = False
        if resume_from is not None:
            env_restored = backend.restore(Path(resume_from))
            _restore_early_stop(monitor, Path(resume_from))
            logger.info("resumed from %s at step %d (lanes %s)", resume_from, backend.num_timesteps,
                        "continue" if env_restored else "reset")
        elif spec.init_from is not None:
            backend.warm_start(spec.init_from)
            logger.info("warm start from %s (%s)", spec.init_from.source, spec.init_from.checkpoint_sha256[:16])
        if await_supervisor and (waited := _await_supervisor(outbox, flag, supervisor)) is not None:
            step = backend.num_timesteps
            outbox.append("learner_finished", step, {"final_step": step, "stop_reason": waited})
            logger.info("learner stopped before its first step (%s)", waited)
            return LearnerResult(final_step=step, stop_reason=waited, checkpoints=())
        backend.begin(resumed=resume_from is not None)
        step = backend.num_timesteps
        stamp = outbox.adopt_fence()  # the attempt and epoch this learner writes for, in its payload too
        outbox.append("learner_started", step, {"pid": os.getpid(), "step": step,
                                                "resumed_from": str(resume_from) if resume_from else None,
                                                "attempt": stamp[0] if stamp else None,
                                                "epoch": stamp[1] if stamp else None})
        freq = spec.checkpoint_freq
        next_ckpt = (step // freq + 1) * freq
        last_ckpt_step = resumed_manifest.step if resumed_manifest is not None else None
        stop_reason: str | None = None
        bookkeeping_s = 0.0
        registered: set[str] = set()  # names already checked (the same names recur every rollout)
        timesteps = train.timesteps
        while backend.num_timesteps < timesteps:
            t0 = time.perf_counter()
            if not backend.collect():  # pragma: no cover - our callback never aborts a rollout
                break
            t1 = time.perf_counter()
            update = backend.update()
            t2 = time.perf_counter()
            step = backend.num_timesteps
            steps = backend.rollout.steps
            loop_s = (t2 - t0) + bookkeeping_s
            metrics: dict[str, float] = {
                "train/global_step": float(step),
                **backend.rollout_metrics(),
                **component_metrics(tasks),
                **update,
                "train/throughput/rollout/seconds": t1 - t0,
                "train/throughput/update/seconds": t2 - t1,
                "train/throughput/bookkeeping/seconds": bookkeeping_s,
                "train/throughput/loop_fps": steps / loop_s if loop_s > 0 else 0.0,
                "train/throughput/rollout_fps": steps / (t1 - t0) if t1 > t0 else 0.0,
                "train/throughput/env_step_fps": steps / backend.rollout.env_seconds if backend.rollout.env_seconds > 0 else 0.0,
            }
            metrics = {k: v for k, v in metrics.items() if math.isfinite(v)}
            decision = monitor.update(step, metrics)
            metrics.update(decision.metrics)
            if not registered.issuperset(metrics):
                check_names(metrics)
                registered.update(metrics)
            # Held for a batch (one fsync per METRICS_HOLD_S, not per rollout); any other event commits them first.
            outbox.append("metrics", step, {"metrics": metrics}, hold_s=METRICS_HOLD_S)
            # Safe boundary: the update is complete.
            outbox.adopt_fence()
            if (superseded := outbox.superseded()) is not None:
                # A newer attempt holds the run (this learner was paused past its lease): stop now,
                # writing no checkpoint; the new supervisor refuses this lineage's events anyway.
                stop_reason = FENCED
                logger.warning("fenced out: %s; stopping", superseded)
                outbox.append("stop_observed", step, {"reason": f"{FENCED}: {superseded}"})
            elif flag.signal:
                stop_reason = flag.signal
            elif supervisor is not None and not supervisor.alive():
                stop_reason = SUPERVISOR_LOST
                logger.warning("supervisor (pid %d) is gone: stopping", supervisor.pid)
                outbox.append("stop_observed", step, {"reason": SUPERVISOR_LOST})
            elif (requested := outbox.stop_requested()) is not None and not defers_acceptance(outbox, requested):
                stop_reason = "stop_requested"
                outbox.append("stop_observed", step, {"reason": requested})
            elif stop_at_step is not None and step >= stop_at_step:
                stop_reason = "stop_requested"
                outbox.append("stop_observed", step, {"reason": f"stop_at_step:{stop_at_step}"})
            elif decision.stop_reason is not None:
                stop_reason = decision.stop_reason
                outbox.append("stop_observed", step, {"reason": stop_reason})
            if (stop_reason is None and step < timesteps and step >= next_ckpt and last_ckpt_step is not None
                    and outbox.stop_rule() is not None):
                # A checkpoint boundary under the at_checkpoint rule (gradlab.learn.stop_rule): the
                # verdict on the previous checkpoint decides whether this one is the last.
                outbox.flush()  # nothing held while the learner waits
                wait = await_verdict(outbox, last_ckpt_step, signalled=lambda: flag.signal, supervisor=supervisor)
                wait_metrics = {"train/global_step": float(step), EVAL_WAIT_METRIC: wait.wait_s}
                check_names(wait_metrics)
                outbox.append("metrics", step, {"metrics": wait_metrics, "eval_wait": wait.as_json()})
                if wait.stop_reason is not None:
                    stop_reason = wait.stop_reason
                    if wait.observed is not None:
                        outbox.append("stop_observed", step, {"reason": wait.observed, "eval_wait": wait.as_json()})
            if stop_reason is not None or step >= timesteps:
                break
            bookkeeping_s = time.perf_counter() - t2
            if step >= next_ckpt:
                written.append(_checkpoint(backend, monitor, run_dir, outbox, step, "periodic", manifest_fields))
                last_ckpt_step = step
                next_ckpt = (step // freq + 1) * freq
        step = backend.num_timesteps
        if stop_reason is None:
            stop_reason = "sigterm" if flag.signal else "budget"
        if last_ckpt_step != step and stop_reason != FENCED:
            written.append(_checkpoint(backend, monitor, run_dir, outbox, step, "final", manifest_fields))
        outbox.append("learner_finished", step, {"final_step": step, "stop_reason": stop_reason})
        logger.info("learner finished at step %d (%s)", step, stop_reason)
        return LearnerResult(final_step=step, stop_reason=stop_reason, checkpoints=tuple(written))
    finally:
        flag.restore()
        backend.close()
        outbox.close()


#: Seconds a rollout's ``metrics`` event may wait to be committed with later ones (docs/ARCHITECTURE.md
#: section 5): CartPole's rollouts take ~15 ms, and an fsync per rollout (0.2-1.3 ms on this machine's
#: disk) was 5-8% of a gradlab.ppo run.
METRICS_HOLD_S = 0.25

#: Seconds between readings of the outbox while a learner waits for its supervisor (microseconds
#: each; the first step waits at most this long after the supervisor starts watching).
AWAIT_POLL_S = 0.01


def _await_supervisor(outbox: Outbox, flag: _SignalFlag, supervisor: ProcessWatch | None) -> str | None:
    """Wait until the supervisor loop of the outbox's current attempt is watching; then stamp this
    learner's events with that attempt's fence. Returns None to train, else the stop reason
    (``stop_requested``, ``sigterm``, ``supervisor_lost``, ``fenced``) that came first."""
    started = time.monotonic()
    logger.info("ready; waiting for the supervisor to watch before the first step")
    while True:
        fence = outbox.fence()
        if fence is not None and outbox.supervised() == fence[0]:
            outbox.adopt_fence()
            if (superseded := outbox.superseded()) is not None:
                logger.warning("fenced out before the first step: %s", superseded)
                return FENCED
            logger.info("supervised by attempt %s after %.1f s; training", fence[0], time.monotonic() - started)
            return None
        if flag.signal:
            return flag.signal
        if supervisor is not None and not supervisor.alive():
            logger.warning("supervisor (pid %d) is gone before the first step", supervisor.pid)
            return SUPERVISOR_LOST
        if (requested := outbox.stop_requested()) is not None:
            logger.info("stop requested before the first step: %s", requested)
            return "stop_requested"
        time.sleep(AWAIT_POLL_S)


def _checkpoint(backend: Backend, monitor: EarlyStopMonitor, run_dir: Path, outbox: Outbox, step: int, purpose: str,
                fields: dict) -> str:
    def write_files(folder: Path) -> None:
        backend.save(folder)
        (folder / RESUME_DIR / EARLY_STOP_FILE).write_text(json.dumps(monitor.state_dict(), sort_keys=True))

    t0 = time.perf_counter()
    path, manifest = write_checkpoint(run_dir / CHECKPOINTS_DIR, step=step, write_files=write_files,
                                      manifest_fields={**fields, "purpose": purpose})
    seconds = time.perf_counter() - t0
    metrics = {"train/global_step": float(step), "train/artifact/save/seconds": seconds,
               "train/artifact/save/size_bytes": float(manifest.size_bytes)}
    check_names(metrics)
    outbox.append("metrics", step, {"metrics": metrics})
    outbox.append("checkpoint_ready", step, {"path": str(path), "step": step, "sha256": manifest.sha256,
                                             "purpose": purpose})
    return str(path)


def _restore_early_stop(monitor: EarlyStopMonitor, checkpoint: Path) -> None:
    """Load ``resume/early_stop.json`` into ``monitor``; a checkpoint without it starts fresh streaks.

    Raises:
        IntegrityError: the file is not a JSON object.
    """
    path = checkpoint / RESUME_DIR / EARLY_STOP_FILE
    if not path.is_file():
        logger.info("%s: no early-stop state; conditions start fresh", path)
        return
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise IntegrityError(f"{path}: expected the early-stop monitor state as JSON, found invalid JSON ({e})") from None
    if not isinstance(state, dict):
        raise IntegrityError(f"{path}: expected a JSON object (condition -> state), found {type(state).__name__}")
    monitor.load_state_dict(state)


def _check_resume_compatible(manifest: CheckpointManifest, spec: RunSpec, config_sha: str, path: Path) -> None:
    expected = {**spec.hashes, "backend_id": spec.recipe.train.backend.id, "backend_config_sha256": config_sha}
    found = manifest.model_dump()
    for key, value in expected.items():
        if found[key] != value:
            raise ContractViolation(f"{path}/manifest.json: {key} expected {value} (this run spec), found {found[key]}")
