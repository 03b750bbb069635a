"""The playback worker: a process of its own that owns the policy and the environment.

The server never loads a model or steps an environment itself: a slow or crashed policy (or an
emulator that segfaults) stops only its worker, and the server keeps answering. The worker is a
``spawn``-ed child talking over a ``multiprocessing`` pipe (messages between our own two
processes; nothing read from a store goes through it). Frames are JPEG-encoded in the worker, so
the server only forwards bytes.

Commands (parent → worker): ``("load", (checkpoint_dir, spec, deterministic, seed, verify, cell))`` or
``("human", (environment, plan | None, seed, (store URL, endpoint) | None))`` (a person plays: :mod:`gradlab.play.human`)
or ``("replay", (folder, manifest sha256, episode index))`` (a recorded episode: :mod:`gradlab.play.replay`) once,
then ``("reset", seed | None)``, ``("step", n)``, ``("act", action)`` (human), ``("mode", deterministic)``, ``("record", (out, episodes, fps, seed))``,
``("frames", (start, n))`` (replay: answered ``("frames", [(t, jpeg), ...])``), ``("close", None)``. Answers: ``("steps", [(telemetry dict, jpeg bytes, observation jpeg | None), ...])``, ``("ok", None)``
or ``("error", message)``. The worker's first message is ``("warm", None)`` (imports done); a
load is answered ``("ready", info)`` or ``("error", message)``. A step is (telemetry, screen JPEG,
observation JPEG or None).
"""

from __future__ import annotations

import io
import multiprocessing as mp
import threading
from pathlib import Path
from typing import Any

from gradlab.errors import PermanentError

#: JPEG quality of streamed frames (PIL's scale, 1-95): small enough for 60+ frames/s over loopback.
JPEG_QUALITY = 85


class WorkerFailed(PermanentError, RuntimeError):
    """The playback worker could not start, raised, or died (its message says which)."""


def encode_jpeg(frame: Any, quality: int = JPEG_QUALITY) -> bytes:
    """(H, W, 3) uint8 RGB → JPEG bytes (PIL)."""
    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(frame)).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _warm_imports() -> None:
    """Import what every session needs (torch, stable-baselines3, gymnasium, PIL): seconds, paid while idle."""
    import gymnasium  # noqa: F401
    import PIL.Image  # noqa: F401
    import stable_baselines3.common.policies  # noqa: F401
    import torch

    torch.set_num_threads(1)  # one small policy, one observation at a time: one thread suffices


def _main(conn: Any) -> None:
    """The worker process: import, announce ``warm``, build a session on ``load``, then answer commands.

    A session that cannot be built is reported and the worker waits for another ``load``.
    """
    _warm_imports()
    conn.send(("warm", None))
    session = None
    try:
        while session is None:
            cmd, arg = conn.recv()
            if cmd == "close":
                conn.send(("ok", None))
                return
            if cmd not in ("load", "human", "replay"):
                conn.send(("error", f"expected load, found {cmd!r}"))
                continue
            try:
                if cmd == "replay":
                    from gradlab.play.replay import ReplaySession

                    folder, manifest_sha256, index = arg
                    session = ReplaySession(Path(folder), manifest_sha256, int(index), encode=encode_jpeg)
                    conn.send(("ready", session.info()))
                    break
                if cmd == "human":
                    from gradlab.play.human import HumanSession

                    environment, plan, seed, store = arg
                    if store is not None:  # the server's dataset store (its settings, not this process's)
                        from gradlab.stores import open_store

                        store = open_store(store[0], endpoint_url=store[1])
                    session = HumanSession(environment, plan=plan, seed=seed, store=store)
                    conn.send(("ready", {
                        "action_meanings": session.action_meanings, "keymap": session.keys.as_json(),
                        "mode": session.keys.mode, "noop": session.keys.noop, "env_id": session.env_spec.env_id,
                        "provider": session.env_spec.provider, "screen": session.screen,
                        "signals": list(session.env_spec.task.signals), "recording": session.recording}))
                    break
                checkpoint_dir, spec, deterministic, seed, verify, cell = arg
                from gradlab.play.session import PlaybackSession

                session = PlaybackSession(Path(checkpoint_dir), spec, deterministic=deterministic, seed=seed,
                                          verify=verify, cell=cell)
            except Exception as e:  # noqa: BLE001 - reported to the parent as one line
                conn.send(("error", f"{type(e).__name__}: {e}"))
                continue
            conn.send(("ready", {
                "action_meanings": session.action_meanings, "gamma": session.gamma, "discrete": session.discrete,
                "signals": list(session.env_spec.task.signals), "events": list(session.env_spec.task.events),
                "env_id": session.env_spec.env_id, "provider": session.env_spec.provider,
                "checkpoint_sha256": session.manifest.sha256, "checkpoint_step": session.manifest.step,
                "screen": session.screen,
                "program": None if session.program is None else {"length": len(session.program), "cell": session.cell},
            }))

        def pack(report: Any) -> tuple[dict[str, Any], bytes, bytes | None]:
            view = None if report.observation is None else encode_jpeg(report.observation)
            return report.telemetry(), encode_jpeg(report.frame), view

        while True:
            cmd, arg = conn.recv()
            try:
                if cmd == "reset":
                    conn.send(("steps", [pack(session.reset(arg))]))
                elif cmd == "step":
                    conn.send(("steps", [pack(session.step()) for _ in range(max(1, int(arg)))]))
                elif cmd == "frames":  # a replay: recorded frames by episode step
                    start, n = arg
                    conn.send(("frames", session.frames(int(start), int(n))))
                elif cmd == "act":  # a human session: one step with the person's action
                    conn.send(("steps", [pack(session.act(int(arg)))]))
                elif cmd == "record":
                    from gradlab.play.record import record_episodes

                    out, episodes, fps, seed = arg
                    count, returns = record_episodes(session, Path(out), episodes=int(episodes), fps=float(fps),
                                                     seed=int(seed))
                    conn.send(("recorded", {"frames": count, "returns": returns}))
                elif cmd == "mode":
                    session.deterministic = bool(arg)
                    conn.send(("ok", None))
                elif cmd == "close":
                    conn.send(("ok", None))
                    break
                else:
                    conn.send(("error", f"unknown command {cmd!r}"))
            except Exception as e:  # noqa: BLE001 - reported to the parent
                conn.send(("error", f"{type(e).__name__}: {e}"))
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        pass
    finally:
        if session is not None:
            session.close()


