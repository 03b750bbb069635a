"""A warm learner parent (the "zygote"): a learner's imports paid once, learners forked on request.

This module is the zygote process itself, the serving side (``python -m
gradlab.learn.zygote_server --dir FOLDER [--keeper-pid PID]``, started by
:func:`gradlab.learn.zygote.start_zygote`): :class:`Zygote` imports what a learner needs
(:data:`gradlab.learn.zygote.PRELOAD`), refuses to serve if that started a thread or CUDA,
publishes ``<pid>.json`` and answers one request line per connection on its socket (only from
its own uid, ``SO_PEERCRED``); a ``fork`` request forks a child that sets itself up as
``LearnerProcess.start`` would and, once the requester confirms (``go`` → ``ok``), runs
``python -m gradlab.learn``'s ``main``. The zygote reaps its children and records their exit
codes. The files, the protocol and the requester side are :mod:`gradlab.learn.zygote`; the warm
supervising flow (``gradlab.cli.warm_flow``) subclasses :class:`Zygote` and reuses
:func:`set_up_then_wait_for_go` and :func:`serve_main`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import socket
import struct
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from gradlab.learn.zygote import (
    LEARNER_MODULE,
    PRELOAD,
    READ_TIMEOUT_S,
    REAP_S,
    REQUEST_TIMEOUT_S,
    ZygoteInfo,
    adopt_launch_env,
    import_env,
    kind_fingerprint,
    read_line,
)

log = logging.getLogger(__name__)


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


class Zygote:
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
        self.children: dict[int, str | None] = {}  # pid -> where to record its exit status
        #: Set before the imports: torch sets some variables itself, and a file edited meanwhile
        #: makes the code stale.
        self.started = time.monotonic()
        self.env_at_start = import_env(os.environ)
        self.code = kind_fingerprint(self.module)
        #: Starters' pids whose ``<pid>.pending`` files in :attr:`directory` this zygote's
        #: ``<pid>.json`` replaces (its own; and the warm flow's, which forks a learner zygote off
        #: its imports: :func:`serve_detached`).
        self.pending_pids = [os.getpid()]

    def serve(self) -> int:
        for name in self.preload:
            __import__(name)
        after = import_env(os.environ)  # e.g. OpenCV (imported by SB3) prepends its own LD_LIBRARY_PATH
        set_by_imports = {k: v for k, v in after.items() if self.env_at_start.get(k) != v}
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
        info = ZygoteInfo(pid=os.getpid(), address=address, fingerprint=self.code, import_env=self.env_at_start,
                          set_by_imports=set_by_imports, keeper_pid=self.keeper_pid, ready_at=time.time())
        info_path = self.directory / f"{os.getpid()}.json"
        partial = info_path.with_suffix(".partial")
        partial.write_text(info.model_dump_json())
        os.replace(partial, info_path)
        self._drop_pending()
        log.info("zygote %d ready after %.1f s (keeper %s)", os.getpid(), time.monotonic() - self.started,
                 self.keeper_pid)
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
            info_path.unlink(missing_ok=True)
            listener.close()
        return 0

    def _drop_pending(self) -> None:
        for pid in self.pending_pids:
            (self.directory / f"{pid}.pending").unlink(missing_ok=True)

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
                confirmed = read_line(conn) == b"go"
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


def reset_signals(*signals: signal.Signals) -> None:
    """In a forked child: ``signals`` back to their default action, then SIGPIPE and SIGXFSZ
    ignored, as CPython's start-up leaves them in every interpreter (a command or learner started
    as a process of its own has them so).

    A write to a closed pipe or socket then raises ``BrokenPipeError`` where the writer can
    handle it (Prefect's events client reconnects when the server dropped its websocket while the
    run was paused) instead of ending the process without a word."""
    for sig in signals:
        signal.signal(sig, signal.SIG_DFL)
    for sig in (signal.SIGPIPE, getattr(signal, "SIGXFSZ", None)):
        if sig is not None:
            signal.signal(sig, signal.SIG_IGN)


def set_up_then_wait_for_go(setup: Callable[[], None], ready_w: int, go_r: int, *, what: str) -> None:
    """In a child forked by :meth:`Zygote._fork_confirmed`: run ``setup``, report it on ``ready_w``
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
        reset_signals(signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)
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
        adopt_launch_env(env)

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


