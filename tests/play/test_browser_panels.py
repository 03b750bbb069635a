"""The player's panels in a real browser on an Atari checkpoint (untrained, in a run directory): the
action panel names ALE's actions, the game panel shows the colour screen beside the agent's
observation, the scrubber keeps up with the frame. A console error fails the test (tests/browser.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser import open_page, screenshot
from tests.play.conftest import running_player

pytestmark = [pytest.mark.slow, pytest.mark.browser]

RUN_ID = "gradlab-20260101T000000-0000a7a3"


def _wait(page, js: str, arg=None, timeout_s: float = 120) -> None:
    page.wait_for_function(js, arg=arg, timeout=timeout_s * 1000)


def test_atari_actions_colour_screen_beside_the_observation_and_a_scrubber_in_step(gradlab_home: Path) -> None:
    from gradlab.benchmarks.play import write_untrained_run
    from gradlab.checkpoints.resolve import resolve_checkpoint

    write_untrained_run(gradlab_home / "runs", "Breakout-Atari2600-v0/ppo", RUN_ID)
    with running_player() as player:
        player.config.catalog.pin(resolve_checkpoint(f"{RUN_ID}:64"))
        player.config.prestart()
        with open_page() as page:
            page.goto(f"{player.base}/runs/{RUN_ID}/checkpoints/64?fps=30#token={player.token}")
            _wait(page, "() => Number(document.querySelector('#panel-game')?.dataset.frames || 0) > 20", timeout_s=300)
            labels = page.locator("#panel-actions .label").all_inner_texts()
            assert labels == ["0: NOOP", "1: FIRE", "2: RIGHT", "3: LEFT"]  # as `gradlab env inspect ale:Breakout`
            screen = page.locator("#panel-game img[alt='game frame']")
            observation = page.locator("#panel-game img[alt='agent observation']")
            _wait(page, "() => document.querySelector(\"#panel-game img[alt='agent observation']\").naturalWidth > 0")
            # The screen had its frame already: frames are decoded before they are swapped in.
            assert screen.evaluate("(i) => [i.naturalWidth, i.naturalHeight]") == [160, 210]
            assert observation.evaluate("(i) => [i.naturalWidth, i.naturalHeight]") == [84, 84]
            assert page.get_attribute("#panel-game", "data-screen") == "colour screen"
            a, b = screen.bounding_box(), observation.bounding_box()
            assert b["x"] >= a["x"] + a["width"] - 1  # beside it, not over it
            screenshot(page, "play-atari-1-screen-and-observation")

            # While playing, every animation frame shows the scrubber at the step the game panel shows,
            # and neither image is ever blank (an <img> whose src changes before the new frame decoded
            # shows nothing for a moment: the screen would blink).
            lags, blanks = page.evaluate("""() => new Promise((done) => {
                const lags = [], blanks = []; let n = 0;
                const tick = () => {
                  const game = document.querySelector('#panel-game').dataset.t;
                  const scrub = document.querySelector('#panel-scrubber').dataset.t;
                  if (game !== undefined) lags.push(game === scrub ? 0 : 1);
                  for (const img of document.querySelectorAll('#panel-game img')) blanks.push(img.naturalWidth > 0 ? 0 : 1);
                  if (++n < 90) requestAnimationFrame(tick); else done([lags, blanks]);
                };
                requestAnimationFrame(tick);
            })""")
            assert len(lags) == 90 and sum(lags) == 0, lags
            assert len(blanks) == 180 and sum(blanks) == 0, blanks

            page.uncheck("#observation")  # the agent's view can be hidden
            assert observation.is_hidden() and screen.is_visible()
            screenshot(page, "play-atari-2-screen-only")
