"""`gradlab eval` as a user runs it: a real subprocess over a real run directory under GRADLAB_HOME."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.evaluation.conftest import RUN_ID

REPO = Path(__file__).resolve().parents[2]


def gradlab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradlab.cli.app", *args], capture_output=True, text=True,
                          cwd=REPO, env=dict(os.environ), timeout=300)


@pytest.fixture
def home_run(bandit_run, gradlab_home: Path) -> Path:
    run_dir, _ = bandit_run
    dst = gradlab_home / "runs" / RUN_ID
    shutil.copytree(run_dir, dst)
    return dst


@pytest.mark.slow
def test_eval_run_id_default_and_step(home_run):
    out = gradlab("eval", RUN_ID, "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result) >= {"checkpoint_sha256", "hashes", "episodes", "aggregates", "verdict", "planned", "completed"}
    assert set(result["episodes"][0]) >= {"index", "lane", "seed", "start", "return", "raw_return", "length",
                                          "outcome", "reason"}
    assert result["checkpoint_step"] == 1024 and result["verdict"] == "accepted"  # newest
    assert (result["planned"], result["completed"]) == (100, 100)
    assert result["aggregates"]["eval/outcome/success/rate"] == 1.0

    out = gradlab("eval", f"{RUN_ID}:64", "--json", "--episodes", "8", "--stochastic")
    result = json.loads(out.stdout)
    assert result["checkpoint_step"] == 64 and result["planned"] == 8 and result["policy"] == "stochastic"
    # Promotion comes from the receipt stores, not a file in the run directory (test_eval_stores.py).


@pytest.mark.slow
def test_eval_directory_table_and_errors(home_run):
    ckpt = sorted((home_run / "checkpoints").iterdir())[0]
    out = gradlab("eval", str(ckpt))
    assert out.returncode == 0, out.stderr
    assert "rejected" in out.stdout and "success rate" in out.stdout and "95% CI" in out.stdout
    assert "eval/outcome/success/rate" in out.stdout and ">= 0.95: fail" in out.stdout

    out = gradlab("eval", "gradlab-nope")
    assert out.returncode == 1 and "neither a checkpoint directory nor a run" in out.stderr
    out = gradlab("eval", f"{RUN_ID}:999")
    assert out.returncode == 1 and "no checkpoint at step 999 (steps: 64, 1024)" in out.stderr
