"""Named start states: ``VectorEnv.set_next_start`` on Corridor-v0 (sync and async lanes) and stable-retro."""

from __future__ import annotations

import numpy as np
import pytest

from gradlab.contracts.environment import EnvironmentSpec
from gradlab.envs import make_vector_env
from gradlab.errors import ContractViolation


def _corridor(n_envs=2, vectorization="sync", **provider_args) -> EnvironmentSpec:
    args = {"length": 5, "end": "truncate", "starts": {"short": 2, "long": 7}, **provider_args}
    return EnvironmentSpec.model_validate({"provider": "gradlab", "env_id": "Corridor-v0", "n_envs": n_envs,
                                           "vectorization": vectorization, "provider_args": args})


def _episodes(venv, steps):
    out = []
    for t in range(1, steps + 1):
        res = venv.step(np.zeros(venv.num_envs, dtype=np.int64))
        out += [(t, ep.lane, ep.length, ep.start, res.infos[ep.lane]["gradlab_episode"].get("start"))
                for ep in res.episodes]
    return out


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_corridor_starts_set_each_lanes_next_episode_length(vectorization):
    with make_vector_env(_corridor(vectorization=vectorization), seed=0) as venv:
        assert venv.starts == ("short", "long")
        venv.set_next_start(0, "short")
        venv.set_next_start(1, "long")
        venv.reset()
        venv.set_next_start(0, "long")  # lane 0's second episode
        eps = _episodes(venv, 10)
    # Lane 0: short (2 steps), then long (7 steps, ends at t=9); lane 1: long (ends at t=7), then
    # the default length 5 (one-shot starts), unfinished at t=10.
    assert eps == [(2, 0, 2, "short", "short"), (7, 1, 7, "long", "long"), (9, 0, 7, "long", "long")]


def test_default_start_episodes_have_no_start_key():
    with make_vector_env(_corridor(n_envs=1), seed=0) as venv:
        venv.reset()
        res = None
        for _ in range(5):
            res = venv.step(np.zeros(1, dtype=np.int64))
    assert res.episodes[0].start is None and res.episodes[0].length == 5
    assert "start" not in res.infos[0]["gradlab_episode"]


def test_set_next_start_none_clears_a_pending_start():
    with make_vector_env(_corridor(n_envs=1), seed=0) as venv:
        venv.set_next_start(0, "long")
        venv.set_next_start(0, None)
        venv.reset()
        eps = _episodes(venv, 5)
    assert eps == [(5, 0, 5, None, None)]


def test_unknown_start_and_bad_lane_are_refused():
    with make_vector_env(_corridor(), seed=0) as venv:
        with pytest.raises(ContractViolation, match=r"gradlab:Corridor-v0: start: expected one of \['short', 'long'\], "
                                                    r"found 'middle'"):
            venv.set_next_start(0, "middle")
        with pytest.raises(ContractViolation, match="lane: expected 0..1, found 2"):
            venv.set_next_start(2, "short")


@pytest.mark.parametrize(("spec", "where"), [
    ({"provider": "gymnasium", "env_id": "CartPole-v1"}, "gymnasium:CartPole-v1"),
    ({"provider": "gradlab", "env_id": "Corridor-v0"}, "gradlab:Corridor-v0"),  # no provider_args.starts
    ({"provider": "gradlab", "env_id": "Bandit-v0"}, "gradlab:Bandit-v0"),
])
def test_providers_without_starts_name_provider_and_env(spec, where):
    with make_vector_env(EnvironmentSpec.model_validate(spec), seed=0) as venv:
        assert venv.starts is None
        with pytest.raises(ContractViolation, match=f"{where} has no start states, found start 'level2'"):
            venv.set_next_start(0, "level2")


def test_ale_has_no_starts():
    spec = EnvironmentSpec.model_validate({"provider": "ale", "env_id": "Breakout", "n_envs": 1})
    with make_vector_env(spec, seed=0) as venv:
        with pytest.raises(ContractViolation, match="ale:Breakout has no start states"):
            venv.set_next_start(0, "level2")


def _save_state_after(game: str, frames: int, folder) -> np.ndarray:
    """Play ``frames`` emulator frames of ``game`` from its default state (holding one button), save
    the emulator state as ``<folder>/<game>/After<frames>.state`` (gzip, as stable-retro's own save
    states), and return the raw screen a reset from it shows (stable-retro's reset: load the state,
    one frame with no button pressed)."""
    import gzip

    import stable_retro as retro

    env = retro.make(game, render_mode=None)
    try:
        em = env.unwrapped.em
        env.reset(seed=0)
        press = np.zeros(env.unwrapped.num_buttons, dtype=np.uint8)
        press[env.unwrapped.buttons.index("RIGHT")] = 1
        for _ in range(frames):
            em.set_button_mask(press, 0)
            em.step()
        state = em.get_state()
        em.set_state(state)
        em.set_button_mask(np.zeros_like(press), 0)
        em.step()
        screen = em.get_screen().copy()
    finally:
        env.close()
    (folder / game).mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / game / f"After{frames}.state", "wb") as f:
        f.write(state)
    return screen


