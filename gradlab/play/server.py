"""The player's loopback server: FastAPI + uvicorn on 127.0.0.1, one random token per launch.

Security (docs/ARCHITECTURE.md section 12):

* bound to 127.0.0.1 only; requests whose ``Host`` is not this loopback address and port are
  refused (400), so a DNS-rebinding page cannot reach the API under another name;
* every ``/api`` call needs the launch token in the ``X-Gradlab-Token`` header (401 without it);
  the WebSocket needs it in its first message and an ``Origin`` of this server (else it is closed
  before anything is served); the token travels in the URL fragment, which browsers never send,
  so it is in no request line or log;
* every response carries a strict Content-Security-Policy (scripts, styles, images and
  connections from this origin only), ``Cache-Control: no-store``, ``X-Content-Type-Options:
  nosniff``, ``Referrer-Policy: no-referrer`` and ``X-Frame-Options: DENY``;
* assets are served from ``web_player/`` only (paths resolved and confined; no dot-files).

Pages (``/``, ``/projects/{p}``, ``/projects/{p}/goals/{g}``, ``/runs/{run}``,
``/runs/{run}/checkpoints/{step}``, ``/human/{goal}``, ``/datasets/{name}``,
``/datasets/{name}/episodes/{k}``) all serve ``index.html``; the page reads its route from the URL
and the data from the mirroring ``/api/...`` routes (``/api/runs/{run}/checkpoints/{step}/archive``: a search
checkpoint's archive, :mod:`gradlab.play.archive`); ``/api/runs/{run}/checkpoints/{step}/video``
records episodes as MP4 in a worker of its own (the page's video button). ``/api/play`` is the playback WebSocket: one
playback worker process per connection (:mod:`gradlab.play.worker`); ``/api/human`` the human-play
WebSocket (:mod:`gradlab.play.human_socket`), one worker per connection too; ``/api/replay`` shows a
recorded dataset episode (:mod:`gradlab.play.replay_socket`), one worker per connection as well.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse, Response

from gradlab.errors import (
    ConfigError,
    ContractViolation,
    GradlabError,
    IntegrityError,
    NotFound,
    TransientError,
)
from gradlab.play.protocol import (
    OBS_MAGIC,
    Command,
    Hello,
    Ready,
    StateMessage,
    StepMessage,
    frame_message,
)
from gradlab.play.session import verify_mode
from gradlab.play.sockets import (
    CLOSE_REFUSED,  # noqa: F401 - re-exported: the close codes are part of this module's answer
    PlayerBusy,
    fail_socket,
)
from gradlab.play.sockets import handshake as _handshake
from gradlab.play.sockets import receive as _receive
from gradlab.play.sockets import unless_gone as _unless_gone

logger = logging.getLogger(__name__)

TOKEN_HEADER = "X-Gradlab-Token"
#: Suffixes served from web_player/ with their media types; anything else is 404.
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8", ".png": "image/png", ".svg": "image/svg+xml",
               ".txt": "text/plain; charset=utf-8", ".md": "text/plain; charset=utf-8", ".json": "application/json"}
#: Steps asked of the worker per round trip at fps 0 (as fast as possible): amortises the pipe hop.
FAST_BATCH = 4
#: Live playback workers a launch allows by default (``--max-sessions``), besides the warm reserve.
DEFAULT_MAX_SESSIONS = 2
#: Ctrl-C: seconds uvicorn waits for open sessions before it closes them (then every worker is stopped).
GRACEFUL_SHUTDOWN_S = 5


def web_player_root() -> Path:
    """The ``web_player/`` folder: the checkout's, else the copy bundled in the wheel.

    Raises:
        NotFound: neither exists (a broken install).
    """
    package = Path(__file__).resolve().parents[1]
    for candidate in (package.parent / "web_player", package / "_bundled" / "web_player"):
        if (candidate / "index.html").is_file():
            return candidate
    raise NotFound(f"web_player/index.html is neither in {package.parent} nor bundled in {package / '_bundled'}")


def content_security_policy(port: int) -> str:
    """The CSP of every response: this origin only, no inline script, no framing."""
    return ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
            f"connect-src 'self' ws://127.0.0.1:{port} ws://localhost:{port}; font-src 'self'; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


@dataclass
class PlayConfig:
    """What one ``gradlab play`` launch serves.

    Attributes:
        catalog: :class:`gradlab.play.catalog.Catalog` over the configured stores.
        port: the loopback port (the Host and Origin checks need it; 0 is not allowed here).
        token: the launch token (random, 32 bytes url-safe, when not given).
        fps, seed, deterministic: playback defaults for a new WebSocket session.
        max_sessions: live playback workers at most (sessions and MP4 recordings), besides the one
            kept warm in reserve; a request beyond it is answered :class:`PlayerBusy`. Each worker
            holds torch and an environment (about 400 MB).
    """

    catalog: Any
    port: int
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    fps: float = 30.0
    seed: int = 0
    deterministic: bool = True
    max_sessions: int = DEFAULT_MAX_SESSIONS
    root: Path = field(default_factory=web_player_root)
    #: Called with ``{"dataset", "sha256"}`` when a human recording's dataset has landed
    #: (``gradlab dataset record --agent human`` stops the server then).
    on_dataset: Callable[[dict[str, Any]], None] | None = None
    #: Datasets a human session is recording into now (one session per dataset).
    recording: set[str] = field(default_factory=set)
    workers: set[Any] = field(default_factory=set)
    reserve: Any = None
    _lock: Any = field(default_factory=threading.Lock, repr=False)
    _server: Any = field(default=None, repr=False)

    def shutdown(self) -> None:
        """Ask the server of :func:`make_server` to stop (as Ctrl-C does; open sessions get
        ``GRACEFUL_SHUTDOWN_S``)."""
        if self._server is not None:
            self._server.should_exit = True

    def prestart(self) -> None:
        """Start a playback worker in reserve (it imports torch while nobody waits)."""
        from gradlab.play.worker import PlaybackWorker

        with self._lock:
            if self.reserve is None or not self.reserve.process.is_alive():
                self.reserve = PlaybackWorker()

    def take_worker(self) -> Any:
        """The reserve worker (or a new one). The caller starts the next reserve (:meth:`prestart`) once
        the session has loaded, so a requester that leaves at once costs no process.

        Raises:
            PlayerBusy: ``max_sessions`` workers are live (the message says what to do).
        """
        from gradlab.play.worker import PlaybackWorker

        with self._lock:
            if len(self.workers) >= self.max_sessions:
                raise PlayerBusy(f"the player is at its limit of {self.max_sessions} live playback "
                                 f"session{'s' if self.max_sessions != 1 else ''}: close another player tab "
                                 "(or its MP4 recording) and reload, or restart with gradlab play --max-sessions N")
            reserve = self.reserve if self.reserve is not None and self.reserve.process.is_alive() else None
            worker = reserve or PlaybackWorker()
            self.reserve = None
            self.workers.add(worker)
        return worker

    def release(self, worker: Any, *, cancel: bool = False) -> None:
        """Give back a worker taken by :meth:`take_worker` (blocks). A worker that never loaded a
        session becomes the reserve again (when the reserve is not warm yet); any other is stopped,
        and stops counting against the cap only once its process is gone. ``cancel``: its requester
        went away, so it is stopped at once (no goodbye)."""
        with self._lock:
            if worker.reclaim():
                spare, self.reserve = self.reserve, worker
                self.workers.discard(worker)
                if spare is None or spare is worker:
                    return
                worker = spare  # the newer reserve goes: the reclaimed one has had longer to warm
                self.workers.add(worker)
        try:
            worker.cancel() if cancel else worker.close()
        finally:
            with self._lock:
                self.workers.discard(worker)

    def close_workers(self) -> None:
        """Stop every playback worker, the reserve included, at once (Ctrl-C: nothing to save)."""
        from gradlab.play.worker import stop_all

        with self._lock:
            everyone = [*self.workers, *([self.reserve] if self.reserve is not None else [])]
            self.workers.clear()
            self.reserve = None
        stop_all(everyone)

    @property
    def hosts(self) -> set[str]:
        return {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}

    def url(self, path: str = "/") -> str:
        """The URL to open: the token rides in the fragment (never sent in a request)."""
        return f"http://127.0.0.1:{self.port}{path}#token={self.token}"


def create_app(config: PlayConfig) -> Any:
    """The FastAPI application of one launch (routes in the module docstring)."""
    app = FastAPI(title="gradlab play", docs_url=None, redoc_url=None, openapi_url=None)
    csp = content_security_policy(config.port)
    security_headers = {"Content-Security-Policy": csp, "Cache-Control": "no-store",
                        "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                        "X-Frame-Options": "DENY", "Cross-Origin-Opener-Policy": "same-origin"}

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Any:
        if request.headers.get("host", "") not in config.hosts:
            response: Any = JSONResponse({"detail": "unexpected Host header"}, status_code=400)
        else:
            response = await call_next(request)
        for k, v in security_headers.items():
            response.headers[k] = v
        return response

    def require_token(request: Request) -> None:
        given = request.headers.get(TOKEN_HEADER, "")
        if not secrets.compare_digest(given.encode(), config.token.encode()):
            raise HTTPException(status_code=401, detail=f"missing or wrong {TOKEN_HEADER} header")

    def page(fn: Any, *args: Any) -> Any:
        """``fn(*args)`` with gradlab's errors as HTTP answers (their one-line message as the detail):
        NotFound 404, a malformed name 400, a checkpoint that fails verification 409, a store that
        cannot be reached 503, any other 500; never a traceback."""
        try:
            return fn(*args)
        except NotFound as e:
            raise HTTPException(status_code=404, detail=str(e)) from None
        except (ContractViolation, ConfigError) as e:
            raise HTTPException(status_code=400, detail=str(e)) from None
        except IntegrityError as e:
            raise HTTPException(status_code=409, detail=str(e)) from None
        except TransientError as e:
            raise HTTPException(status_code=503, detail=str(e)) from None
        except GradlabError as e:
            raise HTTPException(status_code=500, detail=str(e)) from None

    cat = config.catalog
    auth = [Depends(require_token)]

    @app.get("/api/projects", dependencies=auth)
    def api_projects() -> Any:
        return page(cat.projects_page)

    @app.get("/api/projects/{project}", dependencies=auth)
    def api_project(project: str) -> Any:
        return page(cat.project_page, project)

    @app.get("/api/projects/{project}/goals/{goal_id:path}", dependencies=auth)
    def api_goal(project: str, goal_id: str) -> Any:
        return page(cat.goal_page, project, goal_id)

    @app.get("/api/runs/{run_id}", dependencies=auth)
    def api_run(run_id: str) -> Any:
        return page(cat.run_page, run_id)

    @app.get("/api/runs/{run_id}/checkpoints/{step}", dependencies=auth)
    def api_playback(run_id: str, step: int) -> Any:
        return page(cat.playback_page, run_id, step)

    @app.get("/api/runs/{run_id}/checkpoints/{step}/archive", dependencies=auth)
    def api_archive(run_id: str, step: int) -> Any:
        """A search checkpoint's archive (cells, counts, the best lineage); 404 for any other checkpoint."""
        return page(cat.archive_page, run_id, step)

    @app.get("/api/runs/{run_id}/checkpoints/{step}/sequences", dependencies=auth)
    def api_sequences(run_id: str, step: int) -> Any:
        """A JERK checkpoint's retained sequences, best first; 404 for any other checkpoint."""
        return page(cat.sequences_page, run_id, step)

    @app.get("/api/runs/{run_id}/checkpoints/{step}/video", dependencies=auth)
    def api_video(run_id: str, step: int, episodes: int = 1, seed: Annotated[int | None, Query(ge=0)] = None,
                  deterministic: bool | None = None) -> Any:
        """Record ``episodes`` episodes in a playback worker of their own; the MP4 as a download."""
        import tempfile

        from gradlab.play.worker import WorkerFailed

        if not 1 <= episodes <= 100:
            raise HTTPException(status_code=422, detail=f"episodes: expected 1..100, found {episodes}")
        resolved = page(cat.resolve, run_id, step)
        seed = config.seed if seed is None else seed
        worker = page(config.take_worker)
        try:
            worker.load(resolved.path, resolved.spec, deterministic=config.deterministic if deterministic is None
                        else deterministic, seed=seed, verify=verify_mode(resolved))
            config.prestart()
            with tempfile.TemporaryDirectory(prefix="gradlab-play-video-") as tmp:
                out = Path(tmp) / "episodes.mp4"
                worker.request("record", (str(out), episodes, config.fps or 30.0, seed), timeout_s=1800)
                data = out.read_bytes()
        except WorkerFailed as e:
            raise HTTPException(status_code=500, detail=str(e)) from None
        finally:
            config.release(worker)
        name = f"{run_id}-{step}-seed{seed}.mp4"
        return Response(data, media_type="video/mp4", headers={"Content-Disposition": f'attachment; filename="{name}"'})

    @app.get("/api/datasets/{name}", dependencies=auth)
    def api_dataset(name: str) -> Any:
        return page(cat.dataset_page, name)

    @app.get("/api/{rest:path}", dependencies=auth)
    def api_unknown(rest: str) -> Any:
        raise HTTPException(status_code=404, detail=f"no API route /api/{rest}")

    @app.websocket("/api/play")
    async def play(ws: WebSocket) -> None:
        await _play_session(ws, config)

    @app.websocket("/api/human")
    async def human(ws: WebSocket) -> None:
        from gradlab.play.human_socket import human_session

        await human_session(ws, config)

    @app.websocket("/api/replay")
    async def replay(ws: WebSocket) -> None:
        from gradlab.play.replay_socket import replay_session

        await replay_session(ws, config)

    index = config.root / "index.html"

    def shell() -> Any:
        return FileResponse(index, media_type=MEDIA_TYPES[".html"])

    for route in ("/", "/projects/{project}", "/projects/{project}/goals/{goal_id:path}", "/runs/{run_id}",
                  "/runs/{run_id}/checkpoints/{step}", "/human/{goal_id:path}", "/datasets/{name}",
                  "/datasets/{name}/episodes/{index}"):
        app.add_api_route(route, shell, methods=["GET"], include_in_schema=False)

    root = config.root.resolve()

    @app.get("/web/{path:path}")
    def asset(path: str) -> Any:
        if "\x00" in path:  # no file name holds a NUL (resolve() would raise ValueError: a 500)
            raise HTTPException(status_code=404, detail="no such asset")
        target = (root / path).resolve()
        if (not target.is_relative_to(root) or any(part.startswith(".") for part in Path(path).parts)
                or not target.is_file() or target.suffix not in MEDIA_TYPES):
            raise HTTPException(status_code=404, detail="no such asset")
        return FileResponse(target, media_type=MEDIA_TYPES[target.suffix])

    @app.get("/favicon.ico")
    def favicon() -> Any:
        return Response(status_code=204)

    return app


