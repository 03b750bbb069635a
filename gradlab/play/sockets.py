"""What the player's WebSockets share: the handshake, the command reader, close codes.

``/api/play`` (:mod:`gradlab.play.server`), ``/api/human`` (:mod:`gradlab.play.human_socket`) and
``/api/replay`` (:mod:`gradlab.play.replay_socket`) all check Origin and Host, read a first message with the launch token, then read the page's
commands into a queue and cancel their worker as soon as the socket closes.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from gradlab.errors import TransientError
from gradlab.play.protocol import PROTOCOL_VERSION, Command, ErrorMessage

#: WebSocket close codes: policy violation (bad Origin or token), and the session could not run.
CLOSE_REFUSED = 4401
CLOSE_FAILED = 4500
#: WebSocket close code when every session is taken (the error message says what to do).
CLOSE_BUSY = 4429


class PlayerBusy(TransientError):
    """Every live playback session the launch allows is taken (``gradlab play --max-sessions``)."""


async def handshake(ws: Any, config: Any, model: Any) -> Any:
    """Origin and Host checks, then the first message as ``model`` with the launch token and this
    server's protocol version; None (and the socket closed: 4401, or 4500 with an error message
    for another protocol version) when any of them fails."""
    from pydantic import ValidationError
    from starlette.websockets import WebSocketDisconnect

    origin = ws.headers.get("origin")
    host = ws.headers.get("host", "")
    if host not in config.hosts or origin != f"http://{host}":
        await ws.close(code=CLOSE_REFUSED, reason="foreign origin")
        return None
    await ws.accept()
    try:
        hello = model.model_validate_json(await asyncio.wait_for(ws.receive_text(), timeout=10))
    except ValidationError as e:  # the first field at fault (a close reason holds at most 123 bytes)
        first = e.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "message"
        await close_socket(ws, CLOSE_REFUSED, f"expected a hello message with the token; {where}: {first['msg']}"[:120])
        return None
    except (TimeoutError, WebSocketDisconnect, KeyError):
        await close_socket(ws, CLOSE_REFUSED, "expected a hello message with the token")
        return None
    if not secrets.compare_digest(hello.token.encode(), config.token.encode()):
        await close_socket(ws, CLOSE_REFUSED, "wrong token")
        return None
    if hello.protocol != PROTOCOL_VERSION:
        await ws.send_text(ErrorMessage(message=f"protocol {hello.protocol} is not the server's "
                                                f"{PROTOCOL_VERSION}: reload the page").model_dump_json())
        await close_socket(ws, CLOSE_FAILED, "protocol mismatch")
        return None
    return hello


async def receive(ws: Any, commands: asyncio.Queue[Any], gone: asyncio.Event, model: Any = Command) -> None:
    """Read the page's commands (``model``) into ``commands`` until the socket closes; then ``None`` and ``gone``."""
    from pydantic import ValidationError
    from starlette.websockets import WebSocketDisconnect

    try:
        while True:
            text = await ws.receive_text()
            try:
                await commands.put(model.model_validate_json(text))
            except ValidationError as e:
                await ws.send_text(ErrorMessage(message=f"bad command: {e.errors()[0]['msg']}").model_dump_json())
    except (WebSocketDisconnect, RuntimeError, KeyError):
        gone.set()
        await commands.put(None)


async def unless_gone(gone: asyncio.Event, work: Any) -> Any:
    """``await work``, or None as soon as ``gone`` is set (the work's thread is left to the worker's
    cancellation, which makes it fail at once)."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(gone.wait())
    done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task in done:
        return task.result()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: the cancelled worker's failure is expected
    return None


async def close_socket(ws: Any, code: int, reason: str) -> None:
    try:
        await ws.close(code=code, reason=reason)
    except RuntimeError:  # already closed by the client
        pass


async def fail_socket(ws: Any, error: Exception, what: str) -> None:
    """Tell the page why its session ended (an ``error`` message) and close the socket: ``CLOSE_BUSY``
    for :class:`PlayerBusy`, else ``CLOSE_FAILED`` with the reason "``what`` failed". A page already
    gone is not an error."""
    from starlette.websockets import WebSocketDisconnect

    busy = isinstance(error, PlayerBusy)
    try:
        await ws.send_text(ErrorMessage(message=str(error)).model_dump_json())
        await close_socket(ws, CLOSE_BUSY if busy else CLOSE_FAILED, "too many sessions" if busy else f"{what} failed")
    except (WebSocketDisconnect, RuntimeError):
        pass
