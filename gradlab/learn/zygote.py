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
that needs Prefect or by ``gradlab server start``) starts one once the server answers, with itself
as keeper; it exits when the keeper is gone (``gradlab server stop``, the idle timeout), on
SIGTERM, or when retired because gradlab's code or the Python environment changed since it started (a requester compares
:func:`fingerprint` and retires a stale zygote instead of using it).

Files in the zygote folder (``$GRADLAB_HOME/zygote``)::

    <pid>.pending   written by the starter: a zygote is importing (removed once ready or gone)
    <pid>.json      ZygoteInfo: ready to fork (removed when the zygote exits)
    zygote.log      the zygotes' own log lines (appended)

Protocol: one JSON line each way on the zygote's socket (Linux abstract namespace).
Request ``{"op": "fork", "argv": [...], "env": {...}, "cwd": "...", "log": "learner.log path",
"exit_file": "path with {pid}" or null}`` → ``{"pid": N}`` once the child has its own session, or
``{"error": "..."}``. When the child ends, the zygote writes its exit code to ``exit_file``.
Request ``{"op": "retire"}`` → ``{"ok": true}`` and the zygote exits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from gradlab.learn.watch import pid_alive

log = logging.getLogger(__name__)

#: The module a learner zygote runs as (``python -m``); a warm supervising flow is a zygote too
#: (``gradlab.cli.warm_flow``, docs/ARCHITECTURE.md section 11), kept in its own folder.
LEARNER_MODULE = "gradlab.learn.zygote"
FLOW_MODULE = "gradlab.cli.warm_flow"

#: Per zygote module: the packages whose sources its fingerprint covers, and extra distributions.
KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    LEARNER_MODULE: (("gradlab",), ()),
    FLOW_MODULE: (("gradlab", "flows", "tasks"), ("prefect",)),
}

