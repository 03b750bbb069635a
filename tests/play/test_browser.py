"""The web player in a real browser (Playwright on Debian's chromium): catalog to playback, controls,
scrubbing, a killed playback worker. A console error in the page fails the test (tests/browser.py)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.browser import open_page, screenshot
from tests.play.conftest import RunningPlayer, TrainedRuns

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _attr(page, selector: str, name: str) -> str | None:
    return page.get_attribute(selector, name)


def _wait(page, js: str, arg=None, timeout_s: float = 60) -> None:
    page.wait_for_function(js, arg=arg, timeout=timeout_s * 1000)


def _seq(page) -> int:
    return int(_attr(page, "#panel-game", "data-seq") or 0)


def _wait_seq(page, above: int) -> None:
    _wait(page, "(n) => Number(document.querySelector('#panel-game')?.dataset.seq || 0) > n", above)


def test_catalog_to_playback_controls_scrub_and_a_killed_worker(file_player: RunningPlayer,
                                                                trained_runs: TrainedRuns) -> None:
    cart = trained_runs.cartpole
    run_id, promoted = cart["run_id"], cart["promotion"]["checkpoint_step"]
    with open_page() as page:
        page.goto(f"{file_player.base}/#token={file_player.token}")
        page.get_by_role("link", name="Classic control").wait_for()
        screenshot(page, "play-1-projects")
        page.get_by_role("link", name="Classic control").click()
        page.wait_for_url("**/projects/classic-control#token=*")
        page.get_by_role("link", name="CartPole-v1").wait_for()
        page.get_by_label("Search goals").fill("lunar")
        page.get_by_role("link", name="LunarLander-v3").wait_for()
        assert page.get_by_role("link", name="CartPole-v1").count() == 0  # filtered out
        page.get_by_label("Search goals").fill("")
        screenshot(page, "play-2-project")
        page.get_by_role("link", name="CartPole-v1").click()
        page.wait_for_url("**/projects/classic-control/goals/CartPole-v1#token=*")
        page.get_by_role("link", name=run_id).wait_for()
        assert page.get_by_role("cell", name="succeeded").count() == 1
        screenshot(page, "play-3-goal")
        page.get_by_role("link", name=run_id).click()
        page.wait_for_url(f"**/runs/{run_id}#token=*")
        page.get_by_text("★ promoted").wait_for()
        page.locator("th", has_text="step").click()  # sort by step, descending on the second click
        page.locator("th", has_text="step").click()
        steps = [int(s) for s in page.locator("tbody tr td:first-child").all_inner_texts()]
        assert steps == sorted((c["step"] for c in cart["checkpoints"]), reverse=True)
        screenshot(page, "play-4-run")
        page.go_back()
        page.wait_for_url("**/goals/CartPole-v1#token=*")
        page.get_by_role("link", name=run_id).wait_for()
        page.go_forward()
        page.wait_for_url(f"**/runs/{run_id}#token=*")
        page.get_by_role("link", name=str(promoted), exact=True).click()
        page.wait_for_url(f"**/runs/{run_id}/checkpoints/{promoted}#token=*")

        # Playing: frames advance, the value chart and the action distribution update.
        _wait(page, "() => Number(document.querySelector('#panel-game')?.dataset.frames || 0) > 10", timeout_s=120)
        _wait(page, "() => Number(document.querySelector('#panel-value')?.dataset.points || 0) > 5")
        probs_before = _attr(page, "#panel-actions", "data-probs")
        seq = _seq(page)
        _wait_seq(page, seq + 5)
        assert _attr(page, "#panel-actions", "data-probs") != probs_before
        assert page.locator("#panel-actions .label", has_text="PUSH_LEFT").count() == 1  # env inspect's meanings
        screenshot(page, "play-5-playback")

        # Pause: nothing advances.
        page.click("#play")
        _wait(page, "() => document.querySelector('#panel-game')?.dataset.playing === 'false'")
        _wait(page, "() => window.gradlab.state.lastSeq === Number(document.querySelector('#panel-game').dataset.seq)")
        paused = _seq(page)
        time.sleep(0.5)
        assert _seq(page) == paused

        # Step 5.
        page.fill("#step-n", "5")
        page.click("#stepN")
        _wait(page, "(n) => Number(document.querySelector('#panel-game')?.dataset.seq) === n", paused + 5)

        # Reset with seed 7, twice: identical first frames.
        page.fill("#seed", "7")
        firsts = []
        for _ in range(2):
            before = _seq(page)
            page.click("#reset")
            _wait_seq(page, before)
            _wait(page, "() => document.querySelector('#panel-game')?.dataset.t === '0'")
            firsts.append(page.locator("#panel-game img[alt='game frame']").screenshot())
            start = _seq(page)  # read before the click: a step drawn before a later read would overshoot
            page.fill("#step-n", "12")
            page.click("#stepN")
            _wait(page, "(n) => Number(document.querySelector('#panel-game')?.dataset.seq) === n", start + 12)
        assert firsts[0] == firsts[1]
        assert page.locator("#panel-game img[alt='game frame']").screenshot() != firsts[0]  # 12 steps later the cart moved

        # Scrub back to step 2 of the episode: its frame and numbers are shown.
        page.locator("#panel-scrubber input[type=range]").evaluate(
            "(el) => { el.value = '2'; el.dispatchEvent(new Event('input')); }")
        _wait(page, "() => document.querySelector('#panel-game')?.dataset.t === '2'")
        page.get_by_text("(scrubbed)").wait_for()
        screenshot(page, "play-6-scrubbed")

        # Kill the playback worker mid-episode: the page says so, the server keeps answering, a reload plays.
        page.click("#play")
        _wait(page, "() => document.querySelector('#panel-game')?.dataset.playing === 'true'")
        pid = page.evaluate("() => window.gradlab.state.workerPid")
        assert isinstance(pid, int) and pid != os.getpid()
        os.kill(pid, signal.SIGKILL)
        page.get_by_text("exited").wait_for(timeout=60_000)
        assert "playback worker" in page.inner_text("#error")
        screenshot(page, "play-7-worker-killed")
        assert file_player.api("/api/projects").status_code == 200
        page.reload()
        _wait(page, "() => Number(document.querySelector('#panel-game')?.dataset.frames || 0) > 5", timeout_s=120)
        assert page.evaluate("() => window.gradlab.state.workerPid") != pid
        assert page.locator("#error").is_hidden()
