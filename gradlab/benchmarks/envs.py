"""``gradlab benchmark envs``: gradlab's vector envs next to the bare libraries, same machine, same run.

Per provider and lane count: lane steps per second through ``make_vector_env`` (task program,
same-step autoreset, per-lane infos) and through the library's own loop with the same settings,
and their ratio (goal: >= 0.9). Random actions come from a seeded ``numpy.random.Generator``
drawn before timing.

Bare loops:
    gymnasium  ``gymnasium.vector.SyncVectorEnv`` of ``gym.make`` (next-step autoreset); a
               reference row gives the plain single env's own loop.
    ale        ``ale_py.vector_env.AtariVectorEnv`` with the goal's settings (v5, 84×84×4).
    vizdoom    :func:`bare_vizdoom_loop`: ``DoomGame.make_action(action, 4)`` lanes stepped in one
               process (ViZDoom has no vector env), GRAY8 160×120 resized to 84×84 with PIL and
               stacked 4 deep by hand, the same preprocessing calls gradlab makes (gradlab
               additionally runs the task program and keeps final observations).
    retro      :func:`bare_retro_loop`: one ``stable_retro`` env repeating each action 4 frames,
               grayscale and 84×84 with PIL, 4 stacked, as gradlab does (gradlab, ``auto``:
               one lane in-process, two in a worker process each).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gradlab.contracts.environment import EnvironmentSpec


def _timed(step: Callable[[int], None], n_lanes: int, seconds: float, warmup: int = 20) -> float:
    for i in range(warmup):
        step(i)
    steps = 0
    t0 = time.perf_counter()
    while True:
        for _ in range(50):
            step(steps)
            steps += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return steps * n_lanes / elapsed


def _gradlab(spec: EnvironmentSpec, seconds: float, n_actions: int) -> float:
    return _gradlab_mode(spec, seconds, n_actions)[0]


def _gradlab_mode(spec: EnvironmentSpec, seconds: float, n_actions: int) -> tuple[float, str]:
    """(lane steps per second, the vectorization actually built: sync, async or native)."""
    from gradlab.envs.lanes import AsyncLanes, SyncLanes
    from gradlab.envs.vector import make_vector_env

    venv = make_vector_env(spec, seed=0)
    try:
        mode = {SyncLanes: "sync", AsyncLanes: "async"}.get(type(venv.backend), "native")
        venv.reset()
        acts = np.random.default_rng(0).integers(0, n_actions, size=(4096, spec.n_envs))
        return _timed(lambda i: venv.step(acts[i % 4096]), spec.n_envs, seconds), mode
    finally:
        venv.close()


def _bare_gym(env_id: str, n: int, seconds: float) -> float:
    import gymnasium as gym

    acts = np.random.default_rng(0).integers(0, 2, size=(4096, max(n, 1)))
    if n == 0:  # the single env, no vector loop
        env = gym.make(env_id)
        env.reset(seed=0)

        def step(i: int) -> None:
            _, _, te, tr, _ = env.step(int(acts[i % 4096, 0]))
            if te or tr:
                env.reset()

        rate = _timed(step, 1, seconds)
        env.close()
        return rate
    venv = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(n)])
    venv.reset(seed=0)
    rate = _timed(lambda i: venv.step(acts[i % 4096]), n, seconds)
    venv.close()
    return rate


def _bare_ale(game: str, n: int, seconds: float) -> float:
    from ale_py.vector_env import AtariVectorEnv

    env = AtariVectorEnv(game, n, repeat_action_probability=0.25, reward_clipping=False, use_fire_reset=False)
    env.reset(seed=0)
    acts = np.random.default_rng(0).integers(0, 4, size=(4096, n))
    rate = _timed(lambda i: env.step(acts[i % 4096]), n, seconds)
    env.close()
    return rate


def _bare_timed(make: Callable[[], tuple[Callable[[int], Any], Callable[[], None]]], n: int, seconds: float) -> float:
    step, close = make()
    try:
        return _timed(step, n, seconds)
    finally:
        close()


def _doom_frame(game: Any) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(game.get_state().screen_buffer).resize((84, 84), Image.BILINEAR))


def bare_vizdoom_loop(scenario: str, n: int) -> tuple[Callable[[int], Any], Callable[[], None]]:
    """The loop a user writes for ``n`` ViZDoom lanes with the goals' settings, no gradlab.

    Each lane: a hidden, silent ``DoomGame`` (160×120 GRAY8, the scenario's own timeout); one
    step is ``make_action(buttons, 4)``, a ``new_episode()`` when the episode finished, the
    screen buffer resized to 84×84 with PIL (bilinear, as gradlab does) and pushed on a 4-frame
    stack; the step returns the stacked batch (n, 4, 84, 84) uint8, rewards (n,) float64 and
    episode ends (n,) bool. Random actions come from ``default_rng(0)``; lane ``i`` is seeded
    ``seed32(i)`` like gradlab's lane ``i`` of run seed 0, so both loops play the same episodes.

    Returns:
        ``(step(i), close())``: ``step`` does one vector step with the i-th action row.
    """
    import vizdoom as vzd

    from gradlab.envs.backend import seed32

    games = []
    for lane in range(n):
        g = vzd.DoomGame()
        g.load_config(os.path.join(vzd.scenarios_path, scenario + ".cfg"))
        g.set_window_visible(False)
        g.set_sound_enabled(False)
        g.set_screen_resolution(vzd.ScreenResolution.RES_160X120)
        g.set_screen_format(vzd.ScreenFormat.GRAY8)
        g.init()
        g.set_seed(seed32(lane))  # the seed gradlab's lane gets from run seed 0: the same episodes
        g.new_episode()
        games.append(g)
    n_buttons = len(games[0].get_available_buttons())
    actions = [[0] * n_buttons] + [[int(j == i) for j in range(n_buttons)] for i in range(n_buttons)]
    acts = np.random.default_rng(0).integers(0, len(actions), size=(4096, n)).tolist()
    stacks = np.zeros((n, 4, 84, 84), dtype=np.uint8)
    for lane, g in enumerate(games):
        stacks[lane] = _doom_frame(g)
    rewards = np.zeros(n)
    dones = np.zeros(n, dtype=np.bool_)

    def step(i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        row = acts[i % 4096]
        for lane, g in enumerate(games):
            rewards[lane] = g.make_action(actions[row[lane]], 4)
            dones[lane] = done = g.is_episode_finished()
            if done:
                g.new_episode()
                stacks[lane] = _doom_frame(g)
            else:
                stacks[lane, :-1] = stacks[lane, 1:]
                stacks[lane, -1] = _doom_frame(g)
        return stacks.copy(), rewards.copy(), dones.copy()

    def close() -> None:
        for g in games:
            g.close()

    return step, close


def bare_retro_loop(game: str) -> tuple[Callable[[int], Any], Callable[[], None]]:
    """The loop a user writes for one stable-retro env with the goal's settings, no gradlab.

    ``stable_retro.make(game, use_restricted_actions=DISCRETE)``; one step repeats the action for
    4 frames (summing rewards, stopping at the episode's end), converts the last screen to
    grayscale and 84×84 with PIL (``convert("L")``, bilinear resize, as gradlab does) and pushes
    it on a 4-frame stack; an ended episode resets and refills the stack. Returns the stack
    (4, 84, 84) uint8, the reward and the end flag. Must run in a process without an emulator.

    Returns:
        ``(step(i), close())``.
    """
    import stable_retro as retro
    from PIL import Image

    env = retro.make(game, use_restricted_actions=retro.Actions.DISCRETE, render_mode=None)

    def frame(screen: np.ndarray) -> np.ndarray:
        return np.asarray(Image.fromarray(screen).convert("L").resize((84, 84), Image.BILINEAR))

    screen, _ = env.reset(seed=0)
    stack = np.repeat(frame(screen)[None], 4, axis=0)
    acts = np.random.default_rng(0).integers(0, env.action_space.n, size=4096).tolist()

    def step(i: int) -> tuple[np.ndarray, float, bool]:
        total = 0.0
        a = acts[i % 4096]
        for _ in range(4):
            screen, reward, te, tr, _ = env.step(a)
            total += reward
            if te or tr:
                break
        if te or tr:
            screen, _ = env.reset()
            stack[:] = frame(screen)
        else:
            stack[:-1] = stack[1:]
            stack[-1] = frame(screen)
        return stack.copy(), total, te or tr

    return step, env.close


def bare_loop(lib: str, n: int) -> tuple[Callable[[int], Any], Callable[[], None]]:
    """The bare loop of ``lib`` ("viz": ViZDoom basic, "retro": Airstriker) with ``n`` lanes, for
    instruction counts (``valgrind --tool=callgrind``) and wall-clock timing alike."""
    if lib == "viz":
        return bare_vizdoom_loop("basic", n)
    if n != 1:
        raise ValueError(f"bare_loop: retro runs one emulator per process, found n={n}")
    return bare_retro_loop("Airstriker-Genesis-v0")


def _bare_vizdoom(scenario: str, n: int, seconds: float) -> float:
    return _bare_timed(lambda: bare_vizdoom_loop(scenario, n), n, seconds)


def _bare_retro(game: str, seconds: float) -> float:
    return _bare_timed(lambda: bare_retro_loop(game), 1, seconds)


def _spec(provider: str, env_id: str, n: int, **kw: Any) -> EnvironmentSpec:
    return EnvironmentSpec.model_validate({"provider": provider, "env_id": env_id, "n_envs": n, **kw})


def _retro_in_subprocess(game: str, seconds: float) -> float:
    """stable-retro allows one emulator per process: run the bare loop in a fresh one."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_bare_retro, (game, seconds))


def run(cases: tuple[str, ...], seconds: float, rounds: int = 3) -> list[dict[str, Any]]:
    """Measure every case; returns rows ``{provider, env_id, lanes, vectorization, gradlab_steps_per_s,
    bare_steps_per_s, bare, ratio}``.

    Each row alternates gradlab and the bare loop for ``rounds`` rounds of ``seconds`` each and keeps
    the fastest of each side: on a shared 2-core VM the speed drifts by more than 10% within a minute,
    and back-to-back single measurements turn that drift into the ratio.
    """
    rows = []

    def add(provider: str, env_id: str, lanes: int, mode: str, ours: float, bare: float, bare_name: str) -> None:
        rows.append({"provider": provider, "env_id": env_id, "lanes": lanes, "vectorization": mode,
                     "gradlab_steps_per_s": round(ours, 1), "bare_steps_per_s": round(bare, 1), "bare": bare_name,
                     "ratio": round(ours / bare, 3) if bare else None})

    def best(ours: Callable[[], tuple[float, str]], bare: Callable[[], float]) -> tuple[float, str, float]:
        fastest, mode, fastest_bare = 0.0, "", 0.0
        for _ in range(rounds):
            rate, mode = ours()
            fastest = max(fastest, rate)
            fastest_bare = max(fastest_bare, bare())
        return fastest, mode, fastest_bare

    if "gymnasium" in cases:
        single = max(_bare_gym("CartPole-v1", 0, seconds) for _ in range(rounds))
        for n in (1, 8):
            spec = _spec("gymnasium", "CartPole-v1", n, vectorization="sync")
            ours, mode, bare = best(lambda spec=spec: _gradlab_mode(spec, seconds, 2),
                                    lambda n=n: _bare_gym("CartPole-v1", n, seconds))
            add("gymnasium", "CartPole-v1", n, mode, ours, bare, "SyncVectorEnv")
        add("gymnasium", "CartPole-v1", 1, "none", single, single, "gym.make single env (reference)")
    if "ale" in cases:
        for n in (1, 8):
            spec = _spec("ale", "Breakout", n)
            ours, mode, bare = best(lambda spec=spec: _gradlab_mode(spec, seconds, 4),
                                    lambda n=n: _bare_ale("breakout", n, seconds))
            add("ale", "Breakout", n, mode, ours, bare, "AtariVectorEnv")
    if "vizdoom" in cases:
        for n, vec in ((1, "sync"), (4, "sync"), (4, "async")):
            spec = _spec("vizdoom", "basic", n, vectorization=vec)
            ours, mode, bare = best(lambda spec=spec: _gradlab_mode(spec, seconds, 4),
                                    lambda n=n: _bare_vizdoom("basic", n, seconds))
            add("vizdoom", "basic", n, mode, ours, bare, "DoomGame loop")
    if "retro" in cases:
        for n in (1, 2):  # vectorization auto: 1 lane in-process, 2 in worker processes
            spec = _spec("retro", "Airstriker-Genesis-v0", n)
            ours, mode, bare = best(lambda spec=spec: _gradlab_mode(spec, seconds, 126),
                                    lambda: _retro_in_subprocess("Airstriker-Genesis-v0", seconds))
            add("retro", "Airstriker-Genesis-v0", n, mode, ours, bare, "RetroEnv loop" + (" (1 lane)" if n > 1 else ""))
    return rows


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def main(*, cases: tuple[str, ...], seconds: float, as_json: bool, rounds: int = 3) -> None:
    """Run the cases and print a table (or one JSON document)."""
    from gradlab.console import console, print_json

    rows = run(cases, seconds, rounds)
    if as_json:
        print_json({"machine": machine(), "rows": rows})
        return
    from rich.table import Table

    table = Table("provider", "env", "lanes", "vectorization", "gradlab steps/s", "bare steps/s", "bare loop", "ratio")
    for r in rows:
        table.add_row(r["provider"], r["env_id"], str(r["lanes"]), r["vectorization"], f"{r['gradlab_steps_per_s']:,.0f}",
                      f"{r['bare_steps_per_s']:,.0f}", r["bare"], f"{r['ratio']:.2f}")
    console.print(table)
    console.print(machine())
