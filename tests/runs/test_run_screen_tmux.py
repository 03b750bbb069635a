"""The live screen of ``gradlab train`` as a person sees it: a real run in a tmux terminal
(120x40), read back with ``tmux capture-pane``; and the same command piped, which prints
change-only lines with no terminal control sequences.

The final screen is kept as a test artifact (``tmux-train-screen.txt``, tests/browser.py's folder).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gradlab.cli.run_screen import SPARK
from tests.browser import artifacts_dir
from tests.runs.conftest import REPO, gradlab_env, run_gradlab, wait_for

TMUX = shutil.which("tmux") or "/usr/bin/tmux"
GOAL = "gradlab__bandit/ppo"  # the cheapest goal that evaluates
EXITED = "gradlab exited with"


def _tmux(socket: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TMUX, "-S", str(socket), *args], capture_output=True, text=True, timeout=30)


@pytest.mark.slow
def test_train_screen_under_tmux_and_piped_lines(prefect_api: str, tmp_path: Path) -> None:
    if not Path(TMUX).is_file():
        pytest.skip("tmux is not installed")
    env = gradlab_env(prefect_api)
    script = tmp_path / "train.sh"
    # The pane's own terminal settings, as a person's shell has them: not this process's TERM, and
    # no COLUMNS/LINES (the pane's environment had COLUMNS=80, and the screen was drawn at 80 columns).
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()
                      if k.isidentifier() and k not in ("TERM", "COLUMNS", "LINES"))
    command = shlex.join([sys.executable, "-m", "gradlab.cli.app", "train", GOAL])
    # The pane stays open after the command (so its last screen can be read) until the server is killed.
    script.write_text(f"{exports}unset COLUMNS LINES\ncd {shlex.quote(str(REPO))}\n{command}\n"
                      f"echo \"{EXITED} $?\"\nexec sleep 3600\n")
    socket = tmp_path / "tmux.sock"
    started = _tmux(socket, "new-session", "-d", "-x", "120", "-y", "40", f"bash {shlex.quote(str(script))}")
    assert started.returncode == 0, started.stderr
    try:
        def screen() -> str:
            return _tmux(socket, "capture-pane", "-p", "-S", "-200").stdout

        wait_for(lambda: "steps/s" in screen(), 300, "the live screen's steps/s", interval_s=0.5)
        wait_for(lambda: any(c in screen() for c in SPARK), 300, "a sparkline of the return", interval_s=0.5)
        wait_for(lambda: "accepted" in screen(), 600, "an accepted evaluation", interval_s=0.5)
        def ended() -> str | None:
            text = screen()
            return text if EXITED in text else None

        final = wait_for(ended, 300, "the run's end", interval_s=0.5)
        (artifacts_dir() / "tmux-train-screen.txt").write_text(final)
        assert f"{EXITED} 0" in final, final
        assert "outcome" in final and "succeeded" in final and "wall time" in final, final
        assert "return mean ± 95%" in final and "verdict" in final, final  # the evaluations table
        assert "stop" in final and "checkpoints" in final, final
        assert max(len(line) for line in final.splitlines()) > 80, final  # drawn at the pane's width
    finally:
        _tmux(socket, "kill-server")

    piped = run_gradlab(["train", GOAL], env, timeout_s=600)
    assert piped.returncode == 0, piped.stderr[-3000:]
    assert "\x1b" not in piped.stderr and "\r" not in piped.stderr, piped.stderr[-3000:]
    lines = [line for line in piped.stderr.splitlines() if line.strip()]
    step_lines = [line for line in lines if line.startswith("step ")]
    assert step_lines, piped.stderr[-3000:]
    assert all(a != b for a, b in zip(lines, lines[1:], strict=False)), "a line printed twice in a row"
    assert not any(c in piped.stderr for c in SPARK)  # no screen off a terminal
