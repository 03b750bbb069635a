"""``gradlab train GOAL/RECIPE``: one training run through the ``training-run`` Prefect flow.

The learner is started at once, before Prefect is even imported, so training overlaps Prefect's
start-up (an ephemeral API server costs 12–20 s here; the local server kept in the background,
started by the first command that needs it, or one named by ``PREFECT_API_URL`` costs ~2 s). The
flow then attaches to the learner. With the local server up, the warm zygote beside it forks the
learner with torch and SB3 already imported (``gradlab.learn.zygote``), so the first env step
comes ~5 s sooner; and the warm flow beside it (``gradlab.cli.warm_flow``) takes the whole command
over, with Prefect and the flow already imported (docs/ARCHITECTURE.md section 11), so
publication, evaluation and the receipt do not wait for those imports either.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gradlab.cli.contracts_cmds import SetOption, resolve_or_exit, runnable_or_exit
from gradlab.cli.output import err_console, fail, print_json, say
from gradlab.errors import ConfigError


def configure_prefect() -> str:
    """Point Prefect at its API for this command; quiet its logs and telemetry.

    The API is ``PREFECT_API_URL`` / ``[prefect] api_url`` when configured, else the local server
    kept in the background (started now if none is up, which says so in one line on stderr; see
    :mod:`gradlab.runs.server`), else (``GRADLAB_DAEMON=0``, or it did not answer in time)
    Prefect's ephemeral server, started inside this command.

    Returns a short description of the API in use.
    """
    from gradlab.runs.server import PREFECT_CLIENT_DEFAULTS
    from gradlab.settings import load_settings

    settings = load_settings()
    # Quiet logs; Prefect's client telemetry (and its first-run notice, printed into the progress
    # display) off, as the server's analytics are; a user who wants it sets DO_NOT_TRACK=0.
    for key, value in PREFECT_CLIENT_DEFAULTS.items():
        os.environ.setdefault(key, value)
    # Prefect waits 20 s for its ephemeral server by default; a loaded 2-core box needs longer.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", f"{settings.server_start_timeout_s:.0f}")
    try:
        if os.environ.get("PREFECT_API_URL"):
            return os.environ["PREFECT_API_URL"]
        from gradlab.runs.server import ensure_server

        if settings.prefect_api_url:
            os.environ["PREFECT_API_URL"] = settings.prefect_api_url
            return settings.prefect_api_url
        state = ensure_server(settings, say=lambda line: err_console.print(escape(line), highlight=False))
        if state is not None:
            os.environ["PREFECT_API_URL"] = state.api_url
            return state.api_url
        why = "GRADLAB_DAEMON=0" if not settings.daemon else "no local server answered in time"
        return f"ephemeral ({why}: Prefect starts a server inside this command)"
    finally:
        _reread_prefect_settings()


def _reread_prefect_settings() -> None:
    """In a process that imported Prefect before this command's environment was set (the warm
    flow, ``gradlab.cli.warm_flow``): Prefect's settings and logging read again from it. Prefect
    reads its settings once, at import (``prefect.context.GLOBAL_SETTINGS_CONTEXT``)."""
    import sys

    if "prefect.context" not in sys.modules:
        return
    from gradlab.cli import warm_flow

    if warm_flow.imported_prefect_env() == warm_flow.prefect_env(os.environ):
        return  # imported with these very settings (the warm flow's usual case)
    from prefect.context import refresh_global_settings_context
    from prefect.logging.configuration import PROCESS_LOGGING_CONFIG, setup_logging

    refresh_global_settings_context()
    if PROCESS_LOGGING_CONFIG:
        setup_logging(incremental=False)


def run_flow(**params):
    """Call the training-run flow in this process; returns (receipt JSON or None, final Prefect state)."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.training_run import training_run

    # The engine joins a heartbeat thread at flow end (~1 s, docs/ARCHITECTURE.md, field notes): off for local runs.
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        state = training_run(**params, return_state=True)
    receipt = state.result(raise_on_failure=False) if state.is_completed() else None
    if not isinstance(receipt, dict):
        receipt = stored_receipt(params["run_id"]) if params.get("run_id") else None
    return receipt, state


