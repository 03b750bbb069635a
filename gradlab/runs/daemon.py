"""The background keeper of the local Prefect server: ``python -m gradlab.runs.daemon`` (see :mod:`gradlab.runs.server`).

Started detached by the first command that needs Prefect (or ``gradlab server start``), holding
the start lock it inherited for its whole life. It starts ``prefect server start`` on 127.0.0.1 in
a process group of its own, with the UI pointed at this server's own API
(``PREFECT_SERVER_UI_API_URL``: without it Prefect's UI asks ``127.0.0.1:4200`` whatever the
port), starts the warm learner and the warm flow with itself as keeper (their imports overlap the
server's start-up), waits until ``/api/health`` answers, records ready and the measured start-up
time, then checks every few seconds whether anything uses the server:

* a command registered in ``clients/`` whose process still runs (dead ones are removed), or the
  last registration or exit less than ``idle_s`` ago (the folder's mtime);
* a flow run that is Running, Pending or Cancelling (``POST /api/flow_runs/filter``), such as a
  queued run a worker is executing. A Scheduled run waiting for a worker does not count. Nor does
  one whose ``flow-runs/<id>`` record names a process that is gone (killed before its flow could
  report an end): the daemon sets it Crashed (Cancelled if it was Cancelling: a cancel whose
  process ended has succeeded), with a message naming the process, and removes the record. Without that such a run would count as use for ever and the idle stop never come.

Once nothing has for ``idle_s`` seconds (0 = never), on SIGTERM, SIGINT or SIGHUP, or when the
server exits by itself, it stops the zygote and the server's process group (SIGTERM, SIGKILL after
10 s) and removes ``server.json`` and ``clients/``; the kernel releases the lock at its exit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gradlab.runs import prefect_db
from gradlab.runs.server import (
    ServerState,
    clear_stale,
    client_alive,
    clients_dir,
    flow_run_process_gone,
    flow_runs_dir,
    healthy,
    read_state_file,
    write_state,
)

log = logging.getLogger(__name__)

#: Flow-run state types that mean a run is using the server.
BUSY_STATES = ("RUNNING", "PENDING", "CANCELLING")

def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """The server gets SIGTERM if the daemon dies without stopping it (SIGKILL of the daemon)."""
    from gradlab.learn.watch import die_with_parent

    die_with_parent(signal.SIGTERM)


class Daemon:
    def __init__(self, *, prefect_home: Path, gradlab_home: Path, port: int, idle_s: float,
                 start_timeout_s: float) -> None:
        self.home = prefect_home
        self.gradlab_home = gradlab_home
        self.idle_s = idle_s
        self.start_timeout_s = start_timeout_s
        self.stopping: str | None = None
        self.server: subprocess.Popen[bytes] | None = None
        self.server_started = time.monotonic()
        self.state = ServerState(pid=os.getpid(), url=f"http://127.0.0.1:{port}", home=str(prefect_home),
                                 idle_s=idle_s, started_at=time.time(), ready=False)
        self.port = port

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        try:
            write_state(self.home, self.state)
            # A new home's server starts from a database already migrated (gradlab.runs.prefect_db).
            existed = (self.home / prefect_db.DATABASE).exists()
            seeded = None if existed else prefect_db.seed(self.home)
            fresh = not existed and seeded is None
            self._start_server(seeded or {})
            # Their imports overlap the server's start-up: a fresh shell's first command waits for
            # the warm flow and hands itself over (gradlab.cli.warm_handoff) instead of importing
            # Prefect, torch and an evaluation worker's libraries itself beside them.
            self._warm()
            if not self._wait_healthy():
                # Exited with an error on the seeded database: the copy is suspect (killed by a
                # signal, an OOM or a user's kill, says nothing against it).
                if seeded is not None and (self.server.poll() or 0) > 0 and not self.stopping:
                    prefect_db.reject(self.home)
                return 1
            self._ready()
            if (fresh or seeded == {}) and prefect_db.registration_on():
                # Migrated, or registered, here: kept for the next new home's server. Optional: a
                # failure (an unwritable cache) is logged, and this server goes on.
                try:
                    prefect_db.save(self.home)
                except Exception:  # noqa: BLE001 - never stop a healthy server over its cache
                    log.exception("could not keep a pre-migrated copy of the Prefect database")
            self._watch()
            return 0
        finally:
            self._shutdown()

    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        self.stopping = signal.Signals(signum).name

    def _start_server(self, defaults: dict[str, str]) -> None:
        """Start Prefect's server with ``defaults`` under the environment (a user's settings win)."""
        env = {**defaults, **os.environ, "PREFECT_HOME": str(self.home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_SERVER_API_PORT": str(self.port),
               "PREFECT_SERVER_UI_API_URL": self.state.api_url}
        env.pop("PREFECT_API_URL", None)  # the server is not a client of another one
        with (self.home / "server.log").open("ab") as out:
            self.server = subprocess.Popen(
                [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(self.port),
                 "--analytics-off"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.server_started = time.monotonic()
        self.state = ServerState(**{**self.state.__dict__, "server_pid": self.server.pid})
        write_state(self.home, self.state)
        log.info("prefect server pid %d starting at %s", self.server.pid, self.state.url)

    def _wait_healthy(self) -> bool:
        started = self.server_started  # the start-up is timed from the server's spawn
        while time.monotonic() - started < self.start_timeout_s:
            if self.stopping:
                log.info("%s while the server was starting: stopping", self.stopping)
                return False
            if self.server.poll() is not None:
                log.error("prefect server exited with %s while starting; see %s", self.server.returncode,
                          self.home / "server.log")
                return False
            if healthy(self.state.api_url):
                seconds = time.monotonic() - started
                partial = self.home / "startup.partial"
                partial.write_text(json.dumps({"seconds": round(seconds, 2), "at": time.time()}))
                os.replace(partial, self.home / "startup.json")
                log.info("prefect server healthy after %.1f s", seconds)
                return True
            time.sleep(0.05)  # a first command waits on this: a refused connect costs ~nothing
        log.error("prefect server not healthy after %.0f s: giving up", self.start_timeout_s)
        return False

    def _ready(self) -> None:
        clients_dir(self.home).mkdir(exist_ok=True)
        self.state = ServerState(**{**self.state.__dict__, "ready": True, "idle_since": time.time()})
        write_state(self.home, self.state)
        self._warm()  # any that ended while the server started
        import urllib.request  # after the server's spawn, as every import that can wait

        # A new server answers its first API request slowly (~0.5 s here: it sets up on first use);
        # a run's first request is then not the first.
        try:
            with urllib.request.urlopen(f"{self.state.api_url}/admin/version", timeout=10.0) as r:
                r.read()
        except OSError as e:
            log.warning("warm-up request failed: %s", e)

    def _warm(self) -> None:
        """Start the warm learner and the warm flow where missing (a failure only warns)."""
        from gradlab.runs.server import warm_processes

        try:
            warm_processes(self.gradlab_home, keeper_pid=os.getpid(), api_url=self.state.api_url)
        except OSError as e:
            log.warning("no warm learner or flow (%s): runs start fresh processes instead", e)

    def _watch(self) -> None:
        last_busy = time.time()
        poll_s = min(10.0, max(0.5, self.idle_s / 10)) if self.idle_s else 10.0
        while not self.stopping:
            if self.server.poll() is not None:
                log.error("prefect server exited with %s; see %s", self.server.returncode, self.home / "server.log")
                return
            now = time.time()
            if self._busy():
                last_busy = now
            try:
                last_busy = max(last_busy, clients_dir(self.home).stat().st_mtime)
            except OSError:
                pass
            idle_since = None if last_busy >= now else last_busy
            if (idle_since is None) != (self.state.idle_since is None):
                self.state = ServerState(**{**self.state.__dict__, "idle_since": idle_since})
                write_state(self.home, self.state)
            elif read_state_file(self.home) != self.state:  # removed or damaged while we run: clients need it
                log.warning("%s was missing or not ours: rewritten", self.home / "server.json")
                write_state(self.home, self.state)
            if self.idle_s and now - last_busy >= self.idle_s:
                log.info("nothing used the server for %.0f s (idle timeout %.0f s): stopping", now - last_busy,
                         self.idle_s)
                return
            deadline = time.monotonic() + poll_s
            while not self.stopping and time.monotonic() < deadline:
                time.sleep(min(0.2, poll_s))
        log.info("%s: stopping", self.stopping)

    def _busy(self) -> bool:
        """A live registered command, or a flow run in a busy state (an unreadable API counts as busy)."""
        busy = False
        directory = clients_dir(self.home)
        for path in directory.iterdir() if directory.is_dir() else ():
            if client_alive(path):
                busy = True
            else:
                path.unlink(missing_ok=True)
        active = self._active_flow_runs()  # also while a command is registered: it crashes killed runs
        return busy or active != 0

    def _api(self, path: str, body: dict) -> object:
        import urllib.request

        request = urllib.request.Request(f"{self.state.api_url}{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=5.0) as r:
            return json.loads(r.read())

    def _active_flow_runs(self) -> int:
        """Flow runs in a busy state whose process may still run; -1 when the API cannot say.

        One whose ``flow-runs/<id>`` record names a process that is gone is set Crashed (forced:
        no client is left to report its end) and not counted; records of flow runs no longer busy
        whose process is gone are removed."""
        try:
            runs = self._api("/flow_runs/filter", {"flow_runs": {"state": {"type": {"any_": list(BUSY_STATES)}}},
                                                    "limit": 200})
            busy = {str(r["id"]): r["state"] for r in runs}  # type: ignore[union-attr,index]
        except (OSError, ValueError, TypeError, KeyError) as e:
            log.warning("cannot list active flow runs (%s): counted as busy", e)
            return -1
        records = flow_runs_dir(self.home)
        active = 0
        for flow_run_id, state in busy.items():
            record = records / flow_run_id
            gone = flow_run_process_gone(record) if _record_of_this_try(record, state) else None
            if gone is None or not self._end(flow_run_id, gone, cancelling=state.get("type") == "CANCELLING"):
                active += 1
            else:
                record.unlink(missing_ok=True)
        for record in records.iterdir() if records.is_dir() else ():
            if record.name not in busy and flow_run_process_gone(record) is not None:
                record.unlink(missing_ok=True)  # ended (or crashed) after all: nothing to do
        return active

    def _end(self, flow_run_id: str, pid: int, *, cancelling: bool) -> bool:
        """Give flow run ``flow_run_id``, whose process ``pid`` is gone, its final state; False where
        the API refused. Crashed, unless it was Cancelling: a cancel whose process ended is Cancelled
        (the worker may not have reported it yet), never Crashed."""
        if cancelling:
            kind, name = "CANCELLED", "Cancelled"
            message = (f"the process running this flow run (pid {pid}) ended while it was cancelling; marked "
                       "Cancelled by the gradlab server daemon.")
        else:
            kind, name = "CRASHED", "Crashed"
            message = (f"the process running this flow run (pid {pid}) ended without reporting a final state "
                       "(killed?); marked Crashed by the gradlab server daemon. `gradlab runs reconcile` or "
                       "a retry closes the gradlab run's attempt.")
        try:
            result = self._api(f"/flow_runs/{flow_run_id}/set_state",
                               {"state": {"type": kind, "name": name, "message": message}, "force": True})
        except (OSError, ValueError) as e:
            log.warning("cannot mark flow run %s %s (%s): still counted as busy", flow_run_id, name, e)
            return False
        status = result.get("status") if isinstance(result, dict) else None
        if status != "ACCEPT":
            log.warning("Prefect did not accept %s for flow run %s (%s): still counted as busy", name, flow_run_id,
                        status)
            return False
        log.info("flow run %s: its process (pid %s) is gone; marked %s", flow_run_id, pid, name)
        return True

    def _shutdown(self) -> None:
        from gradlab.learn.zygote import flow_zygote_dir, stop_zygotes, zygote_dir

        try:
            stop_zygotes(zygote_dir(self.gradlab_home))
            stop_zygotes(flow_zygote_dir(self.gradlab_home))
        except OSError as e:
            log.warning("could not stop the warm learner: %s", e)
        if self.server is not None and self.server.poll() is None:
            if self.state.ready:
                self._active_flow_runs()  # while the API answers: the records of ended flow runs go
            _stop_group(self.server)
        clear_stale(self.home)
        log.info("stopped")


def _record_of_this_try(record: Path, state: dict) -> bool:
    """Whether ``record`` was written by the process running the flow run's current try.

    The flow writes it once its body starts, after Prefect set the run Running, so the record of
    this try is newer than the Running state; one older than it is an earlier try's (a retry from
    the UI whose new process has not started its body yet). Pending: the process may not have
    started. Cancelling: set after this try's record was written."""
    try:
        written = record.stat().st_mtime
    except OSError:
        return False
    kind = state.get("type") if isinstance(state, dict) else None
    if kind == "CANCELLING":
        return True
    if kind != "RUNNING":
        return False
    try:
        from datetime import datetime

        since = datetime.fromisoformat(str(state["timestamp"]).replace("Z", "+00:00")).timestamp()
    except (KeyError, ValueError):
        return False
    return written >= since


