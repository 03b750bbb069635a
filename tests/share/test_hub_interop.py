"""A published repository, read back by the field's own tools where gradlab is not imported
(issue 22 items 1 and 2): the card's code with plain SB3, rl-zoo3's ``load_from_hub`` (through
huggingface_sb3's ``load_from_hub``) and ``enjoy``.

``gradlab publish --repo`` uploads to the loopback Hub stand-in (:class:`tests.hub_stand_in.HubStandIn`),
which then serves the committed files to huggingface_hub's downloads, as the Hub does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gradlab.checkpoints import list_checkpoints
from tests.share.conftest import REPO, gradlab, hf_env, serve_hub_stand_in
from tests.share.test_export import _rl_zoo_returns

pytestmark = pytest.mark.slow

OWNER, NAME = "alice", "cartpole-gradlab"
#: What rl-zoo3's push_to_hub writes (rl_zoo3/push_to_hub.py, 2.9), gradlab.ppo's zip members unpacked included.
ZOO_FILES = {"ppo-CartPole-v1.zip", "config.yml", "args.yml", "env_kwargs.yml", "vec_normalize.pkl",
             "train_eval_metrics.zip", "results.json", "README.md", "replay.mp4",
             *(f"ppo-CartPole-v1/{m}" for m in ("data", "policy.pth", "policy.optimizer.pth", "pytorch_variables.pth",
                                                "_stable_baselines3_version", "system_info.txt"))}


@pytest.fixture(scope="module")
def published(cartpole_run: Path, tmp_path_factory: pytest.TempPathFactory):
    """The default recipe's run (gradlab.ppo) published to a Hub stand-in: (endpoint, folder, index, tmp)."""
    tmp = tmp_path_factory.mktemp("hub")
    with serve_hub_stand_in() as (endpoint, _requests):
        ckpt = list_checkpoints(cartpole_run)[-1]
        out = gradlab("publish", str(ckpt), "--allow-unaccepted", "--repo", f"{OWNER}/{NAME}", "--out",
                      str(tmp / "repo"), "--json", env=hf_env(tmp, HF_TOKEN="hf_test_token", HF_ENDPOINT=endpoint))
        assert out.returncode == 0, out.stderr[-3000:]
        yield endpoint, tmp / "repo", json.loads(out.stdout), tmp


def _foreign(code: str | list[str], cwd: Path, endpoint: str, tmp: Path, timeout_s: float = 600) -> str:
    """Run Python ``code`` (or ``python -m ...`` args) with the Hub stand-in as the Hub; gradlab is never imported."""
    args = ["-c", code] if isinstance(code, str) else code
    env = {**os.environ, **hf_env(tmp, HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(tmp / "foreign-cache"),
                                  TRUST_REMOTE_CODE="True")}
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout_s)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def test_the_default_recipes_repository_ships_the_sb3_zip_with_its_tags(published) -> None:
    from huggingface_hub import ModelCard

    _endpoint, folder, index, _tmp = published
    assert index["backend_id"] == "gradlab.ppo" and index["sb3_zip"] == "ppo-CartPole-v1.zip"
    assert (folder / "ppo-CartPole-v1.zip").is_file() and index["files"]["ppo-CartPole-v1.zip"] == index["checkpoint_sha256"]
    card = ModelCard.load(folder / "README.md")
    assert card.data.library_name == "stable-baselines3"
    assert {"stable-baselines3", "reinforcement-learning", "CartPole-v1"} <= set(card.data.tags)
    files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert ZOO_FILES <= files


def test_the_cards_code_runs_as_written_with_plain_sb3(published) -> None:
    endpoint, folder, _index, tmp = published
    text = (folder / "README.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert f'hf_hub_download("{OWNER}/{NAME}", "ppo-CartPole-v1.zip")' in code
    probe = code + ("\nimport sys, gymnasium as gym\nassert not [m for m in sys.modules if m.startswith('gradlab')]\n"
                    "obs, _ = gym.make('CartPole-v1').reset(seed=0)\nprint(type(model).__name__, "
                    "int(model.predict(obs, deterministic=True)[0]), model.n_envs)\n")
    name, action, n_envs = _foreign(probe, tmp, endpoint, tmp).split()[-3:]
    assert name == "PPO" and action in ("0", "1") and n_envs == "8"


def test_rl_zoo3_loads_the_repository_from_the_hub_and_enjoy_plays_it(published) -> None:
    endpoint, _folder, _index, tmp = published
    logs = tmp / "logs"
    out = _foreign(["-m", "rl_zoo3.load_from_hub", "--algo", "ppo", "--env", "CartPole-v1", "-orga", OWNER, "-name",
                    NAME, "-f", str(logs)], tmp, endpoint, tmp)
    run = logs / "ppo" / "CartPole-v1_1"
    assert f"Saving to {run}" in out
    assert {p.name for p in (run / "CartPole-v1").iterdir()} == {"config.yml", "args.yml", "env_kwargs.yml",
                                                                  "vecnormalize.pkl"}
    assert (run / "evaluations.npz").is_file()  # from train_eval_metrics.zip
    # rl-zoo3's own loader replays the published evaluation's episodes, return for return.
    rows = json.loads((_folder / "evaluation.json").read_text())["episodes"][:10]
    theirs = _rl_zoo_returns(logs, "CartPole-v1", [row["seed"] for row in rows])
    assert theirs == pytest.approx([row["return"] for row in rows], abs=1e-6)
    played = _foreign(["-m", "rl_zoo3.enjoy", "--algo", "ppo", "--env", "CartPole-v1", "-f", str(logs), "--no-render",
                       "-n", "200"], REPO, endpoint, tmp)
    assert "CartPole-v1.zip" in played


def test_the_metrics_zip_holds_the_published_evaluation_in_eval_callbacks_form(published) -> None:
    import io
    import zipfile

    import numpy as np

    _endpoint, folder, index, _tmp = published
    with zipfile.ZipFile(folder / "train_eval_metrics.zip") as archive:
        npz = np.load(io.BytesIO(archive.read("evaluations.npz")), allow_pickle=False)
    rows = json.loads((folder / "evaluation.json").read_text())["episodes"]
    assert npz["timesteps"].tolist() == [index["step"]]
    assert npz["results"].tolist() == [[row["return"] for row in rows]]
    assert npz["ep_lengths"].tolist() == [[row["length"] for row in rows]]
    results = json.loads((folder / "results.json").read_text())
    assert results["n_eval_episodes"] == len(rows) and results["is_deterministic"] is True