def _log_to_stderr(label: str) -> None:
    """Log lines tagged ``label[pid]`` to stderr (the zygote folder's ``zygote.log``)."""
    logging.basicConfig(level="INFO", stream=sys.stderr, force=True,
                        format=f"%(asctime)s {label}[%(process)d] %(levelname)s: %(message)s")


def serve_detached(zygote: Zygote, *, label: str) -> int | None:
    """Fork ``zygote`` off as a process of its own; it imports what this process has not (its
    :meth:`Zygote.serve`), then serves.

    The warm flow starts the learner zygote so (``gradlab.cli.warm_flow``, docs/ARCHITECTURE.md
    section 11): both need torch, SB3 and gymnasium, and importing them once instead of twice
    leaves a core to the Prefect server starting beside them. A double fork: the zygote is not
    this process's child (nothing here reaps it; its parent is init), in a session of its own,
    stdin from ``/dev/null`` as here, stdout and stderr appended to its folder's ``zygote.log``;
    its command line is this process's, which names its folder (``--learner-dir``:
    :func:`gradlab.learn.zygote._is_zygote`). Its first act is its own ``<pid>.pending`` in its
    folder, in place of the starter's (:attr:`Zygote.pending_pids`), so that until its
    ``<pid>.json`` it is seen as starting for exactly as long as it lives: a zygote killed while
    importing is not waited for, and one still importing is neither started twice nor missed by
    ``gradlab server stop``. This returns once that file is written. Call it with no thread
    running.

    Returns:
        The zygote's pid, or None when it could not be started (the starter's ``.pending`` in
        its folder is then removed, so nobody waits for it).
    """
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid_r, pid_w = os.pipe()
    try:
        child = os.fork()
    except OSError as e:
        log.warning("could not fork the %s: %s", label, e)
        os.close(pid_r)
        os.close(pid_w)
        zygote._drop_pending()
        return None
    if child == 0:  # never returns
        os.close(pid_r)
        code = 1
        try:
            os.setsid()
            if os.fork():
                os._exit(0)
            own = zygote.directory / f"{os.getpid()}.pending"
            own.write_text(str(time.time()))
            zygote._drop_pending()
            zygote.pending_pids = [os.getpid()]
            os.write(pid_w, str(os.getpid()).encode())
            os.close(pid_w)
            out = os.open(zygote.directory / "zygote.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(out)
            _log_to_stderr(label)
            code = zygote.serve()
        except BaseException:  # noqa: BLE001 - its log gets the traceback
            traceback.print_exc()
        finally:
            try:
                zygote._drop_pending()  # however it ended: nobody waits for a zygote that will not come
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(pid_w)
    os.waitpid(child, 0)
    with os.fdopen(pid_r, "rb") as r:
        pid = r.read()  # the zygote's pid once its .pending is written; b"" if it died first
    if not pid:
        log.warning("the %s exited before it started", label)
        zygote._drop_pending()
        return None
    return int(pid)


def serve_main(argv: list[str] | None, *, prog: str, description: str, folder: str, label: str,
               zygote_class: type, learner_dir_option: bool = False) -> int:
    """The command line of a zygote process (this module's and ``gradlab.cli.warm_flow``'s):
    ``--dir FOLDER [--keeper-pid PID]``, log lines tagged ``label[pid]``, ``zygote_class(dir,
    keeper_pid).serve()``; its ``PID.pending`` file is removed however it ends.
    ``learner_dir_option``: also ``--learner-dir FOLDER``, passed on as ``learner_dir=``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--dir", required=True, type=Path, help=f"The {folder}.")
    parser.add_argument("--keeper-pid", type=int, default=None, help="Exit once this process is gone.")
    if learner_dir_option:
        parser.add_argument("--learner-dir", type=Path, default=None,
                            help="Also start the learner zygote of this folder, from this process's imports.")
    args = parser.parse_args(argv)
    _log_to_stderr(label)
    args.dir.mkdir(parents=True, exist_ok=True)
    extra = {"learner_dir": args.learner_dir} if learner_dir_option else {}
    try:
        return zygote_class(args.dir, args.keeper_pid, **extra).serve()
    finally:
        (args.dir / f"{os.getpid()}.pending").unlink(missing_ok=True)
        if extra.get("learner_dir") is not None:
            (args.learner_dir / f"{os.getpid()}.pending").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    return serve_main(argv, prog="python -m gradlab.learn.zygote_server", description=__doc__.splitlines()[0],
                      folder="zygote folder ($GRADLAB_HOME/zygote)", label="zygote", zygote_class=Zygote)


if __name__ == "__main__":
    sys.exit(main())