def train(
    ref: Annotated[str, typer.Argument(help="GOAL/RECIPE, e.g. CartPole-v1/ppo.")],
    seed: Annotated[int, typer.Option(help="Run seed (lane seeds derive from it).")] = 0,
    overrides: SetOption = None,
    wandb: Annotated[str | None, typer.Option("--wandb", help="W&B mode: disabled, offline or online (default: the recipe's).")] = None,
    eval_backend: Annotated[str, typer.Option("--eval-backend", help="Evaluation backend: local or modal.")] = "local",
    no_eval: Annotated[bool, typer.Option("--no-eval", help="Train and publish only; nothing is promoted.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the terminal receipt as the last stdout line.")] = False,
    init_from: Annotated[str | None, typer.Option("--init-from", help="Warm start from a checkpoint: RUN[:STEP], a checkpoint folder or hf://OWNER/NAME (its sha256 is recorded as the run's parent).")] = None,
    init_optimizer: Annotated[bool, typer.Option("--init-optimizer", help="With --init-from: also start from the parent's optimizer state.")] = False,
) -> None:
    """Train GOAL/RECIPE as a supervised Prefect flow; exit 0 only if the terminal receipt says succeeded."""
    if init_optimizer and init_from is None:
        fail("--init-optimizer needs --init-from")
    if wandb is not None and wandb not in ("disabled", "offline", "online"):
        fail(f"--wandb: expected disabled, offline or online, found {wandb!r}")
    if eval_backend not in ("local", "modal"):
        fail(f"--eval-backend: expected local or modal, found {eval_backend!r}")
    from gradlab.contracts.goal import MAX_RUN_SEED

    if not 0 <= seed <= MAX_RUN_SEED:
        fail(f"--seed: expected 0..{MAX_RUN_SEED}, found {seed}")
    if eval_backend == "modal" and not no_eval and not (
            os.environ.get("MODAL_TOKEN_ID") or (Path.home() / ".modal.toml").is_file()):
        fail("--eval-backend modal: no Modal credentials (set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET, or run "
             "`modal token new`); use --eval-backend local to evaluate on this machine")
    if wandb == "online" and not _wandb_key_configured():
        fail("--wandb online: no W&B API key (set WANDB_API_KEY, [wandb] api_key_ref = \"env:NAME\" in the config "
             "file, or run `wandb login`); use --wandb offline to keep metrics locally and sync later")
    from gradlab.cli import warm_flow

    code = warm_flow.hand_off(_command_line(ref, seed, overrides, wandb, eval_backend, no_eval, json_out, init_from,
                                            init_optimizer))
    if code is not None:  # the warm flow ran it, with this command's terminal, environment and directory
        raise typer.Exit(code)
    started = time.monotonic()
    # Every contract problem, and an environment this machine cannot build, before anything is created.
    runnable_or_exit(resolve_or_exit(ref, overrides))
    from gradlab.contracts.run_spec import new_run_id
    from gradlab.runs import operations
    from gradlab.runs.process import LearnerProcess
    from gradlab.runs.server import warm_learner_dir
    from gradlab.settings import load_settings

    settings = load_settings()
    parent = resolve_init_from(init_from, ref=ref, overrides=list(overrides or []), optimizer=init_optimizer) \
        if init_from else None
    spec, paths = operations.prepare_spec(settings, recipe=ref, seed=seed, overrides=list(overrides or []),
                                          run_id=new_run_id(), evaluate=not no_eval, init_from=parent)
    learner = LearnerProcess.start(paths, zygote=warm_learner_dir(settings))
    _cancel_on_ctrl_c()
    if spec.evaluate and spec.goal.evaluation_mode == "evaluated":
        # The flow (in this process) takes its evaluation worker from here: it imports torch while
        # Prefect starts, instead of after, and is ready when the first checkpoint is published.
        operations.prewarm_evaluation(eval_backend)
    start = ("warm: forked by the warm learner" if learner.forked
             else "cold: a new process, ~5 s of imports; the local server's warm learner serves the next run"
             if settings.daemon else "cold: a new process, ~5 s of imports; GRADLAB_DAEMON=0 keeps no warm learner")
    err_console.print(f"run [bold]{spec.run_id}[/] ({escape(spec.display_name)}), learner pid {learner.pid} ({start})",
                      highlight=False)
    api = configure_prefect()
    err_console.print(f"Prefect API: {escape(api)}", highlight=False)
    display = LiveProgress(paths.outbox, spec.recipe.train.timesteps).start()
    receipt, state = None, None
    interrupted = False
    try:
        receipt, state = run_flow(recipe=ref, seed=seed, overrides=list(overrides or []), wandb_mode=wandb,
                                   eval_backend=eval_backend, evaluate=not no_eval, run_id=spec.run_id,
                                   learner_pid=learner.pid)
    except KeyboardInterrupt:
        interrupted = True
    except Exception as e:  # Prefect could not start, or lost its API mid-run
        display.stop()
        learner.stop("the supervising flow failed", grace_s=10.0)
        receipt = stored_receipt(spec.run_id)  # sealed before Prefect was lost: the receipt is what counts
        if receipt is not None:
            err_console.print(f"Prefect: the supervising flow ended with {type(e).__name__} ({escape(str(e))}); "
                              "the run's terminal receipt is sealed in the receipt store, and it is the run's "
                              "outcome:", highlight=False)
        elif _attempt_opened(spec.run_id):
            fail(f"run {spec.run_id}: the supervising flow failed ({type(e).__name__}: {e}). The run is in the "
                 f"receipt store with what it published: `gradlab runs retry {spec.run_id}` resumes it (or "
                 f"drains it if the learner had finished); `gradlab runs reconcile {spec.run_id}` closes it.")
        else:
            fail(f"run {spec.run_id}: the training-run flow could not start ({type(e).__name__}: {e}). "
                 f"Nothing was recorded in the receipt store; the learner's local files are in {paths.root}. "
                 "Start a Prefect server with `gradlab server start` (see `gradlab server status`; or set "
                 "PREFECT_API_URL) and run again.")
    finally:
        display.stop()
        if learner.exit_code() is None:  # the flow never took the learner over (e.g. it failed to start)
            learner.stop("the supervising flow ended", grace_s=10.0)
    if receipt is None:
        receipt = stored_receipt(spec.run_id)
    elapsed = time.monotonic() - started
    warm_flow.after_reply(lambda: _keep_zygote_warm(settings))
    if receipt is None:
        why = " (interrupted)" if interrupted else (f": {state.message}" if state is not None and state.message else "")
        if not _attempt_opened(spec.run_id):
            fail(f"run {spec.run_id}: stopped before the run was recorded{why}; nothing to reconcile")
        fail(f"run {spec.run_id}: no terminal receipt was sealed{why}; `gradlab runs reconcile {spec.run_id}` "
             "closes the attempt once its writer lease has expired (at most a minute)")
    _summary(receipt, elapsed)
    if json_out:
        print_json(receipt)
    raise typer.Exit(0 if receipt["outcome"] == "succeeded" else 1)


