"""The built wheel works from outside the checkout, with the bundled experiments."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `uv build` makes of this checkout (built once for the module)."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is required to build and install the wheel (pip install uv)")
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([uv, "build", "--wheel", "--out-dir", str(dist)], cwd=REPO, check=True, capture_output=True, timeout=300)
    return next(dist.glob("gradlab-*.whl"))


@pytest.mark.slow
def test_wheel_installs_and_validates_outside_the_checkout(tmp_path: Path, wheel: Path) -> None:
    uv = shutil.which("uv")
    requirements = tmp_path / "requirements.txt"
    # The box2d extra: `validate` checks that every checked-in goal can run here, LunarLander-v3 included.
    exported = subprocess.run([uv, "export", "--frozen", "--no-hashes", "--no-dev", "--extra", "box2d",
                               "--no-emit-project"], cwd=REPO,
                              check=True, capture_output=True, text=True, timeout=120)
    requirements.write_text(exported.stdout)
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "--quiet", str(venv)], check=True, capture_output=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([uv, "pip", "install", "--quiet", "--python", str(python), "-r", str(requirements), str(wheel)],
                   check=True, capture_output=True, timeout=600)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("GRADLAB_EXPERIMENTS", "VIRTUAL_ENV", "PYTHONPATH")}
    gradlab = str(venv / "bin" / "gradlab")
    validate = subprocess.run([gradlab, "validate", "--json"], cwd=outside, env=env, capture_output=True, text=True, timeout=120)
    assert validate.returncode == 0, validate.stderr
    checked_in = [p for p in (REPO / "experiments" / "goals").rglob("_goal.yaml")]
    assert json.loads(validate.stdout)["goals"] == len(checked_in)
    goals = subprocess.run([gradlab, "goals", "list", "--json"], cwd=outside, env=env, capture_output=True, text=True, timeout=120)
    assert goals.returncode == 0, goals.stderr
    assert "CartPole-v1" in {row["goal_id"] for row in json.loads(goals.stdout)}
    where = subprocess.run([str(python), "-c", "import gradlab, flows, tasks; print(gradlab.__file__)"], cwd=outside, env=env,
                           capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    assert str(venv) in where.stdout  # the installed copy, not the checkout


@pytest.mark.slow
def test_uv_tool_run_of_the_wheel_trains_the_bandit_from_an_empty_folder(tmp_path: Path, wheel: Path) -> None:
    """What README "Installing and extras" promises: no clone, no lock, an empty folder."""
    uv = shutil.which("uv")
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("GRADLAB_EXPERIMENTS", "VIRTUAL_ENV", "PYTHONPATH", "PREFECT_API_URL")}
    env |= {"GRADLAB_HOME": str(tmp_path / "home"), "UV_TOOL_DIR": str(tmp_path / "tools"),
            "GRADLAB_DAEMON": "0", "PREFECT_HOME": str(tmp_path / "prefect"), "WANDB_MODE": "offline"}
    train = subprocess.run([uv, "tool", "run", "--from", str(wheel), "gradlab", "train", "gradlab__bandit/ppo"],
                           cwd=empty, env=env, capture_output=True, text=True, timeout=1200)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert "succeeded" in train.stdout + train.stderr
    assert list(empty.iterdir()) == []  # everything it wrote went under GRADLAB_HOME
    receipts = list((tmp_path / "home").rglob("terminal.json"))
    assert receipts and all(json.loads(r.read_text())["outcome"] == "succeeded" for r in receipts)
