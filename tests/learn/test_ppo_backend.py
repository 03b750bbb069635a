"""gradlab.ppo's recipe keys, precisions and the learner loop (metrics, checkpoints) on tiny envs."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gradlab.contracts.recipe import Backend
from gradlab.errors import ConfigError
from gradlab.learn.learner import run_learner
from gradlab.learn.ppo import PPOBackend
from gradlab.metrics.registry import check_names
from gradlab.outbox import Outbox
from tests.learn.conftest import BANDIT, make_spec


@pytest.mark.parametrize(("backend", "config", "key"), [
    ("gradlab.ppo", {"precision": "fp8"}, "config.precision"),
    ("gradlab.ppo", {"threads": 0}, "config.threads"),
    ("gradlab.ppo", {"threads": 1000}, "config.threads"),
    ("gradlab.ppo", {"n_stepz": 8}, "config.n_stepz"),
    ("sb3.ppo", {"precision": "bf16"}, "config.precision"),  # gradlab.ppo's own keys are not sb3.ppo's
])
def test_keys_are_validated_per_backend_and_errors_name_the_key(backend: str, config: dict, key: str) -> None:
    with pytest.raises((ValidationError, ValueError)) as info:
        Backend.model_validate({"id": backend, "config": config})
    assert key in str(info.value)


@pytest.mark.parametrize("threads", [0, 1000])
def test_a_threads_error_names_the_key_and_says_expected_vs_found(threads: int) -> None:
    from gradlab.contracts.experiments import Experiments

    with pytest.raises(ConfigError) as info:
        Experiments().resolve("CartPole-v1/ppo", ["train.backend.id=gradlab.ppo",
                                                  f"train.backend.config.threads={threads}"])
    assert str(info.value) == (f"--set: train.backend.config.threads: expected auto or an integer from 1 to 256; "
                               f"found {threads}")


def test_threads_above_the_usable_cpus_are_lowered_once(caplog: pytest.LogCaptureFixture) -> None:
    from gradlab.envs.groups import usable_cpus

    spec = make_spec(BANDIT, {"id": "gradlab.ppo", "config": {"n_steps": 8, "batch_size": 16, "threads": 256}},
                     timesteps=64, checkpoint_freq=64)
    backend = PPOBackend()
    with caplog.at_level("INFO", logger="gradlab.learn.ppo"):
        backend.setup(spec, backend.make_env(spec), device="cpu")
    try:
        assert backend.threads == min(256, usable_cpus())
        lowered = [r.getMessage() for r in caplog.records if "usable CPUs" in r.getMessage()]
        assert lowered == [f"train.backend.config.threads: 256 asked for, {usable_cpus()} usable CPUs: "
                           f"using {usable_cpus()}"]
    finally:
        backend.close()


def test_defaults_are_sb3_ppos_plus_how_to_compute() -> None:
    ours = Backend.model_validate({"id": "gradlab.ppo", "config": {}}).config
    theirs = Backend.model_validate({"id": "sb3.ppo", "config": {}}).config
    assert {k: v for k, v in ours.items() if k not in ("precision", "compile", "threads")} == theirs
    assert (ours["precision"], ours["compile"], ours["threads"]) == ("fp32", False, "auto")


def test_unsupported_settings_are_refused_naming_the_key() -> None:
    backend = PPOBackend()
    spec = make_spec(BANDIT, {"id": "gradlab.ppo", "config": {"n_steps": 8, "batch_size": 16, "precision": "fp16-amp"}},
                     timesteps=64, checkpoint_freq=64)
    with pytest.raises(ConfigError, match=r"^train.backend.config.precision: fp16-amp needs device cuda"):
        PPOBackend().setup(spec, backend.make_env(spec), device="cpu")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_bandit_learns_in_each_cpu_precision(precision: str, tmp_path: Path) -> None:
    config = {"learning_rate": 3e-3, "n_steps": 64, "batch_size": 128, "n_epochs": 4, "gamma": 0.0,
              "precision": precision, "threads": 1}
    spec = make_spec(BANDIT, {"id": "gradlab.ppo", "config": config}, timesteps=8192, checkpoint_freq=4096,
                     policy_model={"net_arch": [32]})
    result = run_learner(spec, tmp_path / "run", watch_parent=False)
    assert (result.final_step, result.stop_reason) == (8192, "budget")
    events = Outbox(tmp_path / "run" / "outbox.sqlite").read(limit=10_000)
    metrics = [e.payload["metrics"] for e in events if e.kind == "metrics" and "train/throughput/loop_fps" in e.payload["metrics"]]
    check_names({n for m in metrics for n in m})
    last = metrics[-1]
    assert last["train/outcome/success/window_100/rate"] >= 0.9
    assert last["train/algorithm/ppo/update/epochs"] == 4.0
    assert last["train/algorithm/ppo/update/count"] == 4.0 * len(metrics)
    assert [e.payload["step"] for e in events if e.kind == "checkpoint_ready"] == [4096, 8192]


def _breakout_bf16(*, n_steps: int, n_epochs: int, threads: int, seed: int) -> PPOBackend:
    """A set-up gradlab.ppo backend for Breakout's ppo recipe in bf16 on the CPU: 2 lanes, minibatches of 8."""
    from gradlab.contracts.experiments import Experiments
    from gradlab.contracts.run_spec import RunSpec

    overrides = ["train.environment.n_envs=2", f"train.backend.config.n_steps={n_steps}",
                 "train.backend.config.batch_size=8", f"train.backend.config.n_epochs={n_epochs}",
                 "train.backend.config.precision=bf16", f"train.backend.config.threads={threads}", "train.device=cpu"]
    spec = RunSpec.from_resolved(Experiments().resolve("Breakout-Atari2600-v0/ppo", overrides), seed=seed)
    backend = PPOBackend()
    backend.setup(spec, backend.make_env(spec))
    return backend


