"""Human play in a real browser (Playwright on Debian's chromium): keyboard events on CartPole-v1's
play-yourself page, recorded into a dataset that lands with ``agent: human`` and re-simulates
bit-exactly. A console error in the page fails the test (tests/browser.py). The player serves empty file stores
of its own: human play needs no trained run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser import open_page, screenshot
from tests.play.conftest import RunningPlayer, running_player

pytestmark = [pytest.mark.slow, pytest.mark.browser]

#: Mostly right, so the pole falls within tens of steps; "0" is the number key of PUSH_LEFT and "x"
#: no key of the map (it must not step).
KEYS = ["ArrowRight", "ArrowRight", "x", "ArrowLeft", "ArrowRight", "0", "ArrowRight", "ArrowRight"]
ACTION_OF_KEY = {"ArrowLeft": 0, "ArrowRight": 1, "0": 0}


@pytest.fixture
def human_player(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningPlayer]:
    """A player over empty file stores of its own (human play needs no trained run); the
    environment is restored once it has started, so only its own settings name its store."""
    home = tmp_path_factory.mktemp("play_human_home")
    saved = {k: os.environ.get(k) for k in ("GRADLAB_HOME", "GRADLAB_CONFIG")}

    def restore() -> None:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    os.environ["GRADLAB_HOME"] = str(home)
    os.environ["GRADLAB_CONFIG"] = str(home / "config.toml")
    try:
        with running_player(max_sessions=1) as player:
            restore()  # the worker starts under the test's environment: it publishes to the server's store
            player.config.prestart()
            yield player
    finally:
        restore()


def _wait(page, js: str, arg=None, timeout_s: float = 120) -> None:
    page.wait_for_function(js, arg=arg, timeout=timeout_s * 1000)


def test_a_human_episode_from_the_keyboard_lands_in_a_dataset_that_verifies(human_player: RunningPlayer,
                                                                            tmp_path: Path) -> None:
    from gradlab.datasets.store import fetch_dataset, load_steps, read_dataset
    from gradlab.datasets.verify import verify_dataset
    from gradlab.stores import open_dataset_store

    name = "human-cartpole"
    landed: list[dict] = []
    human_player.config.on_dataset = landed.append
    try:
        actions = _play(human_player, name)
    finally:
        human_player.config.on_dataset = None
    store = open_dataset_store(human_player.config.catalog.settings)  # the player's store, not this test's home
    manifest = read_dataset(store, name)
    assert [d["dataset"] for d in landed] == [name] and landed[0]["sha256"] == manifest.sha256
    assert manifest.agent.kind == "human" and manifest.agent.input_device == "keyboard"
    assert manifest.frames and manifest.episodes[0].frames_file is not None
    steps = load_steps(fetch_dataset(store, manifest, tmp_path / "cache"), manifest.episodes[0])
    assert len(manifest.episodes) == 1 and manifest.episodes[0].length == len(steps["actions"])
    assert steps["actions"].tolist() == actions
    assert steps["terminated"][-1] or steps["truncated"][-1]
    report = verify_dataset(store, name, cache=tmp_path / "cache")
    assert report.ok and report.episodes_replayed == 1 and not report.divergences, report


def _play(player: RunningPlayer, name: str) -> list[int]:
    """Open the play-yourself page recording ``name``, press keys until its one episode has landed;
    the actions of the mapped keys pressed."""
    with open_page() as page:
        page.goto(f"{player.base}/human/CartPole-v1?dataset={name}&episodes=1#token={player.token}")
        _wait(page, "() => window.gradlab && window.gradlab.state.ready && window.gradlab.state.seq >= 1")
        rows = page.locator("#panel-keys tbody tr").all_inner_texts()
        assert rows == ["← or 0\t0: PUSH_LEFT", "→ or 1\t1: PUSH_RIGHT"], rows
        assert page.get_attribute("#human-status", "data-mode") == "turn"  # no NOOP: one step per key press
        assert "0 of 1 episodes landed" in page.inner_text("#recording")
        screenshot(page, "play-human-1-ready")
        pressed: list[str] = []
        i = 0
        while page.get_attribute("#recording", "data-landed") != "1":
            assert i < 400, "the episode did not end"
            key = KEYS[i % len(KEYS)]
            i += 1
            if key not in ACTION_OF_KEY:
                page.keyboard.press(key)  # ignored: the next mapped key's step is the next one shown
                continue
            seq = page.evaluate("() => window.gradlab.state.seq")
            page.keyboard.press(key)
            pressed.append(key)
            _wait(page, "(n) => window.gradlab.state.seq > n", seq)
        _wait(page, "() => document.querySelector('#recording').dataset.published === 'true'")
        assert page.get_attribute("#panel-episode", "data-episodes") == "1"
        screenshot(page, "play-human-2-landed")
        actions = [ACTION_OF_KEY[k] for k in pressed]
        assert page.evaluate("() => window.gradlab.state.actions") == actions
    return actions


def test_a_goal_page_links_to_playing_it_yourself(human_player: RunningPlayer) -> None:
    """The catalog's goal page offers "Play yourself"; following it opens that goal's keyboard page."""
    with open_page() as page:
        page.goto(f"{human_player.base}/projects/classic-control/goals/CartPole-v1#token={human_player.token}")
        page.get_by_role("link", name="▶ Play yourself (keyboard)").click()
        page.wait_for_url("**/human/CartPole-v1*", timeout=60_000)
        _wait(page, "() => document.querySelectorAll('#panel-keys tbody tr').length === 2")
        screenshot(page, "play-human-0-goal-link")