def _stop_group(popen: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM the child's process group, SIGKILL it after ``grace_s`` seconds; reaps the child."""
    try:
        os.killpg(popen.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(popen.pid, signal.SIGKILL)  # also whatever the server left in its group
    except ProcessLookupError:
        pass
    popen.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gradlab.runs.daemon", description=__doc__.splitlines()[0])
    parser.add_argument("--prefect-home", required=True, type=Path, help="$GRADLAB_HOME/prefect.")
    parser.add_argument("--gradlab-home", required=True, type=Path, help="$GRADLAB_HOME (the zygote's folder).")
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--idle-s", required=True, type=float, help="Idle timeout, seconds; 0 = never.")
    parser.add_argument("--start-timeout-s", required=True, type=float)
    parser.add_argument("--lock-fd", type=int, default=None, help="The inherited start lock, held until exit.")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", stream=sys.stderr,
                        format=f"%(asctime)s daemon[{os.getpid()}] %(levelname)s: %(message)s")
    lock_fd = args.lock_fd  # kept open (and so locked) until this process exits
    log.info("started (idle timeout %s s, lock fd %s)", args.idle_s, lock_fd)
    return Daemon(prefect_home=args.prefect_home, gradlab_home=args.gradlab_home, port=args.port, idle_s=args.idle_s,
                  start_timeout_s=args.start_timeout_s).run()


if __name__ == "__main__":
    sys.exit(main())