def test_breakout_rollout_on_one_thread_and_a_bf16_copy() -> None:
    """On CPU the rollout runs on ``rollout_threads`` (1 for 2 lanes) and, in bf16, on a bf16 copy of
    the network refreshed from the fp32 parameters; the update runs on the recipe's threads again."""
    import torch

    backend = _breakout_bf16(n_steps=8, n_epochs=1, threads=2, seed=1)
    seen: list[int] = []
    assert len(backend.venv.groups) == 2  # ale-py lanes: the pipelined rollout of two lane groups
    for group in backend.venv.groups:
        group.step_wait = lambda wait=group.step_wait: (seen.append(torch.get_num_threads()), wait())[1]
    try:
        backend.begin(resumed=False)
        assert backend.rollout_threads == 1 and backend.threads == 2
        for _ in range(2):  # the second rollout's copy is refreshed from the updated parameters
            backend.collect()
            assert set(seen) == {1} and torch.get_num_threads() == 2
            copy = dict(backend._rollout_net.named_parameters())
            for name, p in backend.net.named_parameters():
                assert copy[name].dtype == torch.bfloat16 and torch.equal(copy[name], p.detach().to(torch.bfloat16)), name
            # The rollout's values (bf16 copy) are the fp32 network's within bf16's rounding.
            with torch.no_grad():
                _, values = backend.net(backend.buf_obs.flatten(0, 1))
            assert torch.allclose(backend.buf_values.flatten(), values, rtol=0.05, atol=0.02)
            assert backend.buf_obs.flatten(0, 1).is_contiguous(memory_format=torch.channels_last)
            backend.update()
    finally:
        backend.close()


def test_a_bf16_update_from_frames_cast_once_equals_one_that_casts_each_minibatch(monkeypatch) -> None:
    """bf16 on a CPU: the rollout's uint8 frames are cast to bf16 once per update (exact), unless the
    copy would exceed ``PRECAST_BYTES``; both give the same parameters, bit for bit."""
    import copy

    import numpy as np
    import torch

    from gradlab.learn import ppo

    backend = _breakout_bf16(n_steps=16, n_epochs=2, threads=1, seed=3)
    try:
        backend.begin(resumed=False)
        backend.collect()
        net, opt, rng = copy.deepcopy(backend.net.state_dict()), copy.deepcopy(backend.optimizer.state_dict()), \
            np.random.get_state()
        casts: list[torch.dtype] = []
        preprocess = backend.net.preprocess
        monkeypatch.setattr(backend.net, "preprocess", lambda obs: (casts.append(obs.dtype), preprocess(obs))[1])
        backend.update()
        once = {k: v.clone() for k, v in backend.net.state_dict().items()}
        assert set(casts) == {torch.bfloat16}  # the minibatches arrive as bf16 frames
        backend.net.load_state_dict(net)
        backend.optimizer.load_state_dict(opt)
        np.random.set_state(rng)  # the minibatch order (drawn as SB3 draws it)
        casts.clear()
        monkeypatch.setattr(ppo, "PRECAST_BYTES", 0)
        backend.update()
        assert set(casts) == {torch.uint8}
        each = backend.net.state_dict()
        assert all(torch.equal(once[k], each[k]) for k in once), [k for k in once if not torch.equal(once[k], each[k])]
        assert any(not torch.equal(once[k], net[k]) for k in once)  # the update changed something
    finally:
        backend.close()