def _command_line(ref: str, seed: int, overrides: list[str] | None, wandb: str | None, eval_backend: str,
                  no_eval: bool, json_out: bool, init_from: str | None, init_optimizer: bool) -> list[str]:
    """``train``'s arguments as a command line (what the warm flow runs)."""
    argv = ["train", ref, "--seed", str(seed), "--eval-backend", eval_backend]
    for override in overrides or []:
        argv += ["--set", override]
    if wandb is not None:
        argv += ["--wandb", wandb]
    if init_from is not None:
        argv += ["--init-from", init_from]
    argv += ["--no-eval"] * no_eval + ["--json"] * json_out + ["--init-optimizer"] * init_optimizer
    return argv


def resolve_init_from(source: str, *, ref: str, overrides: list[str], optimizer: bool):
    """The verified parent checkpoint of a warm start, checked against the new run's spaces.

    ``source`` is ``RUN[:STEP]`` or a checkpoint folder (as ``gradlab eval`` reads them) or
    ``hf://OWNER/NAME`` (a published repository, hashes verified). Exits 1 with the error.
    """
    from gradlab.checkpoints.resolve import resolve_checkpoint
    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import InitFrom
    from gradlab.errors import GradlabError

    try:
        from gradlab.checkpoints import read_manifest, verify_checkpoint
        from gradlab.share.lineage import check_spaces

        if source.startswith("hf://"):  # weights-only files, every one verified against gradlab.json
            from gradlab.share.hub import load_repo

            folder = load_repo(source).checkpoint
            manifest = read_manifest(folder)
            if optimizer:
                fail(f"--init-optimizer: {source} is a published repository, which holds no optimizer state")
        else:
            folder = resolve_checkpoint(source, warn=say).path
            manifest = verify_checkpoint(folder)
        check_spaces(folder, Experiments().resolve(ref, overrides).environment, source=source)
    except GradlabError as e:
        fail(str(e))
    return InitFrom(source=source, checkpoint_sha256=manifest.sha256, checkpoint_step=manifest.step,
                    run_id=manifest.run_id, path=str(Path(folder).resolve()), optimizer=optimizer)