async def _play_session(ws: Any, config: PlayConfig) -> None:
    """One playback WebSocket: Origin and token checks, a worker, then play/pause/step/reset."""
    from starlette.websockets import WebSocketDisconnect

    hello = await _handshake(ws, config, Hello)
    if hello is None:
        return
    hello = hello.model_copy(update={
        "seed": config.seed if hello.seed is None else hello.seed,
        "deterministic": config.deterministic if hello.deterministic is None else hello.deterministic,
        "fps": config.fps if hello.fps is None else hello.fps})
    from gradlab.play.worker import WorkerFailed

    commands: asyncio.Queue[Command | None] = asyncio.Queue()
    gone = asyncio.Event()  # the client closed the socket: its worker is cancelled at once
    reader = asyncio.create_task(_receive(ws, commands, gone))
    worker = None
    try:
        resolved = await asyncio.to_thread(config.catalog.resolve, hello.run_id, hello.step)
        worker = await asyncio.to_thread(config.take_worker)
        info = await _unless_gone(gone, asyncio.to_thread(
            worker.load, resolved.path, resolved.spec, verify=verify_mode(resolved),
            deterministic=hello.deterministic, seed=hello.seed, cell=hello.cell))
        if info is None:
            return
        await asyncio.to_thread(config.prestart)  # the next session's worker warms meanwhile
        await ws.send_text(Ready(run_id=hello.run_id, step=info["checkpoint_step"], goal_id=resolved.spec["goal_id"],
                                 env_id=info["env_id"], checkpoint_sha256=info["checkpoint_sha256"],
                                 action_meanings=info["action_meanings"], gamma=info["gamma"],
                                 signals=info["signals"], events=info["events"], seed=hello.seed,
                                 deterministic=hello.deterministic, fps=hello.fps,
                                 worker_pid=worker.pid, screen=info.get("screen", "render"),
                                 program=info.get("program")).model_dump_json())
        await _drive(ws, worker, hello, commands, gone)
    except WebSocketDisconnect:
        pass
    except (GradlabError, WorkerFailed) as e:
        if not gone.is_set():
            logger.info("playback of %s:%s ended: %s", hello.run_id, hello.step, e)
            await fail_socket(ws, e, "playback")
    finally:
        reader.cancel()
        if worker is not None:
            await asyncio.to_thread(config.release, worker, cancel=gone.is_set())


