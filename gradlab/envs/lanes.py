"""Lane backends for single-environment providers: in-process (sync) and subprocess (async).

A *lane factory* is a picklable callable ``factory(lane=i, render_mode=...) -> env`` returning a
gymnasium-style env (``reset(seed=)``, ``step(a)`` with five returns, ``render()``, ``close()``,
optionally ``get_ram()``). Neither backend autoresets: :class:`gradlab.envs.vector.VectorEnv`
resets ended lanes itself, in the same vector step.

Use :class:`SyncLanes` for cheap steps (CartPole: ~5 µs, where process hops would cost 6–8×) and
:class:`AsyncLanes` for expensive or process-bound ones (ViZDoom, stable-retro: one emulator per
process).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from gradlab.envs.backend import LaneBackend
from gradlab.envs.snapshot import StateUnsupported
from gradlab.errors import IntegrityError, PermanentError

logger = logging.getLogger(__name__)

LaneFactory = Callable[..., Any]
#: How a provider captures and restores one lane env's state when the env has no
#: ``capture_state()`` / ``restore_state(bytes)`` methods of its own: ``(capture(env) -> bytes,
#: restore(env, bytes) -> obs, problem(env) -> str | None)``, module-level functions (picklable
#: for :class:`AsyncLanes`).
StateCodec = tuple[Callable[[Any], bytes], Callable[[Any, bytes], Any], Callable[[Any], "str | None"]]


class LaneCrashed(PermanentError, RuntimeError):
    """An environment lane raised, or its worker process died."""


def _discrete(space: Any) -> bool:
    from gymnasium.spaces import Discrete

    return isinstance(space, Discrete)


class SyncLanes(LaneBackend):
    """N single envs stepped one after another in this process."""

    def __init__(self, factory: LaneFactory, n: int, *, render_mode: str | None = None, lane_offset: int = 0,
                 state_codec: StateCodec | None = None):
        self.envs = [factory(lane=lane_offset + i, render_mode=render_mode) for i in range(n)]
        # Three attributes, not the tuple: resume's lane state skips code but refuses a tuple of it.
        self._capture_fn, self._restore_fn, self._problem_fn = state_codec or (None, None, None)
        self.num_envs = n
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.has_ram = hasattr(self.envs[0], "get_ram")
        starts = getattr(self.envs[0], "starts", None)
        self.starts = tuple(starts) if starts is not None else None
        self._obs_shape = tuple(self.single_observation_space.shape)
        self._obs_dtype = self.single_observation_space.dtype
        self._batch_shape = (n, *self._obs_shape)
        self._discrete = _discrete(self.single_action_space)

    def reset_lanes(self, lanes: Sequence[int], seeds: Sequence[int | None], *,
                    starts: Sequence[str | None] | None = None) -> tuple[list[np.ndarray], list[dict]]:
        """Reset ``lanes``; a named start reaches the lane as ``reset(seed=, options={"start": name})``."""
        obs, infos = [], []
        for k, (lane, seed) in enumerate(zip(lanes, seeds, strict=True)):
            if starts is None or starts[k] is None:
                o, info = self.envs[lane].reset(seed=seed)
            else:
                o, info = self.envs[lane].reset(seed=seed, options={"start": starts[k]})
            obs.append(np.asarray(o))
            infos.append(dict(info))
        return obs, infos

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        n = self.num_envs
        acts = actions.tolist() if self._discrete else actions
        obs = np.empty(self._batch_shape, dtype=self._obs_dtype)
        rew = np.empty(n, dtype=np.float64)
        term = np.empty(n, dtype=np.bool_)
        trunc = np.empty(n, dtype=np.bool_)
        infos: list[dict] = [None] * n  # type: ignore[list-item]
        i = 0
        for env in self.envs:
            obs[i], rew[i], term[i], trunc[i], infos[i] = env.step(acts[i])
            i += 1
        return obs, rew, term, trunc, infos

    def ram(self) -> np.ndarray:
        return np.stack([np.asarray(env.get_ram(), dtype=np.uint8) for env in self.envs])

    def state_problem(self) -> str | None:
        env = self.envs[0]
        if self._problem_fn is not None:
            return self._problem_fn(env)
        problem = getattr(env, "state_problem", None)
        if callable(problem) and (reason := problem()) is not None:
            return reason
        if callable(getattr(env, "capture_state", None)):
            return None
        return f"{type(env).__name__}: this environment cannot capture its state (no capture_state)"

    def capture_state(self, lane: int) -> bytes:
        if (problem := self.state_problem()) is not None:
            raise StateUnsupported(problem)
        env = self.envs[lane]
        return self._capture_fn(env) if self._capture_fn is not None else env.capture_state()

    def restore_state(self, lane: int, state: bytes) -> np.ndarray:
        if (problem := self.state_problem()) is not None:
            raise StateUnsupported(problem)
        env = self.envs[lane]
        return np.asarray(self._restore_fn(env, state) if self._restore_fn is not None else env.restore_state(state))

    def render(self) -> list[np.ndarray]:
        return [env.render() for env in self.envs]

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing must not mask the real error
                logger.debug("closing a lane failed", exc_info=True)


def _worker(conn: Any, factory: LaneFactory, n: int, lane_offset: int, render_mode: str | None,
            state_codec: StateCodec | None = None) -> None:
    """Subprocess main loop: owns lanes [lane_offset, lane_offset + n)."""
    try:
        lanes = SyncLanes(factory, n, render_mode=render_mode, lane_offset=lane_offset, state_codec=state_codec)
        conn.send(("ok", (lanes.single_observation_space, lanes.single_action_space, lanes.has_ram,
                          lanes.starts)))
    except BaseException:  # noqa: BLE001 - reported to the parent
        conn.send(("error", traceback.format_exc()))
        conn.close()
        return
    try:
        while True:
            cmd, arg = conn.recv()
            try:
                if cmd == "step":
                    conn.send(("ok", lanes.step(arg)))
                elif cmd == "reset":
                    lane_ids, seeds, starts = arg
                    conn.send(("ok", lanes.reset_lanes(lane_ids, seeds, starts=starts)))
                elif cmd == "render":
                    conn.send(("ok", lanes.render()))
                elif cmd == "ram":
                    conn.send(("ok", lanes.ram()))
                elif cmd == "state_problem":
                    conn.send(("ok", lanes.state_problem()))
                elif cmd == "capture":
                    conn.send(("ok", lanes.capture_state(arg)))
                elif cmd == "restore":
                    conn.send(("ok", lanes.restore_state(*arg)))
                elif cmd == "close":
                    lanes.close()
                    conn.send(("ok", None))
                    return
            except Exception:  # noqa: BLE001 - reported to the parent
                conn.send(("error", traceback.format_exc()))
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        lanes.close()


@contextlib.contextmanager
def main_hidden() -> Iterator[None]:
    """Start a ``spawn`` child without re-running the parent's ``__main__`` script.

    Lane factories are module-level functions of importable modules, so the child never needs the
    parent's main module; hiding it lets scripts without an ``if __name__ == "__main__"`` guard
    build async lanes.
    """
    main = sys.modules.get("__main__")
    saved = {k: getattr(main, k) for k in ("__file__", "__spec__") if main is not None and hasattr(main, k)}
    try:
        if "__file__" in saved:
            delattr(main, "__file__")
        if "__spec__" in saved:
            main.__spec__ = None  # type: ignore[union-attr]
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


class AsyncLanes(LaneBackend):
    """N lanes spread over worker processes (``spawn``), stepped in parallel.

    Args:
        factory: picklable lane factory (a module-level function or ``functools.partial`` of one).
        n: lane count.
        workers: process count (default: min(n, CPU count)); each owns a contiguous block of lanes.
        lanes_per_worker: force this many lanes per process (stable-retro needs 1).
    """

    def __init__(self, factory: LaneFactory, n: int, *, render_mode: str | None = None,
                 workers: int | None = None, lanes_per_worker: int | None = None, name: str = "lanes",
                 state_codec: StateCodec | None = None):
        self.num_envs = n
        if lanes_per_worker is not None:
            workers = -(-n // lanes_per_worker)
        workers = max(1, min(n, workers or os.cpu_count() or 1))
        bounds = np.linspace(0, n, workers + 1).round().astype(int)
        self._blocks = [(int(bounds[i]), int(bounds[i + 1])) for i in range(workers) if bounds[i + 1] > bounds[i]]
        ctx = mp.get_context("spawn")
        self._conns = []
        self._procs = []
        self._closed = False
        for lo, hi in self._blocks:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child, factory, hi - lo, lo, render_mode, state_codec), daemon=True,
                               name=f"gradlab-{name}-{lo}")
            with main_hidden():
                proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        try:
            answers = [self._recv(i) for i in range(len(self._conns))]
        except BaseException:
            self.close()
            raise
        self.single_observation_space, self.single_action_space, self.has_ram, self.starts = answers[0]
        self._obs_shape = tuple(self.single_observation_space.shape)
        self._obs_dtype = self.single_observation_space.dtype

    def _recv(self, i: int) -> Any:
        try:
            status, payload = self._conns[i].recv()
        except (EOFError, ConnectionResetError) as e:
            lo, hi = self._blocks[i]
            raise LaneCrashed(f"environment worker for lanes {lo}..{hi - 1} died "
                              f"(exit code {self._procs[i].exitcode})") from e
        if status == "refused":
            kind, message = payload
            raise (StateUnsupported if kind == "StateUnsupported" else IntegrityError)(message)
        if status == "error":
            lo, hi = self._blocks[i]
            raise LaneCrashed(f"environment lanes {lo}..{hi - 1} raised:\n{payload}")
        return payload

    def reset_lanes(self, lanes: Sequence[int], seeds: Sequence[int | None], *,
                    starts: Sequence[str | None] | None = None) -> tuple[list[np.ndarray], list[dict]]:
        by_worker: dict[int, tuple[list[int], list[int | None], list[str | None]]] = {}
        lane_starts = list(starts) if starts is not None else [None] * len(lanes)
        for lane, seed, start in zip(lanes, seeds, lane_starts, strict=True):
            for w, (lo, hi) in enumerate(self._blocks):
                if lo <= lane < hi:
                    entry = by_worker.setdefault(w, ([], [], []))
                    entry[0].append(lane - lo)
                    entry[1].append(seed)
                    entry[2].append(start)
                    break
        for w, (lane_ids, lane_seeds, block_starts) in by_worker.items():
            self._conns[w].send(("reset", (lane_ids, lane_seeds, block_starts if starts is not None else None)))
        obs: list[np.ndarray] = []
        infos: list[dict] = []
        for w in sorted(by_worker):
            o, i = self._recv(w)
            obs += o
            infos += i
        return obs, infos

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        for w, (lo, hi) in enumerate(self._blocks):
            self._conns[w].send(("step", actions[lo:hi]))
        parts = [self._recv(w) for w in range(len(self._blocks))]
        obs = np.concatenate([p[0] for p in parts])
        rew = np.concatenate([p[1] for p in parts])
        term = np.concatenate([p[2] for p in parts])
        trunc = np.concatenate([p[3] for p in parts])
        infos = [info for p in parts for info in p[4]]
        return obs, rew, term, trunc, infos

    def _all(self, cmd: str) -> list[Any]:
        for conn in self._conns:
            conn.send((cmd, None))
        return [self._recv(w) for w in range(len(self._conns))]

    def ram(self) -> np.ndarray:
        return np.concatenate(self._all("ram"))

    def _worker_of(self, lane: int) -> tuple[int, int]:
        for w, (lo, hi) in enumerate(self._blocks):
            if lo <= lane < hi:
                return w, lane - lo
        raise IndexError(f"lane {lane} out of range 0..{self.num_envs - 1}")

    def state_problem(self) -> str | None:
        self._conns[0].send(("state_problem", None))
        return self._recv(0)

    def capture_state(self, lane: int) -> bytes:
        """The lane's state, captured in its worker process (refusals are raised here as they were there)."""
        w, local = self._worker_of(lane)
        self._conns[w].send(("capture", local))
        return self._recv(w)

    def restore_state(self, lane: int, state: bytes) -> np.ndarray:
        w, local = self._worker_of(lane)
        self._conns[w].send(("restore", (local, state)))
        return self._recv(w)

    def render(self) -> list[np.ndarray]:
        return [frame for part in self._all("render") for frame in part]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for conn in self._conns:
            try:
                conn.send(("close", None))
            except (BrokenPipeError, OSError):
                pass
        for conn, proc in zip(self._conns, self._procs, strict=True):
            try:
                if conn.poll(10):
                    conn.recv()
            except (EOFError, OSError):
                pass
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
            conn.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def build_lanes(factory: LaneFactory, spec: Any, *, default: str, render_mode: str | None,
                lanes_per_worker: int | None = None, name: str = "lanes",
                state_codec: StateCodec | None = None) -> LaneBackend:
    """Sync or async lanes for ``spec`` (``vectorization: auto`` → ``default``; ``native`` → sync).

    Args:
        factory: picklable lane factory.
        spec: the EnvironmentSpec (``n_envs``, ``vectorization``, ``num_threads`` = worker processes).
        default: "sync" or "async", the provider's choice for ``auto``.
        lanes_per_worker: force lanes per process for async (stable-retro: 1).
        state_codec: how to capture/restore a lane env that has no methods of its own (gymnasium).
    """
    mode = spec.vectorization if spec.vectorization in ("sync", "async") else default
    if mode == "native":
        mode = "sync"
    if mode == "async":
        return AsyncLanes(factory, spec.n_envs, render_mode=render_mode, workers=spec.num_threads,
                          lanes_per_worker=lanes_per_worker, name=name, state_codec=state_codec)
    return SyncLanes(factory, spec.n_envs, render_mode=render_mode, state_codec=state_codec)


def parse_provider_args(model: type, spec: Any) -> Any:
    """Validate ``spec.provider_args`` against a pydantic ``model``.

    Raises:
        ConfigError: naming ``provider_args.<key>``, what was expected and what was found.
    """
    from pydantic import ValidationError

    from gradlab.errors import ConfigError

    try:
        return model.model_validate(spec.provider_args)
    except ValidationError as e:
        problems = []
        for err in e.errors(include_url=False):
            loc = ".".join(str(p) for p in ("provider_args", *err["loc"]))
            problems.append(f"{spec.provider}:{spec.env_id}: {loc}: {err['msg']} (found {err.get('input')!r})")
        raise ConfigError("; ".join(problems)) from None
