"""The W&B sink: the flow's only W&B writer, idempotent by ``event_seq``, never raising into the caller.

- Mode is always explicit: ``disabled`` (W&B is not imported), ``offline`` (files only, the local
  default; no network connection at all), ``online``.
- The W&B run id is the gradlab run id; files go under ``dir`` (``<dir>/wandb/...``).
- Axes (``define_metric``): ``train/*`` against ``train/global_step``, ``eval/*`` against
  ``eval/checkpoint_step``, ``orchestration/*`` against ``orchestration/event_seq``.
- ``event_seq`` is W&B's ``step`` and is logged as ``orchestration/event_seq``. The sink keeps a
  high-water mark (seeded from the outbox's acknowledged mark for sink ``wandb``) and skips any
  ``event_seq`` at or below it, so a replayed delivery cannot add a point. (Offline, W&B's own
  ``resume`` is not enforced and its internal step restarts per process: docs/ARCHITECTURE.md, field notes; the mark
  is ours.)
- A failure to initialise or log (no network, no key, server error) is caught: the sink reports
  ``status == "pending"`` with the error, ``log`` returns False, and the run is not failed; the
  terminal receipt then says metrics are complete locally and pending remotely.
- One budget bounds what W&B can cost its caller: ``init_timeout_s`` (30 s by default) is the most
  its callers block on W&B in all (waiting for a background start, then for ``finish``), of which
  :data:`TEARDOWN_S` is kept for closing W&B's service at interpreter exit (a graceful
  ``wandb.teardown``, then the service process is killed; an unreachable server otherwise keeps it
  waiting on its requests). So an unreachable W&B costs a command at most ``init_timeout_s`` over
  the same command offline (docs/ARCHITECTURE.md section 10).

:func:`read_offline_history` reads the logged rows back from an offline run's ``.wandb`` files
(:mod:`gradlab.metrics.wandb_files`).

Offline segments: every attempt of a run (every ``wandb.init``) writes its own offline folder with
the same run id, and ``wandb sync`` of those folders as they are keeps only the last segment's
history. So an offline run with more than one segment is *not* complete for W&B:
:meth:`WandbSink.complete` says so, and the terminal receipt lists ``wandb`` as pending
(docs/ARCHITECTURE.md section 10).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from gradlab.errors import ConfigError
from gradlab.metrics.wandb_files import (
    offline_segments,
    read_offline_history,
    read_offline_run,
    wait_for_exit_record,
)

logger = logging.getLogger(__name__)

WandbMode = Literal["disabled", "offline", "online"]
MODES = ("disabled", "offline", "online")

#: (glob, step metric) pairs passed to ``define_metric``.
AXES = (
    ("train/*", "train/global_step"),
    ("eval/*", "eval/checkpoint_step"),
    ("orchestration/*", "orchestration/event_seq"),
)


#: Seconds of a sink's budget kept for closing W&B's service at interpreter exit (at most half the
#: budget: a 4 s budget keeps 2 s).
TEARDOWN_S = 5.0
#: W&B's switch for its own product telemetry (error reporting; OpenTelemetry metrics and logs sent
#: to the W&B server). The sink sets it to ``false`` unless it is set already: the telemetry's exit
#: flush waits on the server with a 10 s timeout per request, outside any budget of W&B's.
TELEMETRY_ENV = "WANDB_ERROR_REPORTING"
_KILL_SHARE = 0.3  # of the reserve: for killing the service and the interpreter's own exit (a fraction)
_close_within_s = TEARDOWN_S  # the smallest reserve of any sink that armed the exit hook


def _service_processes() -> list[Any]:
    """W&B's service processes that are this process's own children (``psutil.Process``), running."""
    import psutil

    try:
        children = psutil.Process().children(recursive=False)
    except psutil.Error:
        return []
    services = []
    for child in children:
        try:
            if child.name() == "wandb-core" and child.status() != psutil.STATUS_ZOMBIE:
                services.append(child)
        except psutil.Error:  # ended meanwhile
            continue
    return services


def _close_service() -> None:
    """At interpreter exit: close W&B within the reserve (:data:`TEARDOWN_S`), killing its service
    if it has not ended by then.

    W&B's own exit hook waits for its service process without a bound, and a service that still has
    requests out to an unreachable server keeps the interpreter alive for as long as they take. This
    hook runs first: :func:`_arm_bounded_close` registers it with the threading module's shutdown
    hooks, which run before non-daemon threads are joined and before any ``atexit`` hook, whenever
    W&B registered its own. It calls ``wandb.teardown`` in a daemon thread (which unregisters W&B's
    hook at once), waits for the service to end, and kills a service still running. The service is
    found among this process's own children (``wandb-core``), so one whose start had not reached
    W&B's bookkeeping is found too. (W&B's product telemetry, whose exit flush has the same problem,
    is off: :data:`TELEMETRY_ENV`.)
    """
    import psutil

    deadline = time.monotonic() + _close_within_s
    services = _service_processes()
    if not services:
        return
    closing = None
    if getattr(sys.modules.get("wandb.sdk.wandb_setup"), "_singleton", None) is not None:
        import wandb

        closing = threading.Thread(target=wandb.teardown, name="wandb-teardown", daemon=True)
        closing.start()
    graceful_s = max(_close_within_s, 0.0) * (1 - _KILL_SHARE)
    try:
        _, alive = psutil.wait_procs(services, timeout=graceful_s)
        if alive:
            logger.warning("W&B's service did not close in %.1f s: stopped (pid %s)", graceful_s,
                           ", ".join(str(s.pid) for s in alive))
    except KeyboardInterrupt:  # a Ctrl-C while it closes: no graceful close, and no traceback
        alive = services
        logger.warning("W&B's service stopped at once (Ctrl-C while it closed)")
    for service in alive:
        try:
            service.kill()
        except psutil.Error:
            continue
    with contextlib.suppress(KeyboardInterrupt):
        psutil.wait_procs(alive, timeout=max(deadline - time.monotonic(), 0.0) / 2)
        if closing is not None:
            closing.join(max(deadline - time.monotonic(), 0.0))


_early_hook = False  # registered with the threading module's shutdown hooks


def _arm_bounded_close(reserve_s: float) -> None:
    """Make :func:`_close_service` run at exit before W&B's own exit hooks, with at most
    ``reserve_s`` seconds (the smallest reserve of any sink).

    It goes into the threading module's shutdown hooks (CPython's ``threading._register_atexit``,
    also used by ``concurrent.futures``), which run before non-daemon threads are joined and before
    every ``atexit`` hook; where those are unavailable (or shutdown has begun) it is (re-)registered
    as the last ``atexit`` hook, which runs first.
    """
    global _close_within_s, _early_hook
    _close_within_s = min(_close_within_s, reserve_s)
    if not _early_hook:
        try:
            threading._register_atexit(_close_service)  # type: ignore[attr-defined]
            _early_hook = True
        except (AttributeError, RuntimeError):
            pass
    atexit.unregister(_close_service)
    atexit.register(_close_service)  # a second pass: a service started after the first one


def start_service(mode: str) -> None:
    """Start W&B's service process (``wandb.setup()``, ~0.2 s: it starts ``wandb-core``) in a
    background thread, so the run's sink, created later, finds it up (``wandb.init`` then only
    opens the run). Nothing for ``disabled``; never raises (a failure is the sink's to report).

    The thread blocks SIGINT first, as the sink's own start does: the service inherits that mask,
    so a Ctrl-C in the terminal reaches only the supervisor. The exit hook that bounds W&B's close
    (:data:`TEARDOWN_S`) is armed with it.
    """
    if mode not in ("offline", "online"):
        return
    os.environ.setdefault(TELEMETRY_ENV, "false")

    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            import wandb

            wandb.setup()
        except Exception as e:  # noqa: BLE001 - W&B must never fail the run; the sink starts it again
            logger.debug("W&B's service did not start ahead of the run: %s", e)
        finally:
            _arm_bounded_close(TEARDOWN_S)

    threading.Thread(target=setup, name="wandb-service-start", daemon=True).start()


def resolve_api_key(settings: Any) -> str | None:
    """The W&B API key to hand to :class:`WandbSink` for ``online`` mode.

    ``WANDB_API_KEY`` in the environment wins (W&B reads it itself: None is returned); otherwise the
    config file's ``[wandb] api_key_ref`` secret reference is resolved (docs/ARCHITECTURE.md section 13).

    Returns:
        The key, or None when W&B should find it itself (environment, ``~/.netrc``).

    Raises:
        ConfigError: ``api_key_ref`` names an unset variable or keyring entry.
    """
    if os.environ.get("WANDB_API_KEY"):
        return None
    return settings.secret("wandb.api_key_ref")


def wandb_project(configured: str | None, spec: Any) -> str:
    """The W&B project of a run: the machine setting (``GRADLAB_WANDB_PROJECT``), else the recipe's
    ``logging.wandb_project`` when it is not the default ``gradlab``, else the goal's family (its
    project in ``experiments/goals/_catalog.yaml``), else ``gradlab``."""
    if configured:
        return configured
    recipe_project = spec.recipe.logging.wandb_project
    if recipe_project != "gradlab":
        return recipe_project
    try:
        from gradlab.contracts import Experiments

        return Experiments().catalog.project_of(spec.goal_id) or recipe_project
    except Exception as e:  # noqa: BLE001 - an unreadable catalog: the default project
        logger.debug("goal catalog unreadable (%s): W&B project %s", e, recipe_project)
        return recipe_project


class WandbSink:
    """Deliver outbox metric events to one W&B run (see the module docstring).

    Args:
        run_id: the gradlab run id, used as the W&B run id.
        mode: ``disabled`` | ``offline`` | ``online`` (never read from the environment here).
        dir: folder for W&B's files (``<dir>/wandb/offline-run-*-<run_id>/``).
        project: W&B project.
        config: run config shown in W&B (the resolved spec's hashes, recipe, seed...).
        entity, name, tags: W&B entity, display name, tags.
        group: W&B group (the run's leaders' cohort key: the runs of one cohort share it).
        high_water: the last ``event_seq`` already delivered (the outbox's mark for sink ``wandb``).
        init_timeout_s: the sink's budget in seconds: ``wandb.init``'s own timeout, and the most the
            caller blocks on W&B in all (:meth:`wait_ready` and :meth:`finish` together), less
            :data:`TEARDOWN_S` (at most half of it) kept for closing W&B's service at exit.
        finish_timeout_s: seconds :meth:`finish` waits for W&B to flush before reporting pending (at
            most what is left of the budget).
        api_key: the W&B API key for ``online`` mode (a resolved ``[wandb] api_key_ref``:
            :func:`resolve_api_key`), handed to ``wandb.init`` through ``wandb.Settings(api_key=)``
            and kept nowhere else; None lets W&B find its key itself (``WANDB_API_KEY``, ``~/.netrc``).
        background: initialise in a background thread (``wandb.init`` takes seconds: it starts W&B's
            service process); until it has, :meth:`log` returns False (nothing is lost: the caller
            keeps the events and delivers them later) and :meth:`finish` waits for it.

    Raises:
        ConfigError: ``mode`` is not one of the three modes, or the budget is not a finite number of
            seconds > 0. Nothing else: W&B failures are reported through :attr:`status` and :attr:`error`.
    """

    def __init__(
        self,
        run_id: str,
        mode: str,
        dir: Path | str,
        project: str,
        config: Mapping[str, Any] | None = None,
        *,
        entity: str | None = None,
        name: str | None = None,
        tags: list[str] | None = None,
        group: str | None = None,
        high_water: int = 0,
        init_timeout_s: float = 30.0,
        finish_timeout_s: float = 30.0,
        background: bool = False,
        api_key: str | None = None,
    ):
        if mode not in MODES:
            raise ConfigError(f"wandb mode: expected one of {', '.join(MODES)}, found {mode!r}")
        if not 0 < init_timeout_s < float("inf"):
            raise ConfigError(f"wandb budget (init_timeout_s): expected a finite number of seconds > 0, found {init_timeout_s!r}")
        self.run_id = run_id
        self.mode: WandbMode = mode  # type: ignore[assignment]
        self.dir = Path(dir)
        self.finish_timeout_s = finish_timeout_s
        self.init_timeout_s = init_timeout_s
        self.error: str | None = None
        self._reserve_s = min(TEARDOWN_S, init_timeout_s / 2)  # for closing W&B's service at exit
        self._wait_left = max(init_timeout_s - self._reserve_s, 0.0)  # what callers may still block on W&B
        self._high_water = high_water
        self._run: Any = None
        self._run_folder: Path | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._interrupted: Callable[[], bool] = lambda: False
        if mode == "disabled":
            self._ready.set()
            return
        os.environ.setdefault(TELEMETRY_ENV, "false")
        init = dict(project=project, entity=entity, name=name, tags=tags, group=group, config=config,
                    init_timeout_s=init_timeout_s, finish_timeout_s=finish_timeout_s,
                    api_key=api_key if mode == "online" else None)
        if background:
            threading.Thread(target=self._init, kwargs=init, name=f"wandb-init-{run_id}", daemon=True).start()
        else:
            self._init(**init)

    def _init(self, *, project, entity, name, tags, group, config, init_timeout_s, finish_timeout_s, api_key) -> None:
        run_id, mode = self.run_id, self.mode
        if threading.current_thread() is not threading.main_thread():
            # W&B's service process inherits this thread's signal mask: a Ctrl-C in the terminal
            # (sent to the whole process group) then leaves it running until finish() closes it.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            import wandb

            self.dir.mkdir(parents=True, exist_ok=True)
            run = wandb.init(
                id=run_id,
                project=project,
                entity=entity,
                name=name or run_id,
                tags=tags,
                group=group,
                config=dict(config or {}),
                dir=str(self.dir),
                mode=mode,
                resume="allow",
                reinit="create_new",
                settings=wandb.Settings(
                    init_timeout=init_timeout_s,
                    finish_timeout=finish_timeout_s,
                    silent=True,
                    console="off",  # stdout belongs to the CLI (`--json` prints the receipt last)
                    x_disable_stats=True,
                    **({"api_key": api_key} if api_key else {}),
                ),
            )
            self._run_folder = Path(run.dir).parent if mode == "offline" else None
            for glob, step_metric in AXES:
                run.define_metric(step_metric)
                run.define_metric(glob, step_metric=step_metric)
            self._run = run
        except Exception as e:  # noqa: BLE001 - W&B must never fail the run
            self._fail("init", e)
        finally:
            _arm_bounded_close(self._reserve_s)
            self._ready.set()

    @property
    def ready(self) -> bool:
        """True once initialisation has ended (successfully or not); :meth:`log` skips points before."""
        return self._ready.is_set()

    @property
    def wait_left_s(self) -> float:
        """Seconds of the budget its callers may still block on W&B (the exit's reserve excluded)."""
        return self._wait_left

    def interrupt_when(self, interrupted: Callable[[], bool]) -> None:
        """Stop every wait on W&B as soon as ``interrupted()`` is true (polled every 0.1 s: a Ctrl-C at
        the seal), giving W&B up (``pending``) as when the budget runs out."""
        self._interrupted = interrupted

    def _wait(self, done: Callable[[float], bool], seconds: float) -> bool:
        """``done(slice_s)`` waited for in slices until it is true, ``seconds`` pass or the wait is interrupted."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if done(max(min(left, 0.1), 0.0)):
                return True
            if left <= 0 or self._interrupted():
                return False

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds (at most what is left of the budget) for initialisation to
        end; True if it has. When the budget runs out first, or the wait is interrupted
        (:meth:`interrupt_when`), the sink gives W&B up (``pending``)."""
        if self._ready.is_set():
            return True
        wait_s = min(timeout_s, self._wait_left)
        started = time.monotonic()
        ready = self._wait(self._ready.wait, wait_s)
        self._spend(time.monotonic() - started)
        if not ready and self.error is None and (self._wait_left <= 0 or self._interrupted()):
            why = ("the wait for it was interrupted" if self._interrupted()
                   else f"W&B did not start within the sink's {self.init_timeout_s:g} s budget")
            self._fail("init", TimeoutError(why))
            _arm_bounded_close(self._reserve_s)  # the service may have started since init registered W&B's exit hook
        return ready

    def _spend(self, seconds: float) -> None:
        self._wait_left = max(self._wait_left - seconds, 0.0)

    def _fail(self, op: str, exc: BaseException) -> None:
        error = f"wandb {op} ({self.mode}, run {self.run_id}): {type(exc).__name__}: {exc}"
        if self.error is not None:  # the first failure is the cause (a start given up then ends this way)
            logger.debug("%s (after: %s)", error, self.error)
            return
        self.error = error
        logger.warning("%s; metrics stay complete locally and pending for W&B", self.error)

    @property
    def status(self) -> Literal["disabled", "ok", "pending"]:
        """``disabled``; ``ok`` (every event given to :meth:`log` was accepted); ``pending`` (W&B failed)."""
        if self.mode == "disabled":
            return "disabled"
        return "pending" if self.error is not None else "ok"

    @property
    def high_water(self) -> int | None:
        """The last ``event_seq`` delivered to W&B; None when disabled (the receipt's ``sinks.wandb``)."""
        return None if self.mode == "disabled" else self._high_water

    def log(self, event_seq: int, metrics: Mapping[str, Any]) -> bool:
        """Log one outbox event at W&B step ``event_seq``.

        Returns:
            True when W&B accepted the point; False when skipped (``event_seq`` at or below the
            high-water mark: a replay), disabled, or W&B has failed (``status == "pending"``).
        """
        with self._lock:
            if not self._ready.is_set() or self._run is None or self.error is not None or event_seq <= self._high_water:
                return False
            try:
                self._run.log({**metrics, "orchestration/event_seq": int(event_seq)}, step=int(event_seq))
            except Exception as e:  # noqa: BLE001 - W&B must never fail the run
                self._fail("log", e)
                return False
            self._high_water = int(event_seq)
            return True

    @property
    def segments(self) -> list[Path]:
        """This run's offline folders under ``dir``, oldest first (empty unless offline)."""
        return offline_segments(self.dir, self.run_id) if self.mode == "offline" else []

    def complete(self, local_high_water: int) -> bool:
        """Whether W&B truly holds every event up to ``local_high_water`` as one history.

        False when W&B failed (``pending``), is behind the journal, or (offline) the run's history
        is split over several offline segments, which syncing as they are would reduce to the last.
        """
        if self.mode == "disabled":
            return True
        if self.status == "pending" or self._high_water < local_high_water:
            return False
        return len(self.segments) <= 1

    def finish(self, timeout_s: float | None = None) -> None:
        """Flush and close the W&B run; never raises.

        Waits for a background start, then for W&B's flush at most ``timeout_s`` seconds each
        (default: the rest of the budget for the start, ``finish_timeout_s`` for the flush), and in
        all at most what is left of the sink's budget (``init_timeout_s`` less the exit's reserve).
        """
        if not self.wait_ready(self._wait_left if timeout_s is None else timeout_s):
            if self.error is None:
                self._fail("finish", TimeoutError("W&B was still starting"))
            return
        with self._lock:
            run, self._run = self._run, None
        if run is None:
            return
        finish_timeout_s = min(self.finish_timeout_s if timeout_s is None else timeout_s, self._wait_left)
        failure: list[BaseException] = []

        def close() -> None:
            try:
                run.finish()
            except BaseException as e:  # noqa: BLE001 - reported as pending
                failure.append(e)

        started = time.monotonic()
        deadline = started + finish_timeout_s
        thread = threading.Thread(target=close, name=f"wandb-finish-{self.run_id}", daemon=True)
        thread.start()
        self._wait(lambda s: (thread.join(s), not thread.is_alive())[1], finish_timeout_s)
        if thread.is_alive():
            self._fail("finish", TimeoutError("the wait for it was interrupted" if self._interrupted()
                                              else f"did not finish in {finish_timeout_s} s"))
        elif failure:
            self._fail("finish", failure[0])
        elif self._run_folder is not None and not wait_for_exit_record(self._run_folder, deadline):
            # wandb-core writes the transaction log after run.finish() returns: wait for its exit record
            # so an offline run's points are on disk when the sink reports them delivered.
            self._fail("finish", TimeoutError(f"{self._run_folder}: transaction log not flushed in time"))
        self._spend(time.monotonic() - started)

    def __enter__(self) -> WandbSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()


__all__ = ["AXES", "MODES", "TEARDOWN_S", "WandbMode", "WandbSink", "offline_segments", "read_offline_history",
           "read_offline_run", "resolve_api_key", "start_service", "wandb_project"]