async def _drive(ws: Any, worker: Any, hello: Hello, commands: asyncio.Queue[Command | None],
                 gone: asyncio.Event) -> None:
    """Play, pause, step, reset and change speed or mode until the client goes away (``gone``)."""
    state = {"playing": True, "fps": hello.fps, "deterministic": hello.deterministic, "seed": hello.seed}
    seq = 0

    async def ask(cmd: str, arg: Any) -> Any:
        """One worker request, abandoned (None) when the client leaves meanwhile."""
        return await _unless_gone(gone, asyncio.to_thread(worker.request, cmd, arg))

    async def send_steps(steps: list[tuple[dict[str, Any], bytes, bytes | None]] | None) -> None:
        nonlocal seq
        for telemetry, jpeg, view in steps or ():
            seq += 1
            await ws.send_text(StepMessage(seq=seq, **telemetry).model_dump_json())
            if view is not None:  # the observation first: the screen frame completes the step
                await ws.send_bytes(frame_message(seq, telemetry["t"], view, magic=OBS_MAGIC))
            await ws.send_bytes(frame_message(seq, telemetry["t"], jpeg))

    async def send_state() -> None:
        await ws.send_text(StateMessage(playing=state["playing"], fps=state["fps"],
                                        deterministic=state["deterministic"], seed=state["seed"]).model_dump_json())

    async def handle(cmd: Command) -> None:
        if cmd.type == "play":
            state["playing"] = True
        elif cmd.type == "pause":
            state["playing"] = False
        elif cmd.type == "step":
            state["playing"] = False
            await send_steps(await ask("step", cmd.n))
        elif cmd.type == "reset":
            if cmd.seed is not None:
                state["seed"] = cmd.seed
            await send_steps(await ask("reset", cmd.seed))
        elif cmd.type == "fps" and cmd.fps is not None:
            state["fps"] = cmd.fps
        elif cmd.type == "mode" and cmd.deterministic is not None:
            state["deterministic"] = cmd.deterministic
            await ask("mode", cmd.deterministic)
        await send_state()

    await send_steps(await ask("reset", hello.seed))
    await send_state()
    next_at = time.monotonic()
    while True:
        if not state["playing"]:
            cmd = await commands.get()
            if cmd is None:
                return
            await handle(cmd)
            next_at = time.monotonic()
            continue
        while not commands.empty():
            cmd = commands.get_nowait()
            if cmd is None:
                return
            await handle(cmd)
        if not state["playing"]:
            continue
        fps = state["fps"]
        n = FAST_BATCH if fps == 0 else 1
        if gone.is_set():
            return
        await send_steps(await ask("step", n))
        if fps > 0:
            next_at = max(next_at + 1.0 / fps, time.monotonic() - 0.25)
            delay = next_at - time.monotonic()
            if delay > 0:
                try:
                    cmd = await asyncio.wait_for(commands.get(), timeout=delay)
                except TimeoutError:
                    continue
                if cmd is None:
                    return
                await handle(cmd)
        else:
            await asyncio.sleep(0)


