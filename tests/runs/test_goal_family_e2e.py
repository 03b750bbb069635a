"""A nested goal (``Bandit/Arms4/Shaped``: its family's ``_goal-common.yaml``, its parent goal and
the family's ``_reward-shapes.yaml``) end to end: ``gradlab train`` through the real training-run
flow, its receipts, ``leaders``, the web player's API and page routes and its reward panel per
term (in chromium), and the HTML report page, all under the nested id."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.runs.conftest import gradlab_env, last_json_line, run_gradlab

pytestmark = [pytest.mark.slow, pytest.mark.browser]

GOAL = "Bandit/Arms4/Shaped"


def test_a_nested_goal_trains_and_its_id_reaches_receipts_leaders_player_and_report(
        prefect_api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.browser import open_page, screenshot
    from tests.play.conftest import running_player
    from tests.runs.test_results_e2e import cli

    home = tmp_path / "home"
    env = gradlab_env(prefect_api, GRADLAB_HOME=str(home), GRADLAB_CONFIG=str(home / "config.toml"),
                      WANDB_DIR=str(home / "wandb"))
    for var in ("GRADLAB_CONTROL_STORE_URL", "GRADLAB_EVAL_STORE_URL", "GRADLAB_MODEL_STORE_URL"):
        env.pop(var, None)
    out = run_gradlab(["train", f"{GOAL}/ppo", "--json"], env, timeout_s=600)
    assert out.returncode == 0, out.stderr[-3000:]
    receipt = last_json_line(out.stdout)
    assert receipt["outcome"] == "succeeded", receipt
    run_id = receipt["run_id"]

    monkeypatch.setenv("GRADLAB_HOME", str(home))
    monkeypatch.setenv("GRADLAB_CONFIG", str(home / "config.toml"))
    from gradlab import receipts as rules
    from gradlab.stores import open_stores

    stores = open_stores()
    record = rules.read_run(stores, run_id)
    assert (record.goal_id, record.recipe_id) == (GOAL, "ppo")
    assert record.display_name.startswith(f"{GOAL}__ppo__s")
    assert rules.read_promotion(stores, run_id) is not None

    leaders = cli(["leaders", "runs", "--goal", GOAL, "--json"], env)
    assert leaders.returncode == 0, leaders.stderr
    (leader,) = json.loads(leaders.stdout)
    assert leader["recipe_id"] == "ppo" and [s["run_id"] for s in leader["seeds"]] == [run_id]

    with running_player() as player:
        page_doc = player.api(f"/api/projects/smoke/goals/{GOAL}").json()
        assert (page_doc["goal_id"], [r["run_id"] for r in page_doc["runs"]]) == (GOAL, [run_id])
        rows = {r["goal_id"]: r for r in player.api("/api/projects/smoke").json()["goals"]}
        assert rows[GOAL]["family"] == "Bandit/Arms4" and rows[GOAL]["runs"] == 1
        with open_page() as page:
            page.goto(f"{player.base}/projects/smoke#token={player.token}")
            page.get_by_role("link", name=GOAL).click()
            page.wait_for_url(f"**/projects/smoke/goals/{GOAL}#token=*")
            page.get_by_role("link", name=run_id).wait_for()
            screenshot(page, "family-player-goal")
            step = receipt["promotion"]["checkpoint_step"]
            page.goto(f"{player.base}/runs/{run_id}/checkpoints/{step}#token={player.token}")
            try:
                page.wait_for_function("() => document.querySelector('#panel-reward')?.dataset.components",
                                       timeout=120_000)
            finally:
                screenshot(page, "family-player-reward-components")
            names = page.get_attribute("#panel-reward", "data-components").split(",")
            assert sorted(names) == ["hit_bonus", "miss_penalty", "native", "time_cost"]
            assert page.locator("#panel-reward tr[data-component='time_cost'] td").nth(1).inner_text() == "-0.010"

    site = tmp_path / "site"
    built = cli(["reports", "build", "--out", str(site), "--json"], env)
    assert built.returncode == 0, built.stderr
    doc = json.loads(built.stdout)
    assert doc["goals"] == [GOAL] and f"smoke/{GOAL}.html" in doc["pages"]
    with open_page() as page:
        page.goto((site / "index.html").as_uri())
        page.get_by_role("link", name=GOAL).click()
        page.wait_for_selector("#leaders")
        assert run_id in page.content()
        page.get_by_role("link", name="all goals").click()  # the way back from one folder deeper
        page.wait_for_url(os.fspath((site / "index.html").as_uri()))