DUPLICATE_SIGINT_S = 0.5
"""A SIGINT this soon after the first is the same Ctrl-C delivered twice: once by the terminal to
the process group and once relayed by a parent in it (``uv run`` relays SIGINT when it has no
TTY), so it does not count as the second Ctrl-C."""


def _cancel_on_ctrl_c() -> None:
    """First Ctrl-C: cancel cleanly (the supervisor stops the learner and seals ``cancelled``);
    second (more than :data:`DUPLICATE_SIGINT_S` later): interrupt at once."""
    import signal
    import time

    from gradlab.runs.driver import USER_CANCEL, cancel_by_user

    first: list[float] = []

    def on_sigint(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
        if USER_CANCEL.is_set():
            if first and time.monotonic() - first[0] < DUPLICATE_SIGINT_S:
                return
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        first.append(time.monotonic())
        cancel_by_user()
        err_console.print("cancelling: the learner stops and a cancelled receipt is sealed "
                          "(Ctrl-C again to abort at once, without a receipt)")

    signal.signal(signal.SIGINT, on_sigint)


def _attempt_opened(run_id: str) -> bool:
    """True when the receipt store holds an attempt of this run (False when it cannot be read)."""
    from gradlab.receipts import rules
    from gradlab.stores import open_stores

    try:
        return bool(rules.list_attempts(open_stores(), run_id))
    except Exception:  # noqa: BLE001 - the store is down: say what we know
        return False


def _keep_zygote_warm(settings) -> None:
    """With a local server up, make sure the warm learner and the warm flow are there for the next
    run (started after this run so that their imports do not compete with it)."""
    from gradlab.runs.server import running_server, warm_learner_dir, warm_processes

    try:
        state = running_server(settings)
        if state is not None and warm_learner_dir(settings) is not None:  # not for GRADLAB_DAEMON=0 alone
            warm_processes(settings.home, keeper_pid=state.pid, api_url=state.api_url)
    except OSError as e:  # a convenience for the next run: never fails this one
        err_console.print(f"could not start a warm learner for the next run: {escape(str(e))}")


def stored_receipt(run_id: str) -> dict | None:
    """The terminal receipt of the run's latest attempt from the receipt store (None if unsealed)."""
    from gradlab.receipts import rules
    from gradlab.stores import open_stores

    try:
        stores = open_stores()
        attempts = rules.list_attempts(stores, run_id)
        if attempts:
            receipt = rules.read_terminal(stores, run_id, attempts[-1].attempt_id)
            return receipt.model_dump(mode="json") if receipt is not None else None
    except Exception as e:  # noqa: BLE001 - reported as 'no receipt'
        err_console.print(f"cannot read the receipt store: {escape(str(e))}")
    return None


def _summary(receipt: dict, elapsed_s: float) -> None:
    from rich.table import Table

    colour = {"succeeded": "green", "cancelled": "yellow", "stopped": "yellow"}.get(receipt["outcome"], "red")
    table = Table(show_header=False, box=None)
    table.add_row("run", receipt["run_id"] + f" ({receipt['attempt_id']})")
    table.add_row("outcome", f"[{colour}]{receipt['outcome']}[/]: {escape(receipt['reason'])}")
    table.add_row("final step", str(receipt["final_step"]))
    table.add_row("checkpoints", str(len(receipt["checkpoints"])))
    evals = receipt["evaluations"]
    table.add_row("evaluations", ", ".join(f"{e['checkpoint_step']}: {e['status']}"
                                           + (f" ({e['return_mean']:.1f})" if e.get("return_mean") is not None else "")
                                           for e in evals) or "none")
    promo = receipt.get("promotion")
    table.add_row("promotion", f"step {promo['checkpoint_step']} ({promo['sha256'][:16]})" if promo else "none")
    metrics = receipt["metrics"]
    pending = f"; pending remotely: {', '.join(metrics['pending'])}" if metrics.get("pending") else ""
    table.add_row("metrics", f"{metrics['local_high_water']} events delivered locally{pending}")
    table.add_row("wall time", f"{elapsed_s:.1f} s")
    err_console.print(table)


def _wandb_key_configured() -> bool:
    """True when W&B can authenticate: WANDB_API_KEY, a ``[wandb] api_key_ref`` that resolves, or a key
    for api.wandb.ai in ~/.netrc. Exits 1 naming the reference when ``api_key_ref`` does not resolve."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    from gradlab.settings import load_settings

    try:
        if load_settings().secret("wandb.api_key_ref"):
            return True
    except ConfigError as e:
        fail(f"--wandb online: {e}")
    import netrc

    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _finishing(progress) -> str:
    """What a finished learner's run still waits for: the evaluations left and their expected time."""
    left, each = progress.evaluations_left, progress.eval_seconds_mean
    if not left:
        return "learner done, finishing"
    expected = f", ~{left * each:,.0f} s at {each:,.1f} s each" if each is not None else ""
    return f"learner done, {left} evaluation{'s' if left != 1 else ''} left{expected}"


def _progress_line(progress) -> str:
    """One line, most important first (so a narrow terminal cuts the least useful part)."""
    rate = progress.steps_per_s
    return " · ".join(filter(None, [
        f"step {progress.step:,}/{progress.timesteps:,}",
        f"accepted {progress.accepted}" + (f" (stop: {progress.stop})" if progress.stop else ""),
        _finishing(progress) if progress.finished else (f"{rate:,.0f} steps/s" if rate else None),
        f"return {progress.recent_return:.1f}" if progress.recent_return is not None else None,
        f"checkpoints {progress.checkpoints}, published {progress.published}, evaluated {progress.evaluated}",
    ]))


class _LinePrinter:
    """Progress off a terminal (a log file, CI): a line only when something changed. A milestone
    (checkpoint, publication, evaluation, stop, the learner's end) prints at once; steps and
    rate alone at most every ``every_s`` seconds; the same line is never printed twice."""

    def __init__(self, every_s: float = 10.0, out=None):
        self.every_s = every_s
        self.out = out or (lambda line: err_console.print(line, highlight=False))
        self.last_line: str | None = None
        self.last_milestones: tuple | None = None
        self.printed_at = float("-inf")

    def offer(self, progress, now: float) -> bool:
        """Print ``progress``'s line if it says something new; True when printed."""
        line = _progress_line(progress)
        if line == self.last_line:
            return False
        if progress.milestones == self.last_milestones and now - self.printed_at < self.every_s:
            return False
        self.out(line)
        self.last_line, self.last_milestones, self.printed_at = line, progress.milestones, now
        return True


class LiveProgress:
    """A run's progress on stderr from ``start()`` until ``stop()`` (:func:`_show_progress` in a
    thread); off a terminal, ``stop()`` prints the final line (the last periodic one may be 10 s
    old). ``stop()`` twice is harmless."""

    def __init__(self, outbox_path: Path, timesteps: int) -> None:
        self.outbox_path, self.timesteps = outbox_path, timesteps
        self._stop = threading.Event()
        self._printer = _LinePrinter()
        self._thread = threading.Thread(target=_show_progress, args=(outbox_path, timesteps, self._stop, self._printer),
                                        daemon=True)

    def start(self) -> LiveProgress:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=2)
        if not err_console.is_terminal:
            _print_final_progress(self.outbox_path, self.timesteps, self._printer)


