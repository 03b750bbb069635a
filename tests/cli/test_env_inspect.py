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
