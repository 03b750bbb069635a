"""Both PPO backends' ``policy.zip`` of one recipe record the recipe: SB3 that loads either and
calls ``.learn()`` continues with the recipe's schedules, lane count and budget (issue 22 item 4)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gradlab.checkpoints import list_checkpoints
from tests.share.conftest import train_run

pytestmark = pytest.mark.slow

OVERRIDES = ("train.timesteps=512", "train.checkpoint_freq=512")
#: The lanes' state at the checkpoint (the last observations and episode starts), not the recipe:
#: sb3.ppo holds its env's arrays, gradlab.ppo None (SB3 then resets the env it is given).
LANE_STATE = {"_last_obs", "_last_episode_starts"}


@pytest.fixture(scope="module")
def zips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("zip_runs")
    out = {}
    for i, ref in enumerate(("CartPole-v1/ppo", "CartPole-v1/ppo-sb3")):
        run = train_run(root, ref, run_id=f"gradlab-20260101T000000-00d0d0d{i}", overrides=OVERRIDES)
        out[ref.split("/")[1]] = list_checkpoints(run)[-1] / "policy.zip"
    return out


def _data(path: Path) -> dict:
    """The zip's ``data`` entry as JSON: SB3's readable forms and base64 pickles, nothing unpickled."""
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("data"))


def test_gradlab_ppo_and_sb3_ppo_zips_of_one_recipe_agree_field_by_field(zips: dict[str, Path]) -> None:
    ours, theirs = _data(zips["ppo"]), _data(zips["ppo-sb3"])
    assert set(ours) == set(theirs)
    differ = sorted(k for k in ours if k not in LANE_STATE and ours[k] != theirs[k])
    assert differ == [], {k: (ours[k], theirs[k]) for k in differ}
    # The recipe (CartPole-v1/ppo: lin_0.001, clip lin_0.2, 8 lanes), in SB3's readable forms.
    assert ours["n_envs"] == 8 and ours["_total_timesteps"] == 512 and ours["num_timesteps"] == 512
    assert ours["_current_progress_remaining"] == 0.0
    for key, start in (("lr_schedule", 0.001), ("clip_range", 0.2)):
        assert ours[key][":type:"] == "<class 'stable_baselines3.common.utils.FloatSchedule'>"
        assert ours[key]["value_schedule"].startswith(f"LinearSchedule(start={start}, end=0.0"), ours[key]
    assert ours["policy_kwargs"]["ortho_init"] is True


_CONTINUE = """
import json, sys
from stable_baselines3 import PPO
model = PPO.load(sys.argv[1], device="cpu")
assert not [m for m in sys.modules if m.startswith("gradlab")]
print(json.dumps({"n_envs": model.n_envs, "lr": [model.lr_schedule(p) for p in (1.0, 0.5, 0.0)],
                  "clip": [model.clip_range(p) for p in (1.0, 0.5, 0.0)], "n_steps": model.n_steps,
                  "batch_size": model.batch_size, "n_epochs": model.n_epochs, "gamma": model.gamma,
                  "gae_lambda": model.gae_lambda, "total": model._total_timesteps}))
"""


def test_plain_sb3_loads_the_gradlab_ppo_zip_with_the_recipes_schedules(zips: dict[str, Path], tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-I", "-c", _CONTINUE, str(zips["ppo"])], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded["lr"] == pytest.approx([1e-3, 5e-4, 0.0]) and loaded["clip"] == pytest.approx([0.2, 0.1, 0.0])
    assert (loaded["n_envs"], loaded["n_steps"], loaded["batch_size"], loaded["n_epochs"], loaded["total"]) == (8, 32, 256,
                                                                                                             20, 512)
    assert (loaded["gamma"], loaded["gae_lambda"]) == (0.98, 0.8)