def test_retro_start_from_a_save_state_taken_after_n_steps(gradlab_home):
    """A named start really starts elsewhere: a save state taken 120 frames into the game (not the
    game's own Level1, which is its default) gives the screen of that moment, the default start
    does not, and the next unnamed reset returns to the default."""
    game = "Airstriker-Genesis-v0"
    screen = _save_state_after(game, 120, gradlab_home / "roms" / "retro")  # the ROM cache is an integration path
    spec = EnvironmentSpec.model_validate({
        "provider": "retro", "env_id": game, "n_envs": 1, "vectorization": "sync",
        "preprocessing": {"grayscale": False, "resize": None, "frame_stack": 1},
        "task": {"termination": {"max_episode_steps": 2}}})
    with make_vector_env(spec, seed=0) as venv:
        assert venv.starts == ("After120", "Level1")
        default_obs = venv.reset()
        venv.set_next_start(0, "After120")
        eps = _episodes(venv, 4)  # the reset at step 2 loads After120; the one at step 4 the default again
        venv.set_next_start(0, "After120")
        saved_obs = venv.reset()
        again_default = venv.reset()
    assert eps == [(2, 0, 2, None, None), (4, 0, 2, "After120", "After120")]
    expected = np.ascontiguousarray(screen.transpose(2, 0, 1))  # observations are channel-first
    assert saved_obs[0].shape == expected.shape
    np.testing.assert_array_equal(saved_obs[0], expected)
    assert not np.array_equal(saved_obs[0], default_obs[0])  # 120 frames in, the screen has changed
    np.testing.assert_array_equal(again_default[0], default_obs[0])


def test_retro_start_is_a_save_state():
    spec = EnvironmentSpec.model_validate({"provider": "retro", "env_id": "Airstriker-Genesis-v0", "n_envs": 1,
                                           "task": {"termination": {"max_episode_steps": 3}}})
    with make_vector_env(spec, seed=0) as venv:
        assert venv.starts == ("Level1",)
        with pytest.raises(ContractViolation, match=r"start: expected one of \['Level1'\], found 'Level9'"):
            venv.set_next_start(0, "Level9")
        default_obs = venv.reset()
        venv.set_next_start(0, "Level1")
        eps = _episodes(venv, 6)  # the reset at step 3 loads Level1; the one at step 6 the default
    assert eps == [(3, 0, 3, None, None), (6, 0, 3, "Level1", "Level1")]
    # Airstriker's default state *is* Level1 (its metadata.json): that a named start starts elsewhere
    # is shown with a save state of its own (test_retro_start_from_a_save_state_taken_after_n_steps).
    assert default_obs.shape == (1, *venv.single_observation_space.shape)


def _drawn_starts(seed: int, n_envs: int = 4, steps: int = 40) -> list[tuple[int, str | None]]:
    from gradlab.envs.groups import draw_training_starts

    venv = draw_training_starts(make_vector_env(_corridor(n_envs=n_envs), seed=seed), {"short": 0.5, "long": 0.5},
                                seed=seed)
    with venv:
        venv.reset()
        return [(lane, start) for _, lane, _, start, _ in _episodes(venv, steps)]


def test_training_draws_a_start_per_episode_per_lane_reproducibly_by_seed():
    first = _drawn_starts(0)
    assert first == _drawn_starts(0)  # the same seed: the same start for every episode of every lane
    assert first != _drawn_starts(1)
    assert {s for _, s in first} == {"short", "long"} and len(first) > 20
    lanes = [[s for lane, s in first if lane == k] for k in range(4)]
    assert len({tuple(seq) for seq in lanes}) > 1  # lanes draw from streams of their own
    # A lane's draws depend on the run seed and the lane only: lane 1 of a 2-lane env is lane 1 of a 4-lane one.
    two = _drawn_starts(0, n_envs=2)
    assert [s for lane, s in two if lane == 1] == lanes[1]


def test_a_named_start_wins_over_the_draw_and_unknown_weights_are_refused():
    with make_vector_env(_corridor(n_envs=1), seed=0) as venv:
        venv.draw_starts({"long": 1.0}, seed=0)
        venv.set_next_start(0, "short")
        venv.reset()
        assert _episodes(venv, 9) == [(2, 0, 2, "short", "short"), (9, 0, 7, "long", "long")]
        with pytest.raises(ContractViolation, match="start: expected one of \\['short', 'long'\\], found 'mid'"):
            venv.draw_starts({"mid": 1.0}, seed=0)
