"""Resume reads no pickle: forged resume files never execute, even when their manifest agrees."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest

from gradlab.checkpoints import file_sha256, list_checkpoints
from gradlab.errors import ContractViolation
from gradlab.learn.learner import run_learner
from tests.learn.conftest import BANDIT, make_spec

CFG = {"n_steps": 32, "batch_size": 64, "n_epochs": 1, "gamma": 0.0}
REPO = Path(__file__).resolve().parents[2]


class _Forged:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def _spec():
    return make_spec(BANDIT, {"id": "sb3.ppo", "config": CFG}, timesteps=1024, checkpoint_freq=512)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("run")
    run_learner(_spec(), run_dir, stop_at_step=512, watch_parent=False)
    return list_checkpoints(run_dir)[-1]


def _forge(src: Path, dest: Path, files: dict[str, bytes]) -> Path:
    """A copy of ``src`` with ``files`` replaced and its manifest rewritten to agree (self-consistent)."""
    shutil.copytree(src, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    for name, data in files.items():
        (dest / name).write_bytes(data)
        manifest["files"][name] = {"sha256": file_sha256(dest / name), "size_bytes": len(data)}
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


def test_an_old_style_env_pickle_is_never_read(checkpoint: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    state = json.loads((checkpoint / "resume" / "state.json").read_text())
    state["env_state"] = "saved"  # what checkpoints with resume/env_state.pkl said
    forged = _forge(checkpoint, tmp_path / "ckpt" / checkpoint.name, {
        "resume/env_state.pkl": pickle.dumps(_Forged(marker)), "resume/state.json": json.dumps(state).encode()})
    result = run_learner(_spec(), tmp_path / "b", resume_from=forged, watch_parent=False)
    assert (result.final_step, result.stop_reason) == (1024, "budget")
    assert not marker.exists()


def test_a_pickle_as_optimizer_state_is_refused_by_the_weights_only_loader(checkpoint: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    forged = _forge(checkpoint, tmp_path / "ckpt" / checkpoint.name,
                    {"resume/optimizer.pt": pickle.dumps(_Forged(marker))})
    with pytest.raises(pickle.UnpicklingError):
        run_learner(_spec(), tmp_path / "b", resume_from=forged, watch_parent=False)
    assert not marker.exists()


@pytest.mark.parametrize(("node", "found"), [
    ({"t": "pickle", "v": "gASV"}, "expected a data node, found 'pickle'"),
    ({"t": "generator", "state": {"t": "dict", "items": [[{"t": "json", "v": "bit_generator"},
                                                          {"t": "json", "v": "os.system"}]]}},
     "expected a bit generator of PCG64"),
    ({"t": "obj", "attrs": {}}, "expected an attribute of the freshly built env, found none"),
])
def test_forged_lane_state_is_refused_naming_the_file(checkpoint: Path, tmp_path: Path, node: dict,
                                                      found: str) -> None:
    body = json.loads((checkpoint / "resume" / "lanes.json").read_text())
    body["tree"]["attrs"]["injected"] = node
    forged = _forge(checkpoint, tmp_path / "ckpt" / checkpoint.name, {"resume/lanes.json": json.dumps(body).encode()})
    with pytest.raises(ContractViolation, match=re.escape(f"{forged / 'resume' / 'lanes.json'}: env.injected: {found}")):
        run_learner(_spec(), tmp_path / "b", resume_from=forged, watch_parent=False)


def test_no_gradlab_module_unpickles_but_the_trusted_sb3_loader() -> None:
    """The only pickle left is a foreign SB3 zip the user trusts (checkpoints/trust.py)."""
    pattern = re.compile(r"pickle\.loads?\(|cloudpickle\.loads?\(|torch\.load\((?![^)]*weights_only=True)|allow_pickle=True|"
                         r"\b(PPO|A2C|cls)\.load\(")
    offenders = []
    for path in sorted((REPO / "gradlab").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) and path.relative_to(REPO).as_posix() != "gradlab/checkpoints/trust.py":
                offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert offenders == []


def test_lane_state_round_trips_mid_episode_without_pickle(tmp_path: Path) -> None:
    """CartPole lanes saved mid-episode continue exactly in a freshly built env (same spec)."""
    import threading

    import numpy as np

    from gradlab.contracts.environment import EnvironmentSpec
    from gradlab.envs import make_vector_env
    from gradlab.envs.sb3 import SB3VecEnv
    from gradlab.learn import lane_state
    from tests.learn.conftest import CARTPOLE

    spec = EnvironmentSpec.model_validate(CARTPOLE)
    a, b = SB3VecEnv(make_vector_env(spec, seed=1)), SB3VecEnv(make_vector_env(spec, seed=1))
    a.reset()
    rng = np.random.default_rng(0)
    for _ in range(15):
        a.step_async(rng.integers(0, 2, 8))
        a.step_wait()
    a.pop_episodes()
    assert lane_state.save(tmp_path, a)
    lane_state.restore(tmp_path, b)
    for _ in range(60):
        actions = rng.integers(0, 2, 8)
        a.step_async(actions)
        b.step_async(actions)
        (oa, ra, da, _), (ob, rb, db, _) = a.step_wait(), b.step_wait()
        assert (oa == ob).all() and (ra == rb).all() and (da == db).all()
    # Inside a lane backend, state that is not plain data (an emulator handle) is saved as the
    # lanes' provider snapshots; elsewhere it makes the env unsupported: lanes reset.
    a.venv.backend.envs[0].unwrapped.handle = threading.Lock()
    saved = lane_state.capture(a)
    assert saved is not None and saved[0]["tree"]["attrs"]["venv"]["attrs"]["backend"]["t"] == "provider"
    a.venv.handle = threading.Lock()
    assert lane_state.capture(a) is None
    assert "env.venv.handle: _thread.lock is not plain data" in lane_state.unsupported_reason(a)
