"""The replay WebSocket (``/api/replay``): a recorded dataset episode, shown with the player's panels.

The hello names the dataset and the episode; the server makes the verified local copy
(:func:`gradlab.play.replay.prepare_replay`), takes a playback worker (counted against
``--max-sessions``) and loads a :class:`gradlab.play.replay.ReplaySession` in it, then sends one
:class:`gradlab.play.protocol.ReplayReady` (the episode's steps, provenance and frames source) and
answers each :class:`gradlab.play.protocol.ReplayCommand` with binary frame messages (``GLF1``,
sequence number and step both ``t``). The worker is cancelled as soon as the socket closes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gradlab.errors import GradlabError
from gradlab.play.protocol import (
    ReplayCommand,
    ReplayHello,
    ReplayReady,
    frame_message,
)
from gradlab.play.sockets import fail_socket, handshake, receive, unless_gone

logger = logging.getLogger(__name__)


async def replay_session(ws: Any, config: Any) -> None:
    """One replay WebSocket: checks, the verified copy, a worker with the episode, then frame requests."""
    from starlette.websockets import WebSocketDisconnect

    from gradlab.play.replay import prepare_replay
    from gradlab.play.worker import WorkerFailed

    hello = await handshake(ws, config, ReplayHello)
    if hello is None:
        return
    commands: asyncio.Queue[ReplayCommand | None] = asyncio.Queue()
    gone = asyncio.Event()
    reader = asyncio.create_task(receive(ws, commands, gone, ReplayCommand))
    worker = None
    try:
        manifest, folder = await asyncio.to_thread(prepare_replay, config.catalog.settings, hello.dataset,
                                                   hello.episode)
        worker = await asyncio.to_thread(config.take_worker)
        info = await unless_gone(gone, asyncio.to_thread(worker.load_replay, folder, manifest.sha256, hello.episode))
        if info is None:
            return
        await asyncio.to_thread(config.prestart)
        await ws.send_text(ReplayReady(**info, worker_pid=worker.pid).model_dump_json())
        while (cmd := await commands.get()) is not None:
            frames = await unless_gone(gone, asyncio.to_thread(worker.request, "frames", (cmd.start, cmd.n)))
            for t, jpeg in frames or ():
                await ws.send_bytes(frame_message(t, t, jpeg))
    except WebSocketDisconnect:
        pass
    except (GradlabError, WorkerFailed) as e:
        if not gone.is_set():
            logger.info("replay of %s episode %s ended: %s", hello.dataset, hello.episode, e)
            await fail_socket(ws, e, "replay")
    finally:
        reader.cancel()
        if worker is not None:
            await asyncio.to_thread(config.release, worker, cancel=gone.is_set())
