"""Every CLI error line starts with ``error:``: plain failures and each problem of a bad ``--set``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def gradlab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradlab.cli.app", *args], capture_output=True, text=True,
                          cwd=REPO, env=dict(os.environ), timeout=120)


def test_set_problems_carry_the_error_prefix_one_line_each() -> None:
    out = gradlab("recipe", "show", "CartPole-v1/ppo", "--set", "train.timestepz=5", "--set", "foo")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines() == [
        "error: --set: foo: expected KEY=VALUE with a dotted key, found 'foo'",
        "error: --set: train.timestepz: unknown key (did you mean timesteps?)",
    ]


def test_plain_failure_has_the_same_prefix() -> None:
    out = gradlab("recipe", "show", "CartPole-v2/ppo")
    assert out.returncode == 1
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "did you mean CartPole-v1" in lines[0]