#: Modules a learner imports before its first env step, heaviest first.
PRELOAD = (
    "torch", "torch._dynamo", "stable_baselines3", "gymnasium", "safetensors.torch",
    "gradlab.learn.learner", "gradlab.learn.sb3", "gradlab.envs.vector", "gradlab.envs.sb3",
)

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
    keeper_pid: int | None
    ready_at: float


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
        if _is_zygote(pid, directory):
            pids.append(pid)
        else:
            path.unlink(missing_ok=True)
    return pids


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

    Returns:
        The learner's pid (also its process group), or None when no zygote could serve: none
        ready, all stale (retired on the way) or started with other import-time settings, or the
        request failed. The caller then starts a process the ordinary way.
    """
    env = dict(os.environ if env is None else env)
    wanted_env = import_env(env)
    mine = None
    for info in ready_zygotes(directory):
        mine = mine or fingerprint()
        if info.fingerprint != mine:
            log.info("zygote %d runs other code than this checkout: retiring it", info.pid)
            retire(info)
            continue
        if info.import_env != wanted_env:
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
                 env: dict[str, str] | None = None) -> int:
    """Start a zygote process in the background (its own session, environment ``env``, default
    this process's); returns its pid.

    It is ready once ``<pid>.json`` appears (~5 s here); until then ``<pid>.pending`` says it is
    coming. It exits when ``keeper_pid`` (if given) is gone.
    """
    directory = Path(directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", module, "--dir", str(directory)]
    if keeper_pid is not None:
        cmd += ["--keeper-pid", str(keeper_pid)]
    with (directory / "zygote.log").open("ab") as out:
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, env=env)
    (directory / f"{popen.pid}.pending").write_text(str(time.time()))
    return popen.pid


def ensure_zygote(directory: Path, *, keeper_pid: int | None, module: str = LEARNER_MODULE,
                  env: dict[str, str] | None = None) -> int | None:
    """Start a zygote unless one is ready with this checkout's code and settings or one is starting;
    the others are retired first (each holds ~700 MB), so a folder keeps at most one.

    Returns the pid of a zygote started now, else None.
    """
    mine, wanted = kind_fingerprint(module), import_env(os.environ if env is None else env)
    ready = ready_zygotes(directory)
    if any(info.fingerprint == mine and info.import_env == wanted for info in ready) or starting_zygotes(directory):
        return None
    for info in ready:  # at most one zygote per folder: the newest code and settings win
        retire(info)
    return start_zygote(directory, keeper_pid=keeper_pid, module=module, env=env)


def stop_zygotes(directory: Path, *, grace_s: float = 5.0) -> int:
    """SIGTERM every zygote of ``directory`` (ready or starting), SIGKILL after ``grace_s``; how many."""
    pids = [info.pid for info in ready_zygotes(directory)] + starting_zygotes(directory)
    for pid in pids:
        _terminate(pid, grace_s=grace_s)
    for path in [*Path(directory).glob("*.json"), *Path(directory).glob("*.pending")]:
        path.unlink(missing_ok=True)
    return len(pids)


def _request(address: str, payload: dict, timeout_s: float = REQUEST_TIMEOUT_S) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(address)
        s.sendall(json.dumps(payload).encode() + b"\n")
        answer = _read_line(s)
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
        answer = json.loads(_read_line(s) or b"{}")
        if "pid" not in answer:
            raise ValueError(answer.get("error") or "no answer")
        s.sendall(b"go\n")
        if _read_line(s) != b"ok":
            raise OSError(f"learner {answer['pid']} was not confirmed")
        return int(answer["pid"])


def _read_request(s: socket.socket, max_fds: int = 3, limit: int = 16 << 20) -> tuple[bytes, list[int]]:
    """One request line and the descriptors sent with it (``SCM_RIGHTS``, on its first bytes)."""
    data, fds, _, _ = socket.recv_fds(s, 65536, max_fds)
    while data and not data.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            _close_all(fds)
            raise ValueError(f"message over {limit} bytes")
    return data.strip(), list(fds)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


def _read_line(s: socket.socket, limit: int = 16 << 20) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise ValueError(f"message over {limit} bytes")
    return data.strip()


def _is_zygote(pid: int, directory: Path) -> bool:
    """True when ``pid`` is alive and is a zygote of ``directory`` (a recycled pid is not)."""
    if not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return not Path("/proc/self").exists()  # no /proc here: liveness is all we can know
    return any(m.encode() in cmdline for m in KINDS) and str(Path(directory).absolute()).encode() in cmdline



def _terminate(pid: int, grace_s: float = 5.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# --------------------------------------------------------------------------------------------
# Zygote side


class _Zygote:
    """A zygote's serving loop. Subclasses (the warm flow, ``gradlab.cli.warm_flow``) set
    :attr:`module` and :attr:`preload` and add ops in :meth:`_op`."""

    module = LEARNER_MODULE
    preload: tuple[str, ...] = PRELOAD

    def __init__(self, directory: Path, keeper_pid: int | None) -> None:
        from gradlab.learn.watch import ProcessWatch

        self.directory = directory
        self.keeper = ProcessWatch(keeper_pid) if keeper_pid else None
        self.keeper_pid = keeper_pid
        self.stopping = False
        self.info_path = directory / f"{os.getpid()}.json"
        self.children: dict[int, str | None] = {}  # pid -> where to record its exit status

    def serve(self) -> int:
        started = time.monotonic()
        env_at_start = import_env(os.environ)  # before the imports: torch sets some variables itself
        code = kind_fingerprint(self.module)  # before the imports too: a file edited meanwhile makes it stale
        for name in self.preload:
            __import__(name)
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():  # a forked child could not use CUDA ("bad fork")
            log.error("CUDA was initialised while preloading: a zygote cannot serve; exiting")
            return 1
        import threading

        if threading.active_count() > 1:  # a fork copies only the forking thread: locks held elsewhere stay held
            log.error("threads %s were started while preloading: a zygote cannot fork safely; exiting",
                      [t.name for t in threading.enumerate()])
            return 1
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        address = f"\0gradlab-zygote-{os.getpid()}-{secrets.token_hex(8)}"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(16)
        listener.settimeout(REAP_S)
        info = ZygoteInfo(pid=os.getpid(), address=address, fingerprint=code,
                          import_env=env_at_start, keeper_pid=self.keeper_pid, ready_at=time.time())
        partial = self.info_path.with_suffix(".partial")
        partial.write_text(info.model_dump_json())
        os.replace(partial, self.info_path)
        (self.directory / f"{os.getpid()}.pending").unlink(missing_ok=True)
        log.info("zygote %d ready after %.1f s (keeper %s)", os.getpid(), time.monotonic() - started, self.keeper_pid)
        try:
            while not self.stopping:
                self._reap()
                if self.keeper is not None and not self.keeper.alive():
                    log.info("keeper %d is gone: exiting", self.keeper_pid)
                    break
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                except InterruptedError:  # pragma: no cover - PEP 475 retries
                    continue
                with conn:
                    self._handle(conn, listener)
        finally:
            self.info_path.unlink(missing_ok=True)
            listener.close()
        return 0

    def _on_term(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        self.stopping = True

    def _reap(self) -> None:
        for pid, exit_file in list(self.children.items()):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, None
            if not done:
                continue
            del self.children[pid]
            if exit_file and status is not None:
                # As subprocess reports it: the exit status, or minus the signal that ended it.
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.waitstatus_to_exitcode(status)
                try:
                    partial = Path(f"{exit_file}.partial")
                    partial.write_text(str(code))
                    os.replace(partial, exit_file)
                except OSError as e:
                    log.warning("learner %d exited with %d; could not record it in %s: %s", pid, code, exit_file, e)

    def _handle(self, conn: socket.socket, listener: socket.socket) -> None:
        # Only processes of this user may ask (an abstract socket has no file permissions).
        pid_uid_gid = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        peer_pid, peer_uid, _ = struct.unpack("3i", pid_uid_gid)
        if peer_uid != os.getuid():
            log.warning("request from pid %d of uid %d refused (this zygote serves uid %d)", peer_pid, peer_uid,
                        os.getuid())
            return
        conn.settimeout(READ_TIMEOUT_S)  # a requester writes at once; a silent one must not stall others
        fds: list[int] = []
        try:
            line, fds = _read_request(conn)
            request = json.loads(line or b"{}")
        except (OSError, ValueError) as e:
            log.warning("bad request: %s", e)
            _close_all(fds)
            return
        try:
            if not isinstance(request, dict):
                conn.sendall(json.dumps({"error": "expected a JSON object"}).encode() + b"\n")
                return
            op = request.get("op")
            if op == "retire":
                self.stopping = True
                conn.sendall(b'{"ok": true}\n')
                return
            if op == "fork":
                self._fork_learner(conn, listener, request)
                return
            if not self._op(op, request, conn, listener, fds):
                conn.sendall(json.dumps({"error": f"unknown op {op!r}"}).encode() + b"\n")
        finally:
            _close_all(fds)  # the zygote's copies (a forked child has dup'ed what it keeps)

    def _op(self, op: str, request: dict, conn: socket.socket, listener: socket.socket, fds: list[int]) -> bool:
        """A subclass's own request ``op`` (``fds``: descriptors sent with it); False if unknown."""
        return False

    def _fork_learner(self, conn: socket.socket, listener: socket.socket, request: dict) -> None:
        try:
            argv = [str(a) for a in request["argv"]]
            env = {str(k): str(v) for k, v in request["env"].items()}
            cwd, log_path = str(request["cwd"]), str(request["log"])
            exit_template = request.get("exit_file")
        except (KeyError, AttributeError, TypeError) as e:
            conn.sendall(json.dumps({"error": f"malformed fork request: {e}"}).encode() + b"\n")
            return

        def become(ready_w: int, go_r: int) -> None:
            _become_learner(argv, env, cwd, log_path, ready_w, go_r, close=(listener, conn))

        self._fork_confirmed(conn, become, exit_template=exit_template, what="learner", detail=" ".join(argv))

    def _fork_confirmed(self, conn: socket.socket, become: Callable[[int, int], None], *, exit_template: str | None,
                        what: str, detail: str) -> int | None:
        """Fork a child that runs ``become(ready_w, go_r)`` (it writes b"1" to ``ready_w`` once set up,
        then waits for b"g" on ``go_r``); answer ``{"pid"}``, and let the child run only once the
        requester confirms (``go`` → ``ok``). Returns the child's pid, or None (killed unborn)."""
        for stream in (sys.stdout, sys.stderr):  # else the child would print the zygote's buffered lines
            stream.flush()
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(ready_r)
            os.close(go_w)
            become(ready_w, go_r)
            os._exit(1)
        os.close(ready_w)
        os.close(go_r)
        self.children[pid] = str(exit_template).replace("{pid}", str(pid)) if exit_template else None
        with os.fdopen(ready_r, "rb") as ready:
            status = ready.read()
        with os.fdopen(go_w, "wb", buffering=0) as go:
            if status != b"1":
                conn.sendall(json.dumps({"error": status.decode(errors="replace") or "the child died"}).encode() + b"\n")
                return None
            # The requester confirms it still wants this child (it may have given up waiting and
            # started one of its own): only then does the child run; otherwise it is killed unborn.
            # "ok" goes out before the child runs: a child that keeps the connection (the warm
            # flow) writes on it only after the zygote's last word.
            try:
                conn.settimeout(REQUEST_TIMEOUT_S)
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                confirmed = _read_line(conn) == b"go"
                if confirmed:
                    conn.sendall(b"ok\n")
                    go.write(b"g")
            except OSError:
                confirmed = False
        if confirmed:
            log.info("forked %s %d (%s)", what, pid, detail)
            return pid
        log.warning("requester of %s %d went away before confirming: killed unborn", what, pid)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return None


def set_up_then_wait_for_go(setup: Callable[[], None], ready_w: int, go_r: int, *, what: str) -> None:
    """In a child forked by :meth:`_Zygote._fork_confirmed`: run ``setup``, report it on ``ready_w``
    (b"1", or ``"<what> setup failed: ..."`` and exit 1), then block until the requester's go on
    ``go_r`` (b"g"); anything else (b"", EOF: the requester went away) exits 1."""
    try:
        setup()
    except BaseException as e:  # noqa: BLE001 - reported to the requester
        os.write(ready_w, f"{what} setup failed: {type(e).__name__}: {e}".encode())
        os.close(ready_w)
        os._exit(1)
    os.write(ready_w, b"1")
    os.close(ready_w)
    go = os.read(go_r, 1)
    os.close(go_r)
    if go != b"g":
        os._exit(1)


def _become_learner(argv: list[str], env: dict[str, str], cwd: str, log_path: str, ready_w: int, go_r: int,
                    close: tuple[socket.socket, ...]) -> None:
    """In the forked child: set up the process as ``LearnerProcess.start`` would, run the learner, exit."""
    def setup() -> None:
        for s in close:
            s.close()  # the child's copies only: the zygote keeps serving its own
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(devnull)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)

    code = 1
    try:
        set_up_then_wait_for_go(setup, ready_w, go_r, what="learner")
        for handler in list(logging.root.handlers):
            logging.root.removeHandler(handler)
        sys.argv = ["python -m gradlab.learn", *argv]
        from gradlab.learn.__main__ import main

        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - the learner's log gets the traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve_main(argv: list[str] | None, *, prog: str, description: str, folder: str, label: str,
               zygote_class: type) -> int:
    """The command line of a zygote process (this module's and ``gradlab.cli.warm_flow``'s):
    ``--dir FOLDER [--keeper-pid PID]``, log lines tagged ``label[pid]``, ``zygote_class(dir,
    keeper_pid).serve()``; its ``PID.pending`` file is removed however it ends."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--dir", required=True, type=Path, help=f"The {folder}.")
    parser.add_argument("--keeper-pid", type=int, default=None, help="Exit once this process is gone.")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", stream=sys.stderr,
                        format=f"%(asctime)s {label}[{os.getpid()}] %(levelname)s: %(message)s")
    args.dir.mkdir(parents=True, exist_ok=True)
    try:
        return zygote_class(args.dir, args.keeper_pid).serve()
    finally:
        (args.dir / f"{os.getpid()}.pending").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    return serve_main(argv, prog="python -m gradlab.learn.zygote", description=__doc__.splitlines()[0],
                      folder="zygote folder ($GRADLAB_HOME/zygote)", label="zygote", zygote_class=_Zygote)


if __name__ == "__main__":
    sys.exit(main())
