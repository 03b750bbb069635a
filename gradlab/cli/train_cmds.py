"""``gradlab train GOAL/RECIPE``: one training run through the ``training-run`` Prefect flow.

The learner is started at once, before Prefect is even imported, so training overlaps Prefect's
start-up (an ephemeral API server costs 12–20 s here; the local server kept in the background,
started by the first command that needs it, or one named by ``PREFECT_API_URL`` costs ~2 s). The
flow then attaches to the learner. With the local server up, the warm zygote beside it forks the
learner with torch and SB3 already imported (``gradlab.learn.zygote``), so the first env step
comes ~5 s sooner; and the warm flow beside it (``gradlab.cli.warm_flow``) takes the whole command
over, with Prefect and the flow already imported (docs/ARCHITECTURE.md section 11), so
publication, evaluation and the receipt do not wait for those imports either.

The hand-over is :mod:`gradlab.cli.warm_handoff`'s; running the flow in this process (Prefect's
API, Ctrl-C, the receipt) :mod:`gradlab.cli.local_flow`'s; the progress and summary on stderr
:mod:`gradlab.cli.run_display`'s.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gradlab.cli.contracts_cmds import SetOption, resolve_or_exit, runnable_or_exit
from gradlab.cli.local_flow import cancel_on_ctrl_c, configure_prefect, run_flow, stored_receipt
from gradlab.cli.output import err_console, fail, print_json, say, say_text
from gradlab.cli.run_display import LiveProgress, Starting, print_summary
from gradlab.errors import ConfigError, NotFound


def train(
    ref: Annotated[str, typer.Argument(metavar="GOAL/RECIPE", help="e.g. CartPole-v1/ppo.")],
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
    from gradlab.cli import warm_handoff

    started = warm_handoff.command_started()  # the user's wait counts from here, in the warm child too
    if init_optimizer and init_from is None:
        fail("--init-optimizer needs --init-from")
    if wandb is not None and wandb not in ("disabled", "offline", "online"):
        fail(f"--wandb: expected disabled, offline or online, found {wandb!r}")
    if eval_backend not in ("local", "modal"):
        fail(f"--eval-backend: expected local or modal, found {eval_backend!r}")
    if eval_backend == "modal" and not no_eval and not (
            os.environ.get("MODAL_TOKEN_ID") or (Path.home() / ".modal.toml").is_file()):
        fail("--eval-backend modal: no Modal credentials (set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET, or run "
             "`modal token new`); use --eval-backend local to evaluate on this machine")
    if wandb == "online" and not _wandb_key_configured():
        fail("--wandb online: no W&B API key (set WANDB_API_KEY, [wandb] api_key_ref = \"env:NAME\" in the config "
             "file, or run `wandb login`); use --wandb offline to keep metrics locally and sync later")
    from gradlab.contracts.seeds import MAX_RUN_SEED

    if not 0 <= seed <= MAX_RUN_SEED:
        fail(f"--seed: expected 0..{MAX_RUN_SEED}, found {seed}")
    _check_ref_files(ref)  # a mistyped GOAL/RECIPE starts nothing (the daemon, a server) and waits for nothing
    from gradlab.settings import load_settings

    settings = load_settings()
    started_daemon = _start_local_server(settings)
    try:
        code = None if not settings.daemon else warm_handoff.hand_off(
            _command_line(ref, seed, overrides, wandb, eval_backend, no_eval, json_out, init_from, init_optimizer),
            home=settings.home, started_daemon=started_daemon,
            starting_daemon=None if started_daemon else _daemon_starting(settings), started_at=started,
            say=say_text)
    except KeyboardInterrupt:  # while it waited for the warm flow: nothing was created yet
        server = (" The background Prefect server goes on starting for the next command (`gradlab server stop` "
                  "stops it).") if started_daemon else ""
        err_console.print(f"interrupted before the run was created: nothing was recorded.{server}", highlight=False)
        raise typer.Exit(130) from None
    if code is not None:  # the warm flow ran it, with this command's terminal, environment and directory
        raise typer.Exit(code)
    # Checked by whichever process runs the command (the warm flow's child runs this function too):
    # their imports define pydantic models, ~0.1 s a command handed off does not pay first.
    from gradlab.runs.timeouts import check_run_environment

    try:  # the environment's run settings, before anything is created
        check_run_environment()
    except ConfigError as e:
        fail(str(e))
    # Every contract problem, and an environment this machine cannot build, before anything is created.
    runnable_or_exit(resolve_or_exit(ref, overrides))
    from gradlab.contracts.run_spec import new_run_id
    from gradlab.runs import operations
    from gradlab.runs.process import LearnerProcess
    from gradlab.runs.server import warm_learner_dir

    parent = resolve_init_from(init_from, ref=ref, overrides=list(overrides or []), optimizer=init_optimizer) \
        if init_from else None
    spec, paths = operations.prepare_spec(settings, recipe=ref, seed=seed, overrides=list(overrides or []),
                                          run_id=new_run_id(), evaluate=not no_eval, init_from=parent)
    # Imports and envs now, overlapping Prefect's start-up; the first step once the flow's driver
    # watches (supervised from the first step, cold or warm: docs/ARCHITECTURE.md section 8).
    learner = LearnerProcess.start(paths, zygote=warm_learner_dir(settings), await_supervisor=True)
    cancel_on_ctrl_c()
    # W&B's service starts now, while Prefect starts the flow: the sink's start (~0.3 s more) is
    # then done before the drain, whose seal waits for it (docs/ARCHITECTURE.md section 11).
    operations.start_wandb_service(operations.wandb_mode(settings, spec, wandb))
    if spec.evaluate and spec.goal.evaluation_mode == "evaluated":
        # The flow (in this process) takes its evaluation worker from here: it imports torch while
        # Prefect starts, instead of after, and is ready when the first checkpoint is published.
        operations.prewarm_evaluation(eval_backend)
    start = _learner_start(learner.forked, settings)
    err_console.print(f"run [bold]{spec.run_id}[/] ({escape(spec.display_name)}), learner pid {learner.pid} ({start})",
                      highlight=False)
    # What the run waits for before its first step, and for how long, on the display from now on.
    starting = Starting()
    display = LiveProgress(paths.outbox, spec.recipe.train.timesteps, starting).start()
    from gradlab.runs.driver import USER_CANCEL
    from gradlab.runs.server import STARTED_DAEMON_ENV

    api = configure_prefect(waiting=lambda what, expected: starting.set(what, expected, since=started),
                            cancelled=USER_CANCEL.is_set)
    os.environ.pop(STARTED_DAEMON_ENV, None)  # this command's own: nothing it starts inherits it
    if USER_CANCEL.is_set():  # Ctrl-C while it waited for the server: before the flow, nothing is recorded
        display.stop()
        learner.stop("cancelled before its supervising flow started", grace_s=10.0)
        fail(f"run {spec.run_id}: cancelled (Ctrl-C) before its supervising flow started: nothing was recorded in "
             f"the receipt store; the learner's local files are in {paths.root}")
    err_console.print(f"Prefect API: {escape(api)}", highlight=False)
    starting.set(("the supervising flow (opening the attempt)" if os.environ.get(warm_handoff.CHILD_ENV) else
                  "the supervising flow (importing Prefect, opening the attempt)") if api.startswith("http")
                 else "Prefect's ephemeral server and the supervising flow (12-20 s on a quiet 2-core box, "
                      "up to a minute on a loaded one)")
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
    warm_handoff.after_reply(lambda: _keep_zygote_warm(settings))
    if receipt is None:
        why = " (interrupted)" if interrupted else (f": {state.message}" if state is not None and state.message else "")
        if not _attempt_opened(spec.run_id):
            fail(f"run {spec.run_id}: stopped before the run was recorded{why}; nothing to reconcile")
        fail(f"run {spec.run_id}: no terminal receipt was sealed{why}; `gradlab runs reconcile {spec.run_id}` "
             "closes the attempt once its writer lease has expired (at most a minute)")
    print_summary(receipt, elapsed)
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


def _attempt_opened(run_id: str) -> bool:
    """True when the receipt store holds an attempt of this run (False when it cannot be read)."""
    from gradlab import receipts as rules
    from gradlab.stores import open_stores

    try:
        return bool(rules.list_attempts(open_stores(), run_id))
    except Exception:  # noqa: BLE001 - the store is down: say what we know
        return False


def _learner_start(forked: bool, settings) -> str:
    """How the run's learner started, for the run's first line: forked warm, or cold and what keeps
    a warm learner for the next run (the local server's daemon, when one runs: the run starts its
    warm processes again if they are gone)."""
    from gradlab.runs.server import daemon_alive, warm_learner_dir

    cold = "cold: a new process, ~5 s of imports; "
    if forked:
        return "warm: forked by the warm learner"
    if warm_learner_dir(settings) is None:
        return cold + "GRADLAB_DAEMON=0 keeps no warm learner"
    if daemon_alive(settings):
        return cold + "the local server's warm learner serves the next run"
    return cold + ("no local server runs here to keep a warm learner (the Prefect API is the one PREFECT_API_URL "
                   "or [prefect] api_url names; `gradlab server start` starts a local one)")


def _check_ref_files(ref: str) -> None:
    """Exit 1 with the resolver's words when ``GOAL/RECIPE`` names no goal or recipe file (checked
    for existence only: their contents are checked where the run is prepared). Imports neither
    pydantic nor the composition machinery, so a fresh shell's daemon still starts as early."""
    from gradlab.contracts.tree import check_ref

    try:
        check_ref(ref)
    except (ConfigError, NotFound) as e:
        fail(str(e))


