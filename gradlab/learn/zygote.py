"""A warm learner parent (the "zygote"): a learner's imports paid once, learners forked on request.

A fresh learner process needs ~5 s on a 2-core box before its first env step, nearly all of it
imports: torch (~2.7 s), stable-baselines3, and ``torch._dynamo`` (~2 s), which torch imports on
the first call of any optimizer method (``torch._disable_dynamo`` in ``torch/_compile.py``). The
zygote pays that once: it imports what a learner needs (:data:`PRELOAD`), then waits on a Unix
socket; each request forks a child that becomes the learner and runs ``python -m gradlab.learn``'s
``main`` with the request's arguments. The idea is Python's ``multiprocessing`` forkserver with
preloaded modules (and Android's zygote). The zygote never touches CUDA or starts torch threads,
so a fork is safe; a child initialises CUDA itself.

A forked learner is set up exactly like a started one: its own session (``setsid``; its pid is
its process group, so the three-step stop of ``gradlab.runs.process`` applies), stdin from
``/dev/null``, stdout and stderr appended to the run's ``learner.log``, the requester's
environment and working directory, default signal handlers. Its parent is the zygote, not the
supervisor, so the supervisor passes ``--parent-pid`` and the learner watches that process
(``gradlab.learn.watch``); the zygote reaps its children.

Lifetime: the local Prefect server's daemon (``gradlab.runs.daemon``, started by the first command
that needs Prefect or by ``gradlab server start``) starts one as the server starts, with itself as
keeper (forked off the warm flow's imports when both are missing: :func:`start_zygote`'s
``learner_dir``); it exits when the keeper is gone (``gradlab server stop``, the idle timeout), on
SIGTERM, or when retired because gradlab's code or the Python environment changed since it
started (a requester compares :func:`fingerprint` and retires a stale zygote instead of using it).

Files in the zygote folder (``$GRADLAB_HOME/zygote``)::

    <pid>.pending   written by the starter: a zygote is importing (removed once ready or gone)
    <pid>.json      ZygoteInfo: ready to fork (removed when the zygote exits)
    zygote.log      the zygotes' own log lines (appended)

Protocol: one JSON line each way on the zygote's socket (Linux abstract namespace).
Request ``{"op": "fork", "argv": [...], "env": {...}, "cwd": "...", "log": "learner.log path",
"exit_file": "path with {pid}" or null}`` → ``{"pid": N}`` once the child has its own session, or
``{"error": "..."}``. When the child ends, the zygote writes its exit code to ``exit_file``.
Request ``{"op": "retire"}`` → ``{"ok": true}`` and the zygote exits.

This module holds the files, the protocol's constants and the requester side (finding, starting,
asking, retiring and stopping zygotes); the zygote process itself, the serving side, is
:mod:`gradlab.learn.zygote_server` (:data:`LEARNER_MODULE`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from gradlab.learn.watch import pid_alive

log = logging.getLogger(__name__)

#: The module a learner zygote runs as (``python -m``: :mod:`gradlab.learn.zygote_server`); a warm
#: supervising flow is a zygote too (``gradlab.cli.warm_flow``, docs/ARCHITECTURE.md section 11),
#: kept in its own folder.
LEARNER_MODULE = "gradlab.learn.zygote_server"
FLOW_MODULE = "gradlab.cli.warm_flow"

#: Per zygote module: the packages whose sources its fingerprint covers, and extra distributions.
KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    LEARNER_MODULE: (("gradlab",), ()),
    FLOW_MODULE: (("gradlab", "flows", "tasks"), ("prefect",)),
}

#: What a learner and the warm flow's evaluation workers both import: a warm flow that starts the
#: learner zygote imports these once, then forks it off them (:func:`start_zygote`).
SHARED_PRELOAD = ("torch", "stable_baselines3", "gymnasium", "safetensors.torch", "gradlab.envs.vector",
                  "gradlab.envs.sb3")

#: Modules a learner imports before its first env step. ``torch._dynamo`` (~1 s of CPU here) is
#: imported by the first optimizer a process builds: a learner's, not an evaluation's.
PRELOAD = (*SHARED_PRELOAD, "torch._dynamo", "gradlab.learn.learner", "gradlab.learn.sb3")

#: Environment variables read when those modules are imported (thread pools, CUDA, the import
#: path): a zygote only forks for a requester whose values are the same.
IMPORT_ENV_PREFIXES = ("OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "CUDA_", "NVIDIA_", "PYTORCH_", "TORCH",
                       "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONOPTIMIZE", "LD_")

#: Seconds a requester waits for the zygote's answer (the fork itself takes milliseconds), and the
#: zygote for the requester's confirmation.
REQUEST_TIMEOUT_S = 10.0

#: Seconds between the zygote's looks at its children: a supervisor learns a forked learner's
#: exit code from the record the zygote writes once it has reaped it, so this is on a run's
#: critical path (an idle zygote's wake-ups cost nothing measurable).
REAP_S = 0.05

#: Seconds the zygote waits for a request line after a connection (a requester writes at once).
READ_TIMEOUT_S = 2.0


class ZygoteInfo(BaseModel):
    """What a ready zygote publishes in ``<pid>.json``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pid: int
    address: str
    fingerprint: str
    import_env: dict[str, str]
    #: Import-sensitive variables the zygote's own imports set (value after them): a requester
    #: that imported the same libraries carries them too and still matches (:meth:`serves`).
    set_by_imports: dict[str, str] = {}
    keeper_pid: int | None
    ready_at: float

    def serves(self, wanted_env: dict[str, str]) -> bool:
        """True when a requester whose import-sensitive variables are ``wanted_env``
        (:func:`import_env`) gets what this zygote imported with: the same values, where a value the
        zygote's own imports set (:attr:`set_by_imports`) counts as the one it started with."""
        undone = {}
        for key, value in wanted_env.items():
            if self.set_by_imports.get(key) == value:  # the zygote's imports set it: undo to its start value
                value = self.import_env.get(key)
            if value is not None:
                undone[key] = value
        return undone == self.import_env


