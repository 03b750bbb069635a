"""The player's API and WebSocket on real trained runs, over file stores and moto's S3 server, and the
same runs in a real browser (Playwright on Debian's chromium: catalog to playback, controls, scrubbing, a
killed playback worker; a console error fails the test, tests/browser.py). One module, so the runs are
trained once per xdist worker."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from gradlab.play.protocol import FRAME_HEADER, FRAME_MAGIC, PROTOCOL_VERSION
from tests.browser import open_page, screenshot
from tests.play.conftest import RunningPlayer, TrainedRuns, running_player

pytestmark = pytest.mark.slow


def _ws(player: RunningPlayer, *, origin: str | None = "self"):
    from websockets.sync.client import connect

    headers = {"Origin": player.base if origin == "self" else origin} if origin else {}
    return connect(f"ws://127.0.0.1:{player.config.port}/api/play", additional_headers=headers, open_timeout=30,
                   max_size=None)


def _hello(player: RunningPlayer, run_id: str, step: int, **extra) -> str:
    return json.dumps({"type": "hello", "protocol": PROTOCOL_VERSION, "token": player.token, "run_id": run_id,
                       "step": step, **extra})


def _next_step(ws) -> tuple[dict, bytes]:
    """The next step message and its frame (skipping state messages)."""
    while True:
        msg = json.loads(ws.recv(timeout=120))
        assert msg["type"] != "error", msg
        if msg["type"] == "step":
            frame = ws.recv(timeout=60)
            magic, seq, t = FRAME_HEADER.unpack_from(frame)
            assert (magic, seq, t) == (FRAME_MAGIC, msg["seq"], msg["t"])
            return msg, frame[FRAME_HEADER.size:]


def test_catalog_routes_mirror_the_file_stores(file_player: RunningPlayer, trained_runs: TrainedRuns) -> None:
    cart, bandit = trained_runs.cartpole, trained_runs.bandit
    projects = {p["project"]: p for p in file_player.api("/api/projects").json()["projects"]}
    assert projects["classic-control"]["runs"] == 1 and projects["smoke"]["runs"] == 1
    goals = {g["goal_id"]: g for g in file_player.api("/api/projects/classic-control").json()["goals"]}
    assert goals["CartPole-v1"]["runs"] == 1 and goals["CartPole-v1"]["env"] == "gymnasium:CartPole-v1"
    page = file_player.api("/api/projects/classic-control/goals/CartPole-v1").json()
    (row,) = page["runs"]
    assert row["run_id"] == cart["run_id"] and row["recipe_id"] == "ppo" and row["outcome"] == "succeeded"
    assert row["promoted_step"] == cart["promotion"]["checkpoint_step"] and row["final_step"] == cart["final_step"]
    low, high = row["best_return_ci95"]
    assert row["best_return_mean"] >= 475 and low <= row["best_return_mean"] <= high
    assert row["duration_s"] > 0
    run = file_player.api(f"/api/runs/{cart['run_id']}").json()
    assert [c["step"] for c in run["checkpoints"]] == [c["step"] for c in cart["checkpoints"]]
    promoted = [c["step"] for c in run["checkpoints"] if c["promoted"]]
    assert promoted == [cart["promotion"]["checkpoint_step"]]
    statuses = {e["checkpoint_step"]: e["status"] for e in cart["evaluations"]}
    assert all(c["evaluation"] in (statuses[c["step"]], None) or statuses[c["step"]] == "deferred"
               for c in run["checkpoints"])
    assert all(c["size_bytes"] > 0 for c in run["checkpoints"]) and run["project"] == "classic-control"
    steps = [c["step"] for c in run["checkpoints"]]
    pb = file_player.api(f"/api/runs/{cart['run_id']}/checkpoints/{steps[0]}").json()
    assert pb["protocol"] == PROTOCOL_VERSION and pb["previous_step"] is None and pb["error"] is None
    assert pb["next_step"] == (steps[1] if len(steps) > 1 else None)
    bandit_page = file_player.api("/api/projects/smoke/goals/gradlab__bandit").json()
    assert [r["run_id"] for r in bandit_page["runs"]] == [bandit["run_id"]]
    # Unknown names are 404 with a message naming them.
    for path, name in [("/api/projects/nope", "nope"), ("/api/projects/smoke/goals/CartPole-v1", "CartPole-v1"),
                       ("/api/runs/gradlab-19990101T000000-00000000", "gradlab-19990101"),
                       (f"/api/runs/{cart['run_id']}/checkpoints/7", "step 7"), ("/api/nothing", "nothing")]:
        res = file_player.api(path)
        assert res.status_code == 404 and name in res.json()["detail"], (path, res.text)


def test_token_headers_host_and_asset_confinement(file_player: RunningPlayer) -> None:
    import httpx

    assert file_player.api("/api/projects", token=None).status_code == 401
    assert file_player.api("/api/projects", token="wrong").status_code == 401
    for path in ("/api/projects", "/", "/runs/x/checkpoints/1", "/web/main.js"):
        res = file_player.api(path)
        assert res.status_code == 200, path
        assert res.headers["cache-control"] == "no-store" and res.headers["x-content-type-options"] == "nosniff"
        csp = res.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe" not in csp
    assert file_player.api("/").text.count(file_player.token) == 0  # the token is never served
    assert file_player.api("/web/vendor/uplot-1.6.32/LICENSE.txt").status_code == 200
    for raw in ("/web/%2e%2e/pyproject.toml", "/web/..%2fpyproject.toml", "/web/README.md/../../pyproject.toml",
                "/web/../gradlab/settings.py", "/web/nope.js"):
        with httpx.Client() as client:
            res = client.send(httpx.Request("GET", httpx.URL(file_player.base + raw)), follow_redirects=False)
        assert res.status_code == 404, (raw, res.status_code)
    foreign = httpx.get(f"{file_player.base}/api/projects", headers={"Host": "evil.example",
                                                                     "X-Gradlab-Token": file_player.token})
    assert foreign.status_code == 400


def test_websocket_refuses_foreign_origin_and_missing_token(file_player: RunningPlayer,
                                                            trained_runs: TrainedRuns) -> None:
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    run_id = trained_runs.bandit["run_id"]
    step = trained_runs.bandit["promotion"]["checkpoint_step"]
    for origin in ("http://evil.example", None):
        with pytest.raises(InvalidStatus) as refused:
            _ws(file_player, origin=origin)
        assert refused.value.response.status_code == 403
    with _ws(file_player) as ws:
        ws.send(json.dumps({"type": "hello", "protocol": PROTOCOL_VERSION, "token": "wrong", "run_id": run_id,
                            "step": step}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
        assert closed.value.rcvd.code == 4401
    with _ws(file_player) as ws:
        ws.send(json.dumps({"type": "play"}))  # a command before the hello: no token, nothing served
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
        assert closed.value.rcvd.code == 4401


def test_websocket_plays_the_bandit_with_signals_events_and_reproducible_resets(
        file_player: RunningPlayer, trained_runs: TrainedRuns) -> None:
    receipt = trained_runs.bandit
    step = receipt["promotion"]["checkpoint_step"]
    with _ws(file_player) as ws:
        ws.send(_hello(file_player, receipt["run_id"], step, seed=7, fps=0))
        ready = json.loads(ws.recv(timeout=180))
        assert ready["type"] == "ready", ready
        assert ready["checkpoint_sha256"] == receipt["promotion"]["sha256"] and ready["events"] == ["hit", "miss"]
        first, frame0 = _next_step(ws)
        assert first["t"] == 0
        for _ in range(3):
            msg, _ = _next_step(ws)
            assert msg["episode"]["outcome"] in ("success", "failure") and msg["events"] in (["hit"], ["miss"])
            assert msg["signals"]["correct"] in (0.0, 1.0)
        ws.send(json.dumps({"type": "pause"}))
        ws.send(json.dumps({"type": "reset", "seed": 7}))
        frames = []
        while len(frames) < 2:
            msg, frame = _next_step(ws)
            if msg["t"] == 0:
                frames.append(frame)
                ws.send(json.dumps({"type": "reset", "seed": 7}))
        assert frames[0] == frames[1] == frame0


def test_s3_stores_list_and_play_their_runs(trained_runs: TrainedRuns, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in trained_runs.s3_env.items():
        monkeypatch.setenv(k, v)
    receipt = trained_runs.s3_bandit
    with running_player() as player:
        projects = {p["project"]: p for p in player.api("/api/projects").json()["projects"]}
        assert projects["smoke"]["runs"] == 1 and projects["classic-control"]["runs"] == 0
        assert player.api("/api/projects").json()["stores"]["control"].startswith("s3://")
        (row,) = player.api("/api/projects/smoke/goals/gradlab__bandit").json()["runs"]
        assert row["run_id"] == receipt["run_id"] and row["promoted_step"] == receipt["promotion"]["checkpoint_step"]
        run = player.api(f"/api/runs/{receipt['run_id']}").json()
        assert [c["step"] for c in run["checkpoints"]] == [c["step"] for c in receipt["checkpoints"]]
        with _ws(player) as ws:  # downloaded from S3, verified against the publication, then played
            ws.send(_hello(player, receipt["run_id"], receipt["promotion"]["checkpoint_step"], fps=0))
            ready = json.loads(ws.recv(timeout=180))
            assert ready["type"] == "ready", ready
            assert ready["checkpoint_sha256"] == receipt["promotion"]["sha256"]
            msg, frame = _next_step(ws)
            assert msg["t"] == 0 and frame[:2] == b"\xff\xd8"


def test_video_route_records_episodes_as_mp4(file_player: RunningPlayer, trained_runs: TrainedRuns,
                                             tmp_path) -> None:
    from gradlab.video import count_frames, read_mp4_metadata

    receipt = trained_runs.bandit
    step = receipt["promotion"]["checkpoint_step"]
    res = file_player.api(f"/api/runs/{receipt['run_id']}/checkpoints/{step}/video?episodes=3&seed=5")
    assert res.status_code == 200, res.text
    assert res.headers["content-type"] == "video/mp4" and "attachment" in res.headers["content-disposition"]
    out = tmp_path / "v.mp4"
    out.write_bytes(res.content)
    assert count_frames(out) == 3  # bandit episodes are one step: one frame each
    meta = read_mp4_metadata(out)
    assert meta["checkpoint_sha256"] == receipt["promotion"]["sha256"] and meta["seed"] == "5"
    assert len(meta["return"].split(",")) == 3
    assert file_player.api(f"/api/runs/{receipt['run_id']}/checkpoints/{step}/video", token=None).status_code == 401


@pytest.mark.parametrize(("path", "fields"), [
    ("/api/play", {"run_id": "gradlab-20260101T000000-00000000", "step": 1}),
    ("/api/human", {"goal_id": "CartPole-v1"}),
    ("/api/replay", {"dataset": "any", "episode": 0}),
], ids=["play", "human", "replay"])
def test_every_websocket_refuses_another_protocol_version_with_a_message(file_player: RunningPlayer, path: str,
                                                                        fields: dict) -> None:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{file_player.config.port}{path}", additional_headers={"Origin": file_player.base},
                 open_timeout=30) as ws:
        ws.send(json.dumps({"type": "hello", "protocol": PROTOCOL_VERSION + 1, "token": file_player.token, **fields}))
        message = json.loads(ws.recv(timeout=30))
        assert message["type"] == "error" and "reload the page" in message["message"]
        assert f"protocol {PROTOCOL_VERSION + 1} is not the server's {PROTOCOL_VERSION}" in message["message"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
        assert closed.value.rcvd.code == 4500


# -- the same trained runs in a real browser (one module: the trained runs are trained once per worker) --
def _attr(page, selector: str, name: str) -> str | None:
    return page.get_attribute(selector, name)


def _wait(page, js: str, arg=None, timeout_s: float = 60) -> None:
    page.wait_for_function(js, arg=arg, timeout=timeout_s * 1000)


def _seq(page) -> int:
    return int(_attr(page, "#panel-game", "data-seq") or 0)


def _wait_seq(page, above: int) -> None:
    _wait(page, "(n) => Number(document.querySelector('#panel-game')?.dataset.seq || 0) > n", above)


@pytest.mark.browser
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