def _print_final_progress(outbox_path, timesteps: int, printer: _LinePrinter) -> None:
    from gradlab.runs.progress import RunProgress

    try:
        printer.offer(RunProgress(outbox_path, timesteps).refresh(), float("inf"))
    except Exception:  # noqa: BLE001 - the display must never disturb the run
        pass


def _show_progress(outbox_path, timesteps: int, stop: threading.Event, printer: _LinePrinter | None = None) -> None:
    """Live progress on stderr: a rich progress bar on a terminal, else a line when something changed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from gradlab.runs.progress import RunProgress

    progress = RunProgress(outbox_path, timesteps)
    if not err_console.is_terminal:  # readings every second (for steps/s); a line only when it says something new
        printer = printer or _LinePrinter()
        while not stop.wait(1.0):
            try:
                printer.offer(progress.refresh(), time.monotonic())
            except Exception:  # noqa: BLE001 - the display must never disturb the run
                continue
        return
    columns = (BarColumn(bar_width=20), MofNCompleteColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"))
    with Progress(*columns, console=err_console, transient=False) as bar:
        task = bar.add_task("train", total=timesteps, info="")
        while not stop.wait(0.5):
            try:
                progress.refresh()
            except Exception:  # noqa: BLE001 - the display must never disturb the run
                continue
            info = _progress_line(progress).split(" · ", 1)[-1]  # the bar shows the step itself
            bar.update(task, completed=min(progress.step, timesteps), info=info)