class PlaybackWorker:
    """Parent side of one playback worker process.

    The process starts at once and imports torch and the environments (seconds) before any
    checkpoint is named, so a server can keep one warm in reserve; :meth:`load` then builds the
    session. Every method blocks (the server calls them from a thread). :meth:`request` raises
    :class:`WorkerFailed` when the worker reports an error or has died.
    """

    def __init__(self) -> None:
        from gradlab.envs.lanes import main_hidden

        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_main, args=(child,), daemon=True, name="gradlab-play-worker")
        with main_hidden():
            self.process.start()
        child.close()
        self._lock = threading.Lock()
        self._claims = threading.Lock()  # guards generation and load_sent (never held while waiting)
        self._warm = False
        self.info: dict[str, Any] | None = None
        #: Bumped when the worker is taken back unused (:meth:`reclaim`): a load begun before it is dropped.
        self.generation = 0
        self.load_sent = False

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def _recv(self, timeout_s: float | None) -> tuple[str, Any]:
        try:
            if timeout_s is not None and not self._conn.poll(timeout_s):
                raise WorkerFailed(f"playback worker (pid {self.pid}) did not answer within {timeout_s:.0f} s")
            return self._conn.recv()
        except (EOFError, ConnectionResetError, OSError) as e:
            self.process.join(timeout=1)
            raise WorkerFailed(f"playback worker (pid {self.pid}) exited (exit code {self.process.exitcode})") from e

    def wait_warm(self, timeout_s: float = 180.0) -> None:
        """Return once the worker has imported what sessions need.

        Raises:
            WorkerFailed: the worker died or stayed silent for ``timeout_s``.
        """
        with self._lock:
            if self._warm:
                return
            kind, payload = self._recv(timeout_s)
            if kind != "warm":
                raise WorkerFailed(f"playback worker (pid {self.pid}) failed to start: {payload}")
            self._warm = True

    def load(self, checkpoint_dir: Path, spec: dict[str, Any], *, deterministic: bool = True, seed: int = 0,
             verify: str = "full", cell: str | None = None, timeout_s: float = 180.0) -> dict[str, Any]:
        """Build the session (the worker verifies the checkpoint before loading it); returns its info.

        Args:
            checkpoint_dir: the checkpoint folder. spec: the run spec JSON.
            deterministic, seed: the initial action mode and first episode seed.
            verify: ``full`` (every manifest file) or ``weights_only`` (a published repository's
                policy files, already checked against its ``gradlab.json``).
            cell: replay this archive cell's program (a ``gradlab.go_explore`` checkpoint).

        Raises:
            WorkerFailed: the session could not be built (the worker's one-line reason; the worker
                then waits for another load), or the worker died or stayed silent.
        """
        return self._load(("load", (str(checkpoint_dir), spec, deterministic, seed, verify, cell)), timeout_s)

    def load_human(self, environment: dict[str, Any], *, plan: dict[str, Any] | None, seed: int = 0,
                   store: tuple[str, str | None] | None = None, timeout_s: float = 180.0) -> dict[str, Any]:
        """Build a :class:`gradlab.play.human.HumanSession` (a person plays; ``plan``: the recording
        plan JSON, or None to play without recording; ``store``: (URL, S3 endpoint or None) of the
        dataset store it publishes to); returns its info (``action_meanings``, ``keymap``, ``mode``,
        ``noop``, ``env_id``, ``screen``, ``recording``).

        Raises:
            WorkerFailed: as :meth:`load` (e.g. a goal whose action space is not Discrete).
        """
        return self._load(("human", (environment, plan, seed, store)), timeout_s)

    def load_replay(self, folder: Path, manifest_sha256: str, index: int, *,
                    timeout_s: float = 300.0) -> dict[str, Any]:
        """Build a :class:`gradlab.play.replay.ReplaySession` over a verified local dataset copy
        (``folder``, from :func:`gradlab.play.replay.prepare_replay`); returns its
        :meth:`~gradlab.play.replay.ReplaySession.info` (the episode's steps, provenance, frames source).

        Raises:
            WorkerFailed: as :meth:`load` (a copy whose manifest or frames do not verify, a video that
                does not decode).
        """
        return self._load(("replay", (str(folder), manifest_sha256, int(index))), timeout_s)

    def _load(self, message: tuple[str, Any], timeout_s: float) -> dict[str, Any]:
        generation = self.generation
        self.wait_warm(timeout_s)
        with self._lock:
            with self._claims:
                if self.generation != generation:
                    raise WorkerFailed(f"playback worker (pid {self.pid}): the load was abandoned")
                self.load_sent = True
            self._conn.send(message)
            kind, payload = self._recv(timeout_s)
        if kind == "error":
            raise WorkerFailed(str(payload))
        self.info = payload
        return payload

    def request(self, cmd: str, arg: Any = None, *, timeout_s: float | None = 60.0) -> Any:
        """Send one command and return the answer's payload.

        Raises:
            WorkerFailed: an error answer, no answer within ``timeout_s``, or the worker died.
        """
        if self.info is None:
            raise WorkerFailed("playback worker: no session loaded")
        with self._lock:
            try:
                self._conn.send((cmd, arg))
            except (BrokenPipeError, OSError) as e:
                raise WorkerFailed(f"playback worker (pid {self.pid}) exited "
                                   f"(exit code {self.process.exitcode})") from e
            kind, payload = self._recv(timeout_s)
        if kind == "error":
            raise WorkerFailed(str(payload))
        return payload

    def reclaim(self) -> bool:
        """Take the worker back unused when its requester left before any session was loaded:
        True (a pending :meth:`load` is dropped and the warm process can serve someone else), or
        False when a load was already sent (then it must be stopped)."""
        with self._claims:
            if self.load_sent or not self.process.is_alive():
                return False
            self.generation += 1
            return True

    def cancel(self) -> None:
        """Stop the worker at once (SIGTERM, then SIGKILL): its requester went away, nothing to save.
        A thread blocked in :meth:`load` or :meth:`request` then raises :class:`WorkerFailed`."""
        stop_all([self])

    def close(self) -> None:
        """Stop the worker (politely, then by signal)."""
        if self.process.is_alive():
            try:
                if self._lock.acquire(timeout=2):
                    try:
                        self._conn.send(("close", None))
                        if self._conn.poll(5):
                            self._conn.recv()
                    finally:
                        self._lock.release()
            except (BrokenPipeError, EOFError, OSError):
                pass
            self.process.join(timeout=5)
            if self.process.is_alive():
                self.process.terminate()
                self.process.join(timeout=5)
        self._conn.close()


def stop_all(workers: list[PlaybackWorker], *, grace_s: float = 3.0) -> None:
    """Stop workers together: SIGTERM to each, one shared wait of ``grace_s``, then SIGKILL.

    Used when nobody waits for a worker's answer (a closed WebSocket, Ctrl-C), so stopping N of them
    costs one grace period, not N polite goodbyes.
    """
    import time

    for worker in workers:
        if worker.process.is_alive():
            worker.process.terminate()
    deadline = time.monotonic() + grace_s
    for worker in workers:
        worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(timeout=5)
        worker._conn.close()
