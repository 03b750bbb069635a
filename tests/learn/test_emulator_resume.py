"""Emulator lanes resume mid-episode: their lane state is the provider's snapshot of each lane.

gradlab.ppo on Breakout with ALE lanes that capture their state (``provider_args.single_lanes``:
``cloneState`` with the sticky-action RNG, the frame stack and the no-op RNG), stopped after its
first checkpoint and resumed in a fresh process, ends as the uninterrupted run does: the same
weights, optimizer, lanes and episode statistics. stable-retro's subprocess lanes round-trip the
same way; ale-py's native vector env, which cannot capture a lane, still resets its lanes (and
says why).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from gradlab.checkpoints import list_checkpoints, verify_checkpoint
from gradlab.contracts.experiments import Experiments
from gradlab.contracts.run_spec import RunSpec
from gradlab.envs.vector import make_vector_env
from gradlab.errors import ContractViolation
from gradlab.learn import lane_state
from gradlab.learn.learner import run_learner
from tests.learn.conftest import write_spec
from tests.learn.test_ppo_resume import _update_metrics

SINGLE_LANES = ["train.environment.provider_args.single_lanes=true", "train.environment.vectorization=sync",
                "train.environment.n_envs=2"]


def _breakout(timesteps: int, checkpoint_freq: int) -> RunSpec:
    resolved = Experiments().resolve("Breakout-Atari2600-v0/ppo", [
        *SINGLE_LANES, f"train.timesteps={timesteps}", f"train.checkpoint_freq={checkpoint_freq}",
        "train.backend.config.n_steps=16", "train.backend.config.batch_size=16", "train.backend.config.n_epochs=1"])
    return RunSpec.from_resolved(resolved, seed=3, run_id="gradlab-20250101T000000-0000a1e5")


@pytest.mark.slow
def test_breakout_on_capturing_lanes_resumed_in_a_new_process_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    spec = _breakout(timesteps=128, checkpoint_freq=64)
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    run_learner(spec, straight, watch_parent=False)
    run_learner(spec, broken, stop_at_step=64, watch_parent=False)  # the process that dies after checkpoint 1
    middle = list_checkpoints(broken)[-1]
    assert verify_checkpoint(middle).step == 64
    assert json.loads((middle / "resume" / "state.json").read_text())["env_state"] == "lanes"
    tree = json.loads((middle / "resume" / "lanes.json").read_text())
    assert tree["format"] == "gradlab.lanes/2" and '"t": "provider"' in json.dumps(tree)  # the emulators' snapshots
    resumed = subprocess.run([sys.executable, "-m", "gradlab.learn", "--spec", str(write_spec(spec, tmp_path / "spec.json")),
                              "--run-dir", str(broken), "--log-level", "WARNING", "--resume-from", str(middle)],
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    final_a, final_b = list_checkpoints(straight)[-1], list_checkpoints(broken)[-1]
    assert verify_checkpoint(final_a).step == verify_checkpoint(final_b).step == 128
    for name in ("policy.safetensors", "resume/optimizer.safetensors"):
        wa, wb = load_file(str(final_a / name)), load_file(str(final_b / name))
        assert sorted(wa) == sorted(wb) and all((wa[k] == wb[k]).all() for k in wa), name
    assert (np.load(final_a / "resume" / "last_obs.npy") == np.load(final_b / "resume" / "last_obs.npy")).all()
    la, lb = np.load(final_a / "resume" / "lanes.npz"), np.load(final_b / "resume" / "lanes.npz")
    assert sorted(la) == sorted(lb) and all((la[k] == lb[k]).all() for k in la)  # the same emulator states
    sa = json.loads((final_a / "resume" / "state.json").read_text())
    sb = json.loads((final_b / "resume" / "state.json").read_text())
    for key in ("num_timesteps", "n_updates", "episodes", "rng"):
        assert sa[key] == sb[key], key
    ma, mb = _update_metrics(straight), _update_metrics(broken)
    assert [s for s in ma if s > 64] == [s for s in mb if s > 64] != []
    for step in (s for s in ma if s > 64):
        for name in ("train/algorithm/ppo/update/value_loss", "train/algorithm/ppo/update/approx_kl"):
            assert ma[step].get(name) == mb[step].get(name), (step, name)


@pytest.mark.parametrize(("ref", "overrides"), [
    ("Breakout-Atari2600-v0/ppo", SINGLE_LANES),
    ("Airstriker-Genesis-v0/jerk", ["train.environment.n_envs=2"]),  # stable-retro, lanes in subprocesses
])
def test_a_restored_emulator_env_steps_as_the_saved_one_would_have(ref: str, overrides: list[str], tmp_path: Path) -> None:
    spec = RunSpec.from_resolved(Experiments().resolve(ref, overrides), seed=0)
    rng = np.random.default_rng(0)
    with make_vector_env(spec.environment, seed=0) as saved:
        n = saved.single_action_space.n
        saved.reset()
        for _ in range(30):
            saved.step(rng.integers(n, size=saved.num_envs))
        assert lane_state.save(tmp_path, saved)
        actions = [rng.integers(n, size=saved.num_envs) for _ in range(40)]
        expected = [saved.step(a) for a in actions]
        steps = saved.task.steps.copy()
    with make_vector_env(spec.environment, seed=0) as fresh:
        lane_state.restore(tmp_path, fresh)
        got = [fresh.step(a) for a in actions]
        assert (fresh.task.steps == steps).all() and (steps > 40).all()  # the episodes went on, none restarted
    for a, b in zip(expected, got, strict=True):
        assert (a.obs == b.obs).all() and (a.reward == b.reward).all() and (a.terminated == b.terminated).all()


def test_a_lane_snapshot_of_another_game_is_refused_naming_the_lane(tmp_path: Path) -> None:
    breakout = RunSpec.from_resolved(Experiments().resolve("Breakout-Atari2600-v0/ppo", SINGLE_LANES), seed=0)
    montezuma = RunSpec.from_resolved(Experiments().resolve("MontezumaRevenge-Atari2600-v0/go-explore",
                                                       ["train.environment.n_envs=2"]), seed=0)
    with make_vector_env(breakout.environment, seed=0) as env:
        env.reset()
        assert lane_state.save(tmp_path, env)
    with make_vector_env(montezuma.environment, seed=0) as other, pytest.raises(
            ContractViolation, match=r"lanes\.json: env\.backend\[0\]: not a snapshot of this lane: .*ale:breakout"):
        lane_state.restore(tmp_path, other)


def test_the_native_atari_vector_env_still_says_why_it_resets(tmp_path: Path) -> None:
    spec = RunSpec.from_resolved(Experiments().resolve("Breakout-Atari2600-v0/ppo", ["train.environment.n_envs=2"]), seed=0)
    with make_vector_env(spec.environment, seed=0) as env:
        env.reset()
        assert lane_state.save(tmp_path, env) is False
        assert "AtariVectorEnv is not plain data" in lane_state.unsupported_reason(env)
