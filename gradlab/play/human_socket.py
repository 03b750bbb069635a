"""The human-play WebSocket (``/api/human``): a person plays a goal from the keyboard.

The page sends the keys held (:class:`gradlab.play.protocol.KeysCommand`); the server maps them to
an action with the goal's key map (:func:`gradlab.play.human.key_map`) and asks the session's
playback worker to step. A goal with a ``NOOP`` runs in real time: one step every ``1/fps`` s with
the keys held then (or pressed since the last step, so a short tap is never lost), ``NOOP`` when
none; any other goal steps once per key press. With a dataset named in the hello, the worker records
every step and publishes the dataset when the last planned episode ends; the server then calls
``PlayConfig.on_dataset`` and steps no more. One worker per connection, counted against
``--max-sessions`` and cancelled when the socket closes; one session per dataset name at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from gradlab.errors import Conflict, GradlabError
from gradlab.play.human import key_map
from gradlab.play.protocol import (
    OBS_MAGIC,
    HumanHello,
    HumanReady,
    KeysCommand,
    StepMessage,
    frame_message,
)
from gradlab.play.sockets import (
    PlayerBusy,
    fail_socket,
    handshake,
    receive,
    unless_gone,
)

logger = logging.getLogger(__name__)

#: Steps per second of a real-time goal when the page names none: ALE's 60 frames/s at frame skip 4.
HUMAN_FPS = 15.0


def _prepare(config: Any, hello: HumanHello) -> tuple[dict[str, Any], dict[str, Any] | None, Any]:
    """(environment JSON, recording plan JSON or None, (dataset store URL, S3 endpoint) or None) of a
    hello (blocking: call from a thread).

    Raises:
        NotFound, ContractViolation, ConfigError: no such goal, or it does not validate; a bad name.
        Conflict: the dataset exists already.
    """
    from gradlab.contracts import Experiments

    if hello.dataset is None:
        goal = Experiments().load_goal(hello.goal_id)
        return goal.eval_environment().model_dump(mode="json"), None, None
    from gradlab.datasets.plan import plan_recording
    from gradlab.datasets.store import dataset_exists
    from gradlab.stores import open_dataset_store

    store = open_dataset_store(config.catalog.settings)
    if dataset_exists(store, hello.dataset):
        raise Conflict(f"dataset {hello.dataset!r} exists already in {store.base_url} (datasets are immutable: "
                       "record under another name)")
    plan = plan_recording(hello.dataset, goal_id=hello.goal_id, policy="human", episodes=hello.episodes,
                          frames=hello.frames, settings=config.catalog.settings)
    return plan.environment, plan.model_dump(mode="json"), (store.base_url, config.catalog.settings.s3_endpoint_url)


async def human_session(ws: Any, config: Any) -> None:
    """One human-play WebSocket: checks, a worker with a :class:`gradlab.play.human.HumanSession`, then keys."""
    from starlette.websockets import WebSocketDisconnect

    from gradlab.play.worker import WorkerFailed

    hello = await handshake(ws, config, HumanHello)
    if hello is None:
        return
    seed = config.seed if hello.seed is None else hello.seed
    fps = HUMAN_FPS if hello.fps is None else hello.fps
    commands: asyncio.Queue[KeysCommand | None] = asyncio.Queue()
    gone = asyncio.Event()
    reader = asyncio.create_task(receive(ws, commands, gone, KeysCommand))
    worker = None
    claimed = None
    try:
        if hello.dataset is not None:
            with config._lock:
                if hello.dataset in config.recording:
                    raise PlayerBusy(f"dataset {hello.dataset!r} is being recorded in another player tab")
                config.recording.add(hello.dataset)
                claimed = hello.dataset
        environment, plan, store = await asyncio.to_thread(_prepare, config, hello)
        worker = await asyncio.to_thread(config.take_worker)
        info = await unless_gone(gone, asyncio.to_thread(worker.load_human, environment, plan=plan, seed=seed,
                                                          store=store))
        if info is None:
            return
        await asyncio.to_thread(config.prestart)
        await ws.send_text(HumanReady(goal_id=hello.goal_id, env_id=info["env_id"],
                                      action_meanings=info["action_meanings"], keymap=info["keymap"],
                                      mode=info["mode"], noop=info["noop"], fps=fps, seed=seed,
                                      worker_pid=worker.pid, screen=info["screen"],
                                      recording=info["recording"]).model_dump_json())
        await _drive_human(ws, worker, config, key_map(info["action_meanings"]), fps, commands, gone)
    except WebSocketDisconnect:
        pass
    except (GradlabError, WorkerFailed) as e:
        if not gone.is_set():
            logger.info("human play of %s ended: %s", hello.goal_id, e)
            await fail_socket(ws, e, "human play")
    finally:
        reader.cancel()
        if worker is not None:
            await asyncio.to_thread(config.release, worker, cancel=gone.is_set())
        if claimed is not None:
            with config._lock:
                config.recording.discard(claimed)


async def _drive_human(ws: Any, worker: Any, config: Any, keys: Any, fps: float,
                       commands: asyncio.Queue[KeysCommand | None], gone: asyncio.Event) -> None:
    """Step with the person's keys (see the module docstring) until the socket closes."""
    seq = 0
    landed = False

    async def ask(cmd: str, arg: Any) -> Any:
        return await unless_gone(gone, asyncio.to_thread(worker.request, cmd, arg))

    async def send(steps: list[tuple[dict[str, Any], bytes, bytes | None]] | None) -> None:
        nonlocal seq, landed
        for telemetry, jpeg, view in steps or ():
            seq += 1
            await ws.send_text(StepMessage(seq=seq, **telemetry).model_dump_json())
            if view is not None:
                await ws.send_bytes(frame_message(seq, telemetry["t"], view, magic=OBS_MAGIC))
            await ws.send_bytes(frame_message(seq, telemetry["t"], jpeg))
            recording = (telemetry["episode"] or {}).get("recording") or {}
            if recording.get("published") and not landed:
                landed = True
                if config.on_dataset is not None:
                    config.on_dataset({"dataset": recording["dataset"], "sha256": recording["published"]})

    await send(await ask("reset", None))
    if keys.mode == "turn":
        while (cmd := await commands.get()) is not None:
            action = keys.action(cmd.held) if cmd.press and not landed else None
            if action is not None:
                await send(await ask("act", action))
        return
    held: list[str] = []
    tapped: list[str] | None = None  # keys pressed since the last step (a tap shorter than a step counts)
    next_at = time.monotonic()
    while True:
        if landed:  # the dataset is stored: nothing more to play; wait for the page to leave
            if await commands.get() is None:
                return
            continue
        await send(await ask("act", keys.action(tapped if tapped is not None else held)))
        tapped = None
        next_at = max(next_at + 1.0 / fps, time.monotonic() - 0.25)
        while (delay := next_at - time.monotonic()) > 0:
            try:
                cmd = await asyncio.wait_for(commands.get(), timeout=delay)
            except TimeoutError:
                break
            if cmd is None:
                return
            held = list(cmd.held)
            if cmd.press:
                tapped = held
        if gone.is_set():
            return
