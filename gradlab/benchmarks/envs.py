"""``gradlab benchmark envs``: gradlab's vector envs next to the bare libraries, same machine, same run.

Per provider and lane count: lane steps per second through ``make_vector_env`` (task program,
same-step autoreset, per-lane infos) and through the library's own loop with the same settings,
and their ratio (goal: >= 0.9). Random actions come from a seeded ``numpy.random.Generator``
drawn before timing.

Bare loops:
    gymnasium  ``gymnasium.vector.SyncVectorEnv`` of ``gym.make`` (next-step autoreset); a
               reference row gives the plain single env's own loop.
    ale        ``ale_py.vector_env.AtariVectorEnv`` with the goal's settings (v5, 84×84×4).
    vizdoom    ``DoomGame.make_action(action, 4)`` lanes stepped in one process (ViZDoom has no
               vector env), GRAY8 160×120 resized to 84×84 with PIL as gradlab does (gradlab
               additionally stacks 4 frames and runs the task program).
    retro      one ``stable_retro`` env repeating each action 4 frames (gradlab: a worker process
               per lane, grayscale, 84×84, 4 stacked).
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
    from gradlab.envs.vector import make_vector_env

    venv = make_vector_env(spec, seed=0)
    try:
        venv.reset()
        acts = np.random.default_rng(0).integers(0, n_actions, size=(4096, spec.n_envs))
        return _timed(lambda i: venv.step(acts[i % 4096]), spec.n_envs, seconds)
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


def _bare_vizdoom(scenario: str, n: int, seconds: float) -> float:
    import vizdoom as vzd
    from PIL import Image

    games = []
    for _ in range(n):
        g = vzd.DoomGame()
        g.load_config(os.path.join(vzd.scenarios_path, scenario + ".cfg"))
        g.set_window_visible(False)
        g.set_sound_enabled(False)
        g.set_screen_resolution(vzd.ScreenResolution.RES_160X120)
        g.set_screen_format(vzd.ScreenFormat.GRAY8)
        g.init()
        g.new_episode()
        games.append(g)
    n_buttons = len(games[0].get_available_buttons())
    actions = [[0] * n_buttons] + [[int(j == i) for j in range(n_buttons)] for i in range(n_buttons)]
    acts = np.random.default_rng(0).integers(0, len(actions), size=(4096, n))

    def step(i: int) -> None:
        for lane, g in enumerate(games):
            g.make_action(actions[acts[i % 4096, lane]], 4)
            if g.is_episode_finished():
                g.new_episode()
            else:
                # The frame a learner reads, resized as gradlab's preprocessing does (PIL bilinear).
                Image.fromarray(g.get_state().screen_buffer).resize((84, 84), Image.BILINEAR)

    rate = _timed(step, n, seconds)
    for g in games:
        g.close()
    return rate


def _bare_retro(game: str, seconds: float) -> float:
    import stable_retro as retro

    env = retro.make(game, use_restricted_actions=retro.Actions.DISCRETE, render_mode=None)
    env.reset(seed=0)
    acts = np.random.default_rng(0).integers(0, env.action_space.n, size=4096)

    def step(i: int) -> None:
        for _ in range(4):
            _, _, te, tr, _ = env.step(int(acts[i % 4096]))
            if te or tr:
                env.reset()
                break

    rate = _timed(step, 1, seconds)
    env.close()
    return rate


def _spec(provider: str, env_id: str, n: int, **kw: Any) -> EnvironmentSpec:
    return EnvironmentSpec.model_validate({"provider": provider, "env_id": env_id, "n_envs": n, **kw})


def _retro_in_subprocess(game: str, seconds: float) -> float:
    """stable-retro allows one emulator per process: run the bare loop in a fresh one."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_bare_retro, (game, seconds))


def run(cases: tuple[str, ...], seconds: float) -> list[dict[str, Any]]:
    """Measure every case; returns rows ``{provider, env_id, lanes, vectorization, gradlab_steps_per_s,
    bare_steps_per_s, bare, ratio}``."""
    rows = []

    def add(provider: str, env_id: str, lanes: int, mode: str, ours: float, bare: float, bare_name: str) -> None:
        rows.append({"provider": provider, "env_id": env_id, "lanes": lanes, "vectorization": mode,
                     "gradlab_steps_per_s": round(ours, 1), "bare_steps_per_s": round(bare, 1), "bare": bare_name,
                     "ratio": round(ours / bare, 3) if bare else None})

    if "gymnasium" in cases:
        single = _bare_gym("CartPole-v1", 0, seconds)
        for n in (1, 8):
            ours = _gradlab(_spec("gymnasium", "CartPole-v1", n, vectorization="sync"), seconds, 2)
            add("gymnasium", "CartPole-v1", n, "sync", ours, _bare_gym("CartPole-v1", n, seconds), "SyncVectorEnv")
        add("gymnasium", "CartPole-v1", 1, "none", single, single, "gym.make single env (reference)")
    if "ale" in cases:
        for n in (1, 8):
            ours = _gradlab(_spec("ale", "Breakout", n), seconds, 4)
            add("ale", "Breakout", n, "native", ours, _bare_ale("breakout", n, seconds), "AtariVectorEnv")
    if "vizdoom" in cases:
        for n, mode in ((1, "sync"), (4, "sync"), (4, "async")):
            ours = _gradlab(_spec("vizdoom", "basic", n, vectorization=mode), seconds, 4)
            add("vizdoom", "basic", n, mode, ours, _bare_vizdoom("basic", n, seconds), "DoomGame loop")
    if "retro" in cases:
        ours = _gradlab(_spec("retro", "Airstriker-Genesis-v0", 1), seconds, 126)
        add("retro", "Airstriker-Genesis-v0", 1, "async", ours,
            _retro_in_subprocess("Airstriker-Genesis-v0", seconds), "RetroEnv loop")
        ours = _gradlab(_spec("retro", "Airstriker-Genesis-v0", 2), seconds, 126)
        add("retro", "Airstriker-Genesis-v0", 2, "async", ours,
            _retro_in_subprocess("Airstriker-Genesis-v0", seconds), "RetroEnv loop (1 lane)")
    return rows


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def main(*, cases: tuple[str, ...], seconds: float, as_json: bool) -> None:
    """Run the cases and print a table (or one JSON document)."""
    from gradlab.cli.output import console, print_json

    rows = run(cases, seconds)
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
