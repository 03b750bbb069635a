"""`gradlab env inspect` on a gymnasium env that renders through pygame: quiet stderr, same frames."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
_SDL_VARS = ("XDG_RUNTIME_DIR", "SDL_VIDEODRIVER", "SDL_AUDIODRIVER", "DISPLAY", "WAYLAND_DISPLAY")


def _headless_env(**extra: str) -> dict[str, str]:
    """This process's environment without a display session (as on a server or in CI)."""
    env = {k: v for k, v in os.environ.items() if k not in _SDL_VARS}
    return {**env, **extra}


def test_env_inspect_cartpole_prints_no_sdl_error() -> None:
    out = subprocess.run([sys.executable, "-m", "gradlab.cli.app", "env", "inspect", "gymnasium:CartPole-v1", "--json"],
                         capture_output=True, text=True, cwd=REPO, env=_headless_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "XDG_RUNTIME_DIR" not in out.stderr and "error" not in out.stderr.lower()
    info = json.loads(out.stdout)
    # CartPole-v1 draws a 600x400 screen (gymnasium classic_control/cartpole.py screen_width/height).
    assert info["render_shape"] == [400, 600, 3] and info["native_max_steps"] == 500


_FRAME_SCRIPT = """
import os, sys
import numpy as np
from gradlab.envs.providers.gym import _make_lane
env = _make_lane("CartPole-v1", {}, 1, lane=0, render_mode="rgb_array")
env.reset(seed=0)
np.save(sys.argv[1], env.render())
print(os.environ["SDL_VIDEODRIVER"])
"""


def test_rgb_array_frame_is_unchanged_by_the_dummy_driver(tmp_path: Path) -> None:
    """The frame from the default (now ``dummy``) driver equals the one under a user's explicit
    ``offscreen`` driver, which gradlab keeps: pixels come from the off-screen surface either way."""
    frames = {}
    for name, extra in (("default", {}), ("offscreen", {"SDL_VIDEODRIVER": "offscreen"})):
        path = tmp_path / f"{name}.npy"
        out = subprocess.run([sys.executable, "-c", _FRAME_SCRIPT, str(path)], capture_output=True, text=True,
                             cwd=REPO, env=_headless_env(**extra), timeout=120)
        assert out.returncode == 0, out.stderr
        assert "XDG_RUNTIME_DIR" not in out.stderr
        assert out.stdout.strip() == ("dummy" if name == "default" else "offscreen")
        frames[name] = np.load(path)
    frame = frames["default"]
    assert frame.shape == (400, 600, 3) and frame.dtype == np.uint8
    assert frame[0, 0].tolist() == [255, 255, 255]  # white background (cartpole.py fills (255, 255, 255))
    assert frame.min() == 0  # the black track line and cart
    np.testing.assert_array_equal(frame, frames["offscreen"])


def _inspect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradlab.cli.app", "env", "inspect", *args], capture_output=True,
                          text=True, cwd=REPO, env=_headless_env(), timeout=120)


def test_env_inspect_ale_shows_every_emulator_setting() -> None:
    """ALE v5 defaults (Machado et al. 2018): frame skip 4, sticky actions 0.25, minimal action set,
    up to 30 reset no-ops, max-pool, and the 108,000-frame cap = 27,000 agent steps at skip 4."""
    out = _inspect("ale:Breakout", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert {k: info["extra"][k] for k in ("frame_skip", "repeat_action_probability", "action_set", "noop_max",
                                          "max_pool", "max_frames_per_episode", "max_steps_per_episode")} == {
        "frame_skip": 4, "repeat_action_probability": 0.25, "action_set": "minimal", "noop_max": 30,
        "max_pool": True, "max_frames_per_episode": 108_000, "max_steps_per_episode": 27_000}
    assert info["native_max_steps"] == 27_000 and info["n_actions"] == 4  # Breakout's minimal set

    human = _inspect("ale:Breakout")
    assert human.returncode == 0, human.stderr
    for label in ("frame skip", "sticky-action probability", "action set", "noop max", "max-pool",
                  "episode cap (emulator frames)", "episode cap (agent steps)"):
        assert label in human.stdout, label


def test_env_inspect_ale_cap_in_steps_follows_frame_skip() -> None:
    out = _inspect("ale:Breakout", "--set", "preprocessing.frame_skip=7", "--set", "preprocessing.full_action_space=true",
                   "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    # The cap is checked after each 7-frame step: truncation at step ceil(108000 / 7) = 15429.
    assert info["extra"]["max_frames_per_episode"] == 108_000
    assert info["extra"]["max_steps_per_episode"] == info["native_max_steps"] == 15_429
    assert info["extra"]["action_set"] == "full" and info["n_actions"] == 18
    bad = _inspect("ale:Breakout", "--set", "preprocessing.frame_skp=3")
    assert bad.returncode == 1 and "preprocessing.frame_skp" in bad.stderr


def test_ale_cap_in_agent_steps_matches_the_emulator(monkeypatch) -> None:
    """max_agent_steps against ale-py itself, on a short cap: the step at which it truncates."""
    from ale_py.vector_env import AtariVectorEnv

    from gradlab.envs.providers import ale

    for frame_skip in (4, 7):
        env = AtariVectorEnv("breakout", 1, max_num_frames_per_episode=100, frameskip=frame_skip,
                             repeat_action_probability=0.0, noop_max=0, autoreset_mode="NextStep")
        try:
            env.reset(seed=0)
            steps = 0
            while True:  # NOOP: the ball is never launched, so only the cap ends the episode
                _, _, terminated, truncated, _ = env.step(np.zeros(1, dtype=np.int64))
                steps += 1
                if terminated[0] or truncated[0]:
                    break
        finally:
            env.close()
        assert truncated[0] and not terminated[0]
        monkeypatch.setattr(ale, "MAX_FRAMES_PER_EPISODE", 100)
        assert ale.max_agent_steps(frame_skip) == steps
        monkeypatch.undo()


def test_the_ale_episode_cap_is_in_frames_at_every_frame_skip() -> None:
    """Frame skip 2: ALE's 108,000-frame cap is 54,000 agent steps, for the goal and for ``env inspect``."""
    from gradlab.contracts import Experiments
    from gradlab.envs.registry import describe
    from gradlab.runs.timeouts import episode_step_cap

    resolved = Experiments().resolve("Breakout-Atari2600-v0/ppo", ["train.environment.preprocessing.frame_skip=2"])
    env = resolved.environment
    assert env.task.termination.max_episode_steps is None  # no goal-level step cap that ignores the skip
    info = describe(env).as_json()
    assert info["native_max_steps"] == 54_000
    assert (info["extra"]["max_frames_per_episode"], info["extra"]["max_steps_per_episode"]) == (108_000, 54_000)
    goal = resolved.goal.model_copy(update={"train": resolved.goal.train.model_copy(update={"environment": env})})
    assert episode_step_cap(goal) == 54_000
    out = _inspect("ale:Breakout", "--set", "preprocessing.frame_skip=2")
    assert out.returncode == 0, out.stderr
    assert "episode cap (emulator frames) │ 108000" in out.stdout and "episode cap (agent steps)     │ 54000" in out.stdout
