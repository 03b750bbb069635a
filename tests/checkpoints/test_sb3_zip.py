"""policy.zip: loadable by plain stable-baselines3 without gradlab, and the same bytes for the same weights."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from gradlab.checkpoints import file_sha256, list_checkpoints, load_policy, verify_checkpoint
from gradlab.checkpoints.sb3zip import ZIP_DATE_TIME
from gradlab.learn.learner import run_learner
from tests.learn.conftest import CARTPOLE, make_spec

CONFIGS = {
    "sb3.ppo": {"learning_rate": {"kind": "linear", "initial": 3e-3, "final": 1e-3}, "n_steps": 16,
                "batch_size": 64, "n_epochs": 2, "clip_range": {"kind": "linear", "initial": 0.2, "final": 0.1}},
    "sb3.a2c": {"learning_rate": 7e-4, "n_steps": 8},
}
CONFIGS["gradlab.ppo"] = CONFIGS["sb3.ppo"]  # the same hyperparameter surface

# Runs with gradlab made unimportable: any `import gradlab` (also inside unpickling) raises ImportError.
_PLAIN_SB3 = """
import sys
sys.modules["gradlab"] = None
import numpy as np
from stable_baselines3 import A2C, PPO
zip_path, obs_path, out_path, algo = sys.argv[1:5]
model = {"ppo": PPO, "a2c": A2C}[algo].load(zip_path, device="cpu")
actions, _ = model.predict(np.load(obs_path), deterministic=True)
np.save(out_path, np.asarray(actions))
print(type(model.lr_schedule).__module__, model.lr_schedule(0.5))
"""


def _train(tmp_path: Path, name: str, backend: str, seed: int = 3) -> Path:
    spec = make_spec(CARTPOLE, {"id": backend, "config": CONFIGS[backend]}, timesteps=256, checkpoint_freq=256,
                     seed=seed, policy_model={"net_arch": [16]})
    run_learner(spec, tmp_path / name, watch_parent=False)
    return list_checkpoints(tmp_path / name)[-1]


@pytest.mark.parametrize("backend", ["sb3.ppo", "sb3.a2c", "gradlab.ppo"])
def test_policy_zip_loads_in_plain_sb3_and_acts_like_the_weights_only_policy(backend: str, tmp_path: Path) -> None:
    ckpt = _train(tmp_path, "run", backend)
    verify_checkpoint(ckpt)
    obs = np.random.default_rng(0).uniform(-2.0, 2.0, size=(100, 4)).astype(np.float32)
    np.save(tmp_path / "obs.npy", obs)
    algo = "a2c" if backend == "sb3.a2c" else "ppo"
    proc = subprocess.run([sys.executable, "-c", _PLAIN_SB3, str(ckpt / "policy.zip"), str(tmp_path / "obs.npy"),
                           str(tmp_path / "actions.npy"), algo], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    module, lr_half = proc.stdout.split()
    assert module == "stable_baselines3.common.utils"
    if backend != "gradlab.ppo":  # gradlab.ppo's zip is a policy container: its schedules are SB3's defaults
        assert float(lr_half) == pytest.approx(2e-3 if algo == "ppo" else 7e-4)
    plain = np.load(tmp_path / "actions.npy")
    ours = load_policy(ckpt).act(obs, deterministic=True)
    assert plain.shape == (100,)
    np.testing.assert_array_equal(plain, ours)
    assert len(set(ours.tolist())) == 2  # both actions occur, so the comparison means something
    with zipfile.ZipFile(ckpt / "policy.zip") as z:
        infos = z.infolist()
        assert [i.filename for i in infos][:2] == ["data", "pytorch_variables.pth"]
        assert {i.date_time for i in infos} == {ZIP_DATE_TIME}
        data = json.loads(z.read("data"))
        assert b" at 0x" not in z.read("data")  # no memory address: the bytes are the same in any process
        system_info = z.read("system_info.txt").decode()
        assert not [i.filename for i in infos if b"gradlab" in z.read(i.filename)]
    assert data["start_time"] == 0
    pickled = [base64.b64decode(v[":serialized:"]) for v in data.values() if isinstance(v, dict) and ":serialized:" in v]
    assert pickled and not [p for p in pickled if b"gradlab" in p]
    assert "OS:" not in system_info and "GPU" not in system_info


@pytest.mark.parametrize("backend", ["sb3.ppo", "gradlab.ppo"])
def test_same_seed_runs_publish_the_same_policy_zip(backend: str, tmp_path: Path) -> None:
    a = _train(tmp_path, "a", backend)
    b = _train(tmp_path, "b", backend)
    assert file_sha256(a / "policy.zip") == file_sha256(b / "policy.zip")
    assert a.name == b.name  # <step>-<sha16>
    c = _train(tmp_path, "c", backend, seed=4)
    assert file_sha256(c / "policy.zip") != file_sha256(a / "policy.zip")