def zygote_dir(home: Path) -> Path:
    """The zygote folder under the gradlab data directory."""
    return Path(home) / "zygote"


def flow_zygote_dir(home: Path) -> Path:
    """The warm supervising flow's zygote folder (``$GRADLAB_HOME/zygote/flow``)."""
    return zygote_dir(home) / "flow"


def kind_fingerprint(module: str = LEARNER_MODULE) -> str:
    """:func:`fingerprint` over what a zygote running as ``module`` has imported (:data:`KINDS`)."""
    packages, dists = KINDS[module]
    return fingerprint(packages, dists)


def import_env(env: dict[str, str] | os._Environ) -> dict[str, str]:
    """The import-sensitive part of an environment (:data:`IMPORT_ENV_PREFIXES`)."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_ENV_PREFIXES)}


#: In a process a zygote forked: the import-sensitive variables of the requester it serves
#: (:func:`adopt_launch_env`); ``/proc/self/environ`` there is the zygote's, not the requester's.
_adopted_import_env: dict[str, str] | None = None


def adopt_launch_env(env: dict[str, str]) -> None:
    """Record, in a child a zygote forked, the environment it was asked to run with as the one it
    was launched with (:func:`launch_import_env`)."""
    global _adopted_import_env
    _adopted_import_env = import_env(env)


def launch_import_env() -> dict[str, str]:
    """The import-sensitive variables (:func:`import_env`) this process was started with.

    ``os.environ`` is not that: a library imported here may have changed it for itself (OpenCV,
    imported under SB3, prepends its folder to ``LD_LIBRARY_PATH``; torch sets
    ``TORCHINDUCTOR_CACHE_DIR``). A zygote started, or asked to fork, with those would import or
    run with other settings than the user's shell gives, so requesters compare and pass these.
    Linux reads ``/proc/self/environ`` (the environment at ``exec``); elsewhere, ``os.environ``.
    """
    if _adopted_import_env is not None:
        return dict(_adopted_import_env)
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return import_env(os.environ)
    started = dict(item.split("=", 1) for item in raw.decode(errors="surrogateescape").split("\0") if "=" in item)
    return import_env(started)


def launch_environ() -> dict[str, str]:
    """``os.environ`` with its import-sensitive variables as this process was started with them
    (:func:`launch_import_env`): the environment to start or fork a learner or zygote with."""
    current = {k: v for k, v in os.environ.items() if k not in import_env(os.environ)}
    return {**current, **launch_import_env()}


def fingerprint(packages: tuple[str, ...] = ("gradlab",), dists: tuple[str, ...] = ()) -> str:
    """sha256 over the source files (path, size, mtime) of ``packages``, the interpreter and key
    package versions (torch, stable-baselines3, gymnasium, numpy, and ``dists``).

    A zygote whose fingerprint differs from the requester's would run other code than the
    requester's checkout: it is retired, not used. Costs a few milliseconds (one ``stat`` per file);
    the packages are located, not imported (``flows`` imports Prefect).
    """
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    h = hashlib.sha256()
    h.update(f"{sys.executable}\0{sys.version}\0".encode())
    for dist in ("torch", "stable-baselines3", "gymnasium", "numpy", *dists):
        try:
            h.update(f"{dist}={version(dist)}\0".encode())
        except PackageNotFoundError:
            h.update(f"{dist}=-\0".encode())
    for package in packages:
        spec = find_spec(package)
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            root = Path(location)
            h.update(f"{package}\0".encode())
            for path in sorted(root.rglob("*.py")):
                st = path.stat()
                h.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# Requester side


def ready_zygotes(directory: Path) -> list[ZygoteInfo]:
    """Ready zygotes in ``directory`` whose process is alive (stale files of dead ones are removed)."""
    found = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            info = ZygoteInfo.model_validate_json(path.read_bytes())
        except (OSError, ValueError):
            continue
        if _is_zygote(info.pid, directory):
            found.append(info)
        else:  # gone (or its pid now names another process): never signal it
            path.unlink(missing_ok=True)
    return found


def starting_zygotes(directory: Path) -> list[int]:
    """Pids of zygotes still importing (``<pid>.pending`` of a live process)."""
    pids = []
    for path in Path(directory).glob("*.pending"):
        try:
            pid = int(path.stem)
        except ValueError:
            continue
        try:  # only a file just written can name a process still in exec (a stale one may name a kernel thread)
            young = time.time() - path.stat().st_mtime < EXEC_GRACE_S
        except OSError:
            continue
        if _is_zygote(pid, directory, mid_exec=young):
            pids.append(pid)
        else:
            path.unlink(missing_ok=True)
    return pids


#: Seconds after its ``.pending`` was written during which a process with an empty command line
#: counts as a zygote still in ``execve`` (:func:`_is_zygote`); later, as not a zygote.
EXEC_GRACE_S = 10.0


#: Seconds a command waits at most for a zygote that is still importing: its own imports instead
#: would take as long (~5 s quiet, 20 s or more on a loaded 2-core box) beside the zygote's.
STARTING_WAIT_S = 90.0


def await_ready(directory: Path, *, timeout_s: float = STARTING_WAIT_S, appear_s: float = 0.0,
                starter_pid: int | None = None, on_wait: Callable[[], object] | None = None,
                poll_s: float = 0.05) -> list[ZygoteInfo]:
    """The ready zygotes of ``directory``, once there are any, waiting while one is still importing.

    Args:
        directory: a zygote folder (:func:`zygote_dir`, :func:`flow_zygote_dir`).
        timeout_s: waits at most this long, seconds.
        appear_s: also waits this long for a zygote to be started at all (a daemon that was just
            started starts its zygotes within a second); 0 = only a zygote already starting.
        starter_pid: the process that starts and keeps the zygotes (the daemon): once it is gone,
            nothing more is waited for (its zygotes exit as soon as their imports are done).
        on_wait: called once when there is something to wait for (nothing ready at the first look).
        poll_s: seconds between looks (a look reads a few small files).

    Returns:
        The ready zygotes (as :func:`ready_zygotes`); empty when none is ready or starting, or at
        the timeout.
    """
    started = time.monotonic()
    while True:
        directory_exists = Path(directory).is_dir()
        ready = ready_zygotes(directory) if directory_exists else []
        if ready:
            return ready
        waited = time.monotonic() - started
        starting = directory_exists and bool(starting_zygotes(directory))
        starter_gone = starter_pid is not None and not pid_alive(starter_pid)  # its zygotes exit once imported
        if waited >= timeout_s or starter_gone or (not starting and waited >= appear_s):
            return []
        if on_wait is not None:
            on_wait()
            on_wait = None
        time.sleep(poll_s)


def fork_learner(directory: Path, argv: list[str], *, log_path: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None, exit_file: str | None = None) -> int | None:
    """Have a ready zygote fork a learner running ``python -m gradlab.learn ARGV``.

    Args:
        directory: the zygote folder (:func:`zygote_dir`).
        argv: the learner's arguments (``--spec ... --run-dir ... --parent-pid ...``).
        log_path: the learner's stdout and stderr are appended here.
        env: the learner's environment (default: this process's).
        cwd: the learner's working directory (default: this process's).
        exit_file: where the zygote writes the learner's exit code once it has reaped it (``{pid}``
            is replaced by the learner's pid): the supervisor is not its parent and cannot wait for it.

    A zygote still importing is waited for (at most :data:`STARTING_WAIT_S`): the learner's own
    imports would take as long.

    Returns:
        The learner's pid (also its process group), or None when no zygote could serve: none
        ready or starting, all stale (retired on the way) or started with other import-time settings, or the
        request failed. The caller then starts a process the ordinary way.
    """
    env = dict(launch_environ() if env is None else env)
    wanted_env = import_env(env)
    mine = None
    for info in await_ready(directory):
        mine = mine or fingerprint()
        if info.fingerprint != mine:
            log.info("zygote %d runs other code than this checkout: retiring it", info.pid)
            retire(info)
            continue
        if not info.serves(wanted_env):
            log.info("zygote %d was started with other import-time settings: not used", info.pid)
            continue
        request = {"op": "fork", "argv": list(argv), "env": env, "cwd": str(cwd or Path.cwd()),
                   "log": str(log_path), "exit_file": exit_file}
        try:
            pid = _request_fork(info.address, request)
        except (OSError, ValueError) as e:
            log.warning("zygote %d did not fork a learner (%s): starting the learner the ordinary way", info.pid, e)
            continue
        return pid
    return None


def retire(info: ZygoteInfo) -> None:
    """Ask a zygote to exit (it finishes nothing: its forked learners are independent)."""
    try:
        _request(info.address, {"op": "retire"}, timeout_s=2.0)
    except (OSError, ValueError):
        _terminate(info.pid)


def start_zygote(directory: Path, *, keeper_pid: int | None, module: str = LEARNER_MODULE,
                 env: dict[str, str] | None = None, learner_dir: Path | None = None) -> int:
    """Start a zygote process in the background (its own session, environment ``env``, default
    this process's as it was started, :func:`launch_environ`); returns its pid.

    It is ready once ``<pid>.json`` appears (~5 s here); until then ``<pid>.pending`` says it is
    coming. It exits when ``keeper_pid`` (if given) is gone. ``learner_dir`` (a warm flow,
    :data:`FLOW_MODULE`, only): the process also starts that folder's learner zygote, forked off
    its own imports of torch and SB3 (``gradlab.learn.zygote_server.serve_detached``); its
    ``<pid>.pending`` is written there too, until the learner zygote's own replaces it.
    """
    directory = Path(directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", module, "--dir", str(directory)]
    if keeper_pid is not None:
        cmd += ["--keeper-pid", str(keeper_pid)]
    if learner_dir is not None:
        learner_dir = Path(learner_dir).absolute()
        learner_dir.mkdir(parents=True, exist_ok=True)
        cmd += ["--learner-dir", str(learner_dir)]
    with (directory / "zygote.log").open("ab") as out:
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, env=launch_environ() if env is None else env)
    for folder in (directory, learner_dir):
        if folder is not None:
            (folder / f"{popen.pid}.pending").write_text(str(time.time()))
    return popen.pid


def needs_zygote(directory: Path, *, module: str = LEARNER_MODULE, env: dict[str, str] | None = None) -> bool:
    """True unless a zygote of ``directory`` is ready with this checkout's code and the settings of
    ``env`` (default: :func:`launch_environ`) or one is starting; when True, the ready ones
    (stale) have been retired (each holds ~700 MB), so a folder keeps at most one."""
    env = launch_environ() if env is None else env
    mine, wanted = kind_fingerprint(module), import_env(env)
    ready = ready_zygotes(directory)
    if any(info.fingerprint == mine and info.serves(wanted) for info in ready) or starting_zygotes(directory):
        return False
    for info in ready:  # at most one zygote per folder: the newest code and settings win
        retire(info)
    return True


def ensure_zygote(directory: Path, *, keeper_pid: int | None, module: str = LEARNER_MODULE,
                  env: dict[str, str] | None = None) -> int | None:
    """Start a zygote unless one is ready with this checkout's code and settings or one is starting
    (:func:`needs_zygote`). Returns the pid of a zygote started now, else None."""
    env = launch_environ() if env is None else env
    if not needs_zygote(directory, module=module, env=env):
        return None
    return start_zygote(directory, keeper_pid=keeper_pid, module=module, env=env)


def stop_zygotes(directory: Path, *, grace_s: float = 5.0) -> int:
    """SIGTERM every zygote of ``directory`` (ready or starting), SIGKILL after ``grace_s``; how many."""
    pids = [info.pid for info in ready_zygotes(directory)] + starting_zygotes(directory)
    for pid in pids:
        _terminate(pid, grace_s=grace_s)
    for path in [*Path(directory).glob("*.json"), *Path(directory).glob("*.pending")]:
        path.unlink(missing_ok=True)
    clear_exit_records(directory)
    return len(pids)


def clear_exit_records(directory: Path) -> None:
    """Remove ``<child pid>.exit`` records (a warm flow's, of the commands it ran) whose child is
    gone: their requesters had their answer."""
    from gradlab.learn.watch import pid_alive

    for path in Path(directory).glob("*.exit"):
        try:
            if not pid_alive(int(path.stem)):
                path.unlink(missing_ok=True)
        except (ValueError, OSError):
            continue


def _request(address: str, payload: dict, timeout_s: float = REQUEST_TIMEOUT_S) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(address)
        s.sendall(json.dumps(payload).encode() + b"\n")
        answer = read_line(s)
    if not answer:
        raise ValueError("the zygote closed the connection without an answer")
    return json.loads(answer)


def _request_fork(address: str, payload: dict, timeout_s: float = REQUEST_TIMEOUT_S) -> int:
    """Ask for a learner, confirm it, and return its pid once the zygote says it runs.

    Raises:
        OSError: no answer in time (a learner forked meanwhile is killed by the zygote unborn).
        ValueError: the zygote answered with an error.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(address)
        s.sendall(json.dumps(payload).encode() + b"\n")
        answer = json.loads(read_line(s) or b"{}")
        if "pid" not in answer:
            raise ValueError(answer.get("error") or "no answer")
        s.sendall(b"go\n")
        if read_line(s) != b"ok":
            raise OSError(f"learner {answer['pid']} was not confirmed")
        return int(answer["pid"])


def read_line(s: socket.socket, limit: int = 16 << 20) -> bytes:
    """One line of the protocol from ``s``, stripped (b"" when the peer closed first); both sides use it.

    Raises:
        ValueError: the line is over ``limit`` bytes.
    """
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise ValueError(f"message over {limit} bytes")
    return data.strip()


def _is_zygote(pid: int, directory: Path, *, mid_exec: bool = False) -> bool:
    """True when ``pid`` is alive and is a zygote of ``directory`` (a recycled pid is not).

    ``mid_exec``: an empty command line also counts (a zygote just started, seen between the
    moment its starter's ``Popen`` returns and the kernel setting up its arguments: ``execve``
    closes the starter's error pipe before that)."""
    if not pid_alive(pid):
        return False
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return not Path("/proc/self").exists()  # no /proc here: liveness is all we can know
    if mid_exec and not raw:
        return True
    cmdline = raw.split(b"\0")
    return any(m.encode() in cmdline for m in KINDS) and str(Path(directory).absolute()).encode() in cmdline


def _terminate(pid: int, grace_s: float = 5.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):  # gone, or not ours to stop
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
