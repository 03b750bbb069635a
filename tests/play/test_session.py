"""Playback core without a browser: the session (policy + evaluation env) and its worker process."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from gradlab.errors import IntegrityError
from gradlab.play.session import PlaybackSession, returns_to_go
from gradlab.play.worker import PlaybackWorker, WorkerFailed


def _spec(run_dir: Path) -> dict:
    return json.loads((run_dir / "spec.json").read_text())


def test_returns_to_go_hand_computed() -> None:
    # G2 = 1, G1 = 1 + 0.5 * 1 = 1.5, G0 = 1 + 0.5 * 1.5 = 1.75 (terminated: no bootstrap).
    assert returns_to_go(np.array([1.0, 1.0, 1.0]), gamma=0.5).tolist() == [1.75, 1.5, 1.0]
    # Truncated with V(s_T) = 2: G2 = 1 + 0.5 * 2 = 2, G1 = 2, G0 = 2.
    assert returns_to_go(np.array([1.0, 1.0, 1.0]), gamma=0.5, bootstrap=2.0).tolist() == [2.0, 2.0, 2.0]
    assert returns_to_go(np.array([0.0, 3.0]), gamma=0.0).tolist() == [0.0, 3.0]


def test_same_seed_same_first_frames_and_episode(cartpole_checkpoint: tuple[Path, Path]) -> None:
    run_dir, ckpt = cartpole_checkpoint
    session = PlaybackSession(ckpt, _spec(run_dir), deterministic=False, seed=7)
    try:
        assert session.action_meanings == ["PUSH_LEFT", "PUSH_RIGHT"]  # as `gradlab env inspect` names them
        assert session.gamma == 0.98  # the recipe's
        runs = []
        for _ in range(2):
            first = session.reset(7)
            frames = [first.frame] + [session.step().frame for _ in range(5)]
            runs.append((frames, first.value))
        for a, b in zip(runs[0][0], runs[1][0], strict=True):
            assert np.array_equal(a, b)
        assert runs[0][1] == runs[1][1]
        assert not np.array_equal(runs[0][0][0], session.reset(8).frame)  # another seed, another start
        assert session.reset(7).frame.shape == (400, 600, 3)
    finally:
        session.close()


def test_episode_end_reports_outcome_and_return_to_go(cartpole_checkpoint: tuple[Path, Path]) -> None:
    run_dir, ckpt = cartpole_checkpoint
    session = PlaybackSession(ckpt, _spec(run_dir), deterministic=False, seed=3)
    try:
        first = session.reset(3)
        assert first.t == 0 and first.action is None and len(first.probs) == 2
        reports = []
        while True:
            r = session.step()
            reports.append(r)
            if r.episode is not None:
                break
            assert len(reports) < 600
        ep = r.episode
        assert ep["length"] == len(reports) == r.t
        assert ep["return"] == pytest.approx(sum(x.reward_shaped for x in reports)) == r.episode_return
        assert ep["raw_return"] == pytest.approx(sum(x.reward_raw for x in reports))
        assert abs(sum(reports[0].probs) - 1) < 1e-5
        assert reports[0].action in (0, 1)
        assert ep["values"][0] == pytest.approx(first.value)  # V(s_0) is what the first step acted on
        if ep["terminated"]:  # the pole fell: no bootstrap
            assert (ep["outcome"], ep["reason"], ep["bootstrap"]) == ("failure", "native_terminated", 0.0)
        rewards = np.array([x.reward_shaped for x in reports])
        assert ep["returns_to_go"] == pytest.approx(returns_to_go(rewards, gamma=0.98, bootstrap=ep["bootstrap"]).tolist())
        nxt = session.step()  # the lane already began the next episode
        assert nxt.t == 1 and nxt.episode_return == nxt.reward_shaped
    finally:
        session.close()


def test_truncated_episode_bootstraps_from_the_final_value(cartpole_checkpoint: tuple[Path, Path]) -> None:
    run_dir, ckpt = cartpole_checkpoint
    spec = _spec(run_dir)
    spec["eval_environment"]["task"]["termination"]["max_episode_steps"] = 5
    session = PlaybackSession(ckpt, spec, deterministic=True, seed=7)
    try:
        session.reset(7)
        reports = [session.step() for _ in range(5)]
        ep = reports[-1].episode
        assert ep is not None and ep["truncated"] and not ep["terminated"]
        # CartPole declares ``timeout_is: success``: the outcome is a success, the step stays a
        # truncation, so the return-to-go still bootstraps from V(final observation).
        assert (ep["outcome"], ep["reason"]) == ("success", "max_episode_steps")
        assert ep["bootstrap"] != 0.0
        g4 = 1.0 + 0.98 * ep["bootstrap"]
        assert ep["returns_to_go"][-1] == pytest.approx(g4)
        assert ep["returns_to_go"][0] == pytest.approx(sum(0.98 ** k for k in range(5)) + 0.98 ** 5 * ep["bootstrap"])
    finally:
        session.close()


def test_signals_events_and_outcomes_of_the_task_program(bandit_checkpoints: tuple[Path, list[Path]]) -> None:
    run_dir, ckpts = bandit_checkpoints
    session = PlaybackSession(ckpts[-1], _spec(run_dir), seed=0)
    try:
        session.reset(0)
        for _ in range(4):
            r = session.step()
            assert r.episode is not None and r.episode["length"] == 1
            hit = r.signals["correct"] == 1.0
            assert r.events == (["hit"] if hit else ["miss"])
            assert r.episode["outcome"] == ("success" if hit else "failure")
            assert r.episode["returns_to_go"] == [r.reward_shaped]  # gamma 0, one step
    finally:
        session.close()


def test_a_tampered_checkpoint_is_refused_naming_the_file(cartpole_checkpoint: tuple[Path, Path], tmp_path: Path) -> None:
    run_dir, ckpt = cartpole_checkpoint
    bad = tmp_path / ckpt.name
    shutil.copytree(ckpt, bad)
    weights = bad / "policy.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="policy.safetensors"):
        PlaybackSession(bad, _spec(run_dir))


def test_worker_process_loads_streams_jpeg_frames_and_reports_its_death(cartpole_checkpoint: tuple[Path, Path],
                                                                        tmp_path: Path) -> None:
    run_dir, ckpt = cartpole_checkpoint
    worker = PlaybackWorker()
    try:
        with pytest.raises(WorkerFailed, match="NotFound"):  # a session that cannot be built is one line...
            worker.load(tmp_path / "missing", _spec(run_dir))
        info = worker.load(ckpt, _spec(run_dir), seed=7)  # ...and the worker waits for another load
        assert info["action_meanings"] == ["PUSH_LEFT", "PUSH_RIGHT"] and worker.pid != os.getpid()
        (telemetry, jpeg, view), = worker.request("reset", 7)
        assert telemetry["t"] == 0 and jpeg[:2] == b"\xff\xd8"  # JPEG start-of-image
        assert view is None and len(telemetry["obs"]) == 4  # CartPole's observation: 4 numbers, no image
        steps = worker.request("step", 3)
        assert [t["t"] for t, _, _ in steps] == [1, 2, 3]
        (again, jpeg2, _), = worker.request("reset", 7)
        assert jpeg2 == jpeg and again == telemetry
        os.kill(worker.pid, signal.SIGKILL)
        with pytest.raises(WorkerFailed, match="exited"):
            worker.request("step", 1)
    finally:
        worker.close()


@pytest.fixture(scope="module")
def breakout_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from gradlab.benchmarks.play import write_untrained_run

    return write_untrained_run(tmp_path_factory.mktemp("play_atari"), "Breakout-Atari2600-v0/ppo",
                               "gradlab-20260101T000000-0000a7a2")


def test_atari_meanings_colour_screen_and_observation(breakout_checkpoint: tuple[Path, Path]) -> None:
    """Every provider's action meanings reach the panel (ALE's as env inspect knows them); the frame is
    the emulator's colour screen, kept in lockstep with the 84x84 grey observation the agent sees."""
    from PIL import Image

    from gradlab.envs import describe

    run_dir, ckpt = breakout_checkpoint
    session = PlaybackSession(ckpt, _spec(run_dir), deterministic=False, seed=3)
    try:
        assert session.action_meanings == ["NOOP", "FIRE", "RIGHT", "LEFT"]
        assert session.action_meanings == describe(session.env_spec).action_meanings
        assert session.screen == "colour screen"
        rng = np.random.default_rng(0)
        reports = [session.reset(3)]
        while len(reports) < 150:
            session.deterministic = bool(rng.integers(2))  # some variety in the actions taken
            reports.append(session.step())
        for r in reports:
            assert r.frame.shape == (210, 160, 3) and r.observation.shape == (84, 84, 3) and r.obs is None
            grey = np.asarray(Image.fromarray(r.frame).convert("L").resize((84, 84), Image.BILINEAR), dtype=float)
            assert np.abs(grey - r.observation[:, :, 0]).mean() < 4.0, r.t  # the same game, step by step
        colours = reports[-1].frame.reshape(-1, 3)
        assert (colours.max(axis=1) != colours.min(axis=1)).any()  # in colour, not grey
    finally:
        session.close()