def _start_local_server(settings) -> int | None:
    """A fresh shell's first command: start the background daemon before anything else, so that its
    warm learner and warm flow import beside the server's start-up and this command hands itself
    to the warm flow (docs/ARCHITECTURE.md section 11); the daemon's pid, else None (one runs or is
    starting, ``GRADLAB_DAEMON=0``, a Prefect API of the user's, or this is the warm flow's child)."""
    from gradlab.cli import warm_handoff

    if (not settings.daemon or os.environ.get("PREFECT_API_URL") or settings.prefect_api_url
            or os.environ.get(warm_handoff.CHILD_ENV)):
        return None
    from gradlab.runs.server import STARTED_DAEMON_ENV, prefect_home, start_daemon

    try:
        pid = start_daemon(settings, say=say_text)
    except OSError as e:
        fail(f"cannot start the background Prefect server in {prefect_home(settings)}: {e.strerror or e} "
             "(GRADLAB_HOME must be writable; GRADLAB_DAEMON=0 runs without the background server)")
    if pid is not None:  # also for this process, should it run the flow itself after all
        os.environ[STARTED_DAEMON_ENV] = str(pid)
    return pid


def _daemon_starting(settings, appear_s: float = 5.0) -> int | None:
    """The pid of a background daemon another command is starting (its server does not answer yet);
    one that holds the start lock but has not written ``server.json`` yet (it does so first
    thing) is waited for up to ``appear_s`` seconds."""
    import time

    from gradlab.runs.server import daemon_alive, read_state

    deadline = time.monotonic() + appear_s
    while (state := read_state(settings)) is None and time.monotonic() < deadline and daemon_alive(settings):
        time.sleep(0.05)
    return state.pid if state is not None and not state.ready and daemon_alive(settings) else None


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