def bind_loopback(port: int = 0) -> Any:
    """A listening TCP socket on 127.0.0.1 (``port`` 0: a free one); its port is ``getsockname()[1]``.

    Raises:
        ConfigError: the port is taken or not allowed.
    """
    import socket

    from gradlab.errors import ConfigError

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart within TIME_WAIT
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"--port {port}: cannot listen on 127.0.0.1:{port} ({e.strerror})") from None
    sock.listen(64)
    sock.set_inheritable(True)
    return sock


def make_server(config: PlayConfig, *, ready: Any = None) -> Any:
    """The uvicorn server of ``config`` on 127.0.0.1 (run it with ``.run(sockets=[sock])``).

    Args:
        ready: called with no arguments once the server accepts connections.
    """
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=config.port,
                                           log_level="warning", access_log=False, ws="websockets-sansio",
                                           lifespan="off", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S))
    config._server = server
    if ready is not None:
        original = server.startup

        async def startup(sockets: Any = None) -> None:
            await original(sockets=sockets)
            if server.started:
                ready()

        server.startup = startup  # type: ignore[method-assign]
    return server


def serve(config: PlayConfig, *, sock: Any = None, ready: Any = None) -> None:
    """Serve ``config`` on 127.0.0.1 until Ctrl-C (uvicorn), then stop every playback worker.

    Args:
        sock: a listening socket from :func:`bind_loopback` (default: bind ``config.port``).
        ready: called with no arguments once the server accepts connections (the CLI prints the URL then).
    """
    server = make_server(config, ready=ready)
    config.prestart()
    try:
        server.run(sockets=[sock] if sock is not None else None)
    finally:
        config.close_workers()
