"""A recorded Breakout episode (random agent, with frames) in a real browser: the goal page lists the
dataset and links its episode, the player's scrubber moves over the recorded frames, and the
action, reward and return panels show the recorded values of the step shown. A console error fails
the test (tests/browser.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.browser import open_page, screenshot
from tests.play.conftest import RecordedDataset, running_player

pytestmark = [pytest.mark.slow, pytest.mark.browser]

MEANINGS = ["NOOP", "FIRE", "RIGHT", "LEFT"]  # as `gradlab env inspect ale:Breakout` names them
#: A checksum of the image shown in the game panel (drawn to a canvas): the frame, not its URL.
PIXELS = """() => {
  const img = document.querySelector("#panel-game img[alt='game frame']");
  const c = document.createElement("canvas");
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const ctx = c.getContext("2d");
  ctx.drawImage(img, 0, 0);
  const d = ctx.getImageData(0, 0, c.width, c.height).data;
  let sum = 0;
  for (let i = 0; i < d.length; i += 1) sum = (sum * 31 + d[i]) % 1000000007;
  return [c.width, c.height, sum];
}"""


def _wait(page, js: str, arg=None, timeout_s: float = 120) -> None:
    page.wait_for_function(js, arg=arg, timeout=timeout_s * 1000)


def _shown(page, t: int) -> None:
    """Wait until the game panel and the step panel show step ``t`` (its frame decoded)."""
    _wait(page, """(t) => {
      const img = document.querySelector("#panel-game img[alt='game frame']");
      return document.querySelector('#panel-game').dataset.t === String(t)
        && document.querySelector('#panel-step').dataset.t === String(t) && img.complete && img.naturalWidth > 0;
    }""", t)


def test_a_recorded_breakout_episode_plays_under_the_scrubber_with_its_recorded_values(
        breakout_dataset: RecordedDataset, monkeypatch) -> None:
    from gradlab.datasets.store import fetch_dataset, load_steps
    from gradlab.settings import load_settings
    from gradlab.stores import open_store

    monkeypatch.setenv("GRADLAB_DATASET_STORE_URL", breakout_dataset.store_url)
    m = breakout_dataset.manifest
    episode = m.episodes[0]
    steps = load_steps(fetch_dataset(open_store(breakout_dataset.store_url), m, load_settings().home / "check"), episode)
    rewarded = np.flatnonzero(steps["raw_rewards"])
    k = int(rewarded[0]) if len(rewarded) else episode.length // 2  # a step whose reward is not 0, if any
    with running_player() as player:
        player.config.prestart()
        with open_page() as page:
            page.goto(f"{player.base}/projects/atari/goals/Breakout-Atari2600-v0#token={player.token}")
            row = page.locator("#main table.data").nth(1).locator("tbody tr", has_text="breakout-random")
            row.wait_for(timeout=60_000)
            assert row.locator("td").nth(2).inner_text() == "2"  # episodes
            assert row.get_by_role("link", name="▶ episode 0").count() == 1
            screenshot(page, "replay-breakout-0-goal-datasets")
            row.get_by_role("link", name="breakout-random").click()  # the dataset's page: one link per episode
            page.wait_for_url("**/datasets/breakout-random#token=*")
            episodes = page.locator("#main table.data tbody tr")
            episodes.nth(1).wait_for(timeout=60_000)
            assert episodes.count() == 2
            assert episodes.nth(0).locator("td").nth(4).inner_text() == str(episode.length)
            page.get_by_role("link", name="▶ 0", exact=True).click()

            _wait(page, "() => window.gradlab && window.gradlab.state.ready", timeout_s=180)
            assert page.url.split("#")[0].endswith("/datasets/breakout-random/episodes/0")
            assert page.locator("#panel-actions .label").all_inner_texts() == [f"{i}: {n}" for i, n in enumerate(MEANINGS)]
            assert page.get_attribute("#panel-game", "data-source") == "recorded"
            assert page.locator("#panel-episode [data-key='agent']").inner_text() == "random"
            assert page.locator("#panel-episode [data-key='seed']").inner_text() == str(episode.seed)
            assert page.locator("#panel-episode [data-key='length']").inner_text() == str(episode.length)
            _shown(page, 0)
            first = page.evaluate(PIXELS)
            assert first[:2] == [84, 84]  # the goal's render: the 84x84 frame the recorder kept

            scrub = page.locator("#panel-scrubber input[type=range]")
            assert scrub.get_attribute("max") == str(episode.length - 1)
            scrub.evaluate("(r, v) => { r.value = String(v); r.dispatchEvent(new Event('input')); }", k)
            _shown(page, k)
            assert page.evaluate(PIXELS) != first  # the frame changed with the scrubber
            panel = page.locator("#panel-step")
            assert panel.get_attribute("data-action") == str(int(steps["actions"][k]))
            assert float(panel.get_attribute("data-reward-raw")) == float(steps["raw_rewards"][k])
            assert float(panel.get_attribute("data-reward-shaped")) == float(steps["rewards"][k])
            assert float(panel.get_attribute("data-episode-return")) == pytest.approx(
                float(np.sum(steps["rewards"][:k + 1], dtype=np.float64)))
            action = int(steps["actions"][k])
            assert page.locator("#panel-actions .bar.chosen .label").inner_text() == f"{action}: {MEANINGS[action]}"
            assert page.locator("#panel-step [data-key='action']").inner_text() == f"{action}: {MEANINGS[action]}"
            assert page.get_attribute("#panel-reward", "data-points") == str(k + 1)
            screenshot(page, "replay-breakout-1-scrubbed")

            scrub.focus()  # the keyboard moves the same scrubber one step
            page.keyboard.press("ArrowRight")
            _shown(page, k + 1)
            assert page.get_attribute("#panel-step", "data-action") == str(int(steps["actions"][k + 1]))

            page.click("#play")  # plays on through the recorded frames, and stops at the episode's end
            _wait(page, "(t) => window.gradlab.state.view > t", k + 3)
            page.click("#play")
            assert page.inner_text("#play") == "Play"
            screenshot(page, "replay-breakout-2-played")
