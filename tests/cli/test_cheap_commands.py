"""The everyday read-only commands never import the training stack: each runs in a fresh
interpreter and the modules it imported are read from ``sys.modules`` at exit. (How fast they
answer is ``gradlab benchmark commands``'s table, not a test.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradlab.benchmarks.commands import HEAVY_MODULES, PROBE

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def home_with_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    return synthesized_home(tmp_path_factory)


def synthesized_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A GRADLAB_HOME with 4 synthetic sealed runs (``gradlab.benchmarks.reports.synthesize``) and their ids."""
    from gradlab.benchmarks.reports import synthesize

    home = tmp_path_factory.mktemp("cheap_home")
    old = os.environ.get("GRADLAB_HOME")
    try:
        ids = synthesize(home, runs=4, rollouts=5)
    finally:
        if old is None:
            os.environ.pop("GRADLAB_HOME", None)
        else:
            os.environ["GRADLAB_HOME"] = old
    return home, ids


def imported_by(args: list[str], home: Path, **extra: str) -> tuple[int, set[str], str]:
    env = {**os.environ, "GRADLAB_HOME": str(home), "GRADLAB_DAEMON": "0", **extra}
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=REPO, env=env,
                         timeout=300)
    line = next(line for line in out.stderr.splitlines() if line.startswith("GRADLAB_IMPORTED "))
    return out.returncode, set(json.loads(line.split(" ", 1)[1])), out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", ["runs list", "runs show RUN", "leaders runs --goal gradlab__bandit",
                                     "leaders checkpoints --goal gradlab__bandit", "goals list",
                                     "recipe show CartPole-v1/ppo"])
def test_cheap_commands_import_no_training_stack(command: str, home_with_runs) -> None:
    home, ids = home_with_runs
    code, modules, stderr = imported_by(command.replace("RUN", ids[0]).split(), home)
    assert code == 0, stderr[-2000:]
    assert not modules & set(HEAVY_MODULES), sorted(modules & set(HEAVY_MODULES))
