"""Results end to end on one real cohort: `gradlab sweep` trains 3 seeds of the bandit through the real
training-run flow on a real Prefect server; curves, leaders, compare, the Prefect artifacts, the
HTML report (in headless chromium) and reports sync (file and S3 stores) are checked on it.

The cohort is trained once for the module (a subprocess, as a user runs it); the read-only commands
then run in this process through typer's runner, which saves an interpreter start per command.
"""

from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.runs.conftest import gradlab_env, last_json_line, run_gradlab
from tests.s3server import s3_bucket, shared_s3_server  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow

GOAL, RECIPE = "gradlab__bandit", "ppo"


@dataclass(frozen=True)
class Cohort:
    home: Path
    env: dict[str, str]
    api_url: str
    doc: dict

    @property
    def run_ids(self) -> list[str]:
        return [r["run_id"] for r in self.doc["cohort"]["runs"]]


@pytest.fixture(scope="module")
def cohort(prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> Cohort:
    home = tmp_path_factory.mktemp("results_home")
    env = gradlab_env(prefect_api, GRADLAB_HOME=str(home), GRADLAB_CONFIG=str(home / "config.toml"),
                      WANDB_DIR=str(home / "wandb"))
    for var in ("GRADLAB_CONTROL_STORE_URL", "GRADLAB_EVAL_STORE_URL", "GRADLAB_MODEL_STORE_URL"):
        env.pop(var, None)
    out = run_gradlab(["sweep", f"{GOAL}/{RECIPE}", "--seeds", "3", "--set", "train.timesteps=4096", "--json"], env,
                      timeout_s=400)
    assert out.returncode == 0, out.stderr[-3000:]
    return Cohort(home=home, env=env, api_url=prefect_api, doc=last_json_line(out.stdout))


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


def cli(args: list[str], env: dict[str, str]) -> Result:
    """``gradlab ARGS`` in this process (typer's runner) with ``env``'s gradlab home."""
    from typer.testing import CliRunner

    from gradlab.cli.app import app

    keys = ("GRADLAB_HOME", "GRADLAB_CONFIG", "PREFECT_API_URL")
    out = CliRunner().invoke(app, args, env={k: env[k] for k in keys if k in env})
    if out.exception is not None and not isinstance(out.exception, SystemExit):
        raise out.exception
    return Result(out.exit_code, out.stdout, out.stderr)


@pytest.fixture
def stores(cohort: Cohort, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GRADLAB_HOME", str(cohort.home))
    monkeypatch.setenv("GRADLAB_CONFIG", str(cohort.home / "config.toml"))
    from gradlab.stores import open_stores

    return open_stores()


def test_sweep_seals_three_run_receipts_and_a_cohort_receipt(cohort: Cohort, stores) -> None:
    from gradlab import receipts as rules
    from gradlab.results.cohort_receipts import list_cohorts, read_cohort

    receipt = cohort.doc["cohort"]
    assert (receipt["goal_id"], receipt["recipe_id"], receipt["seeds"]) == (GOAL, RECIPE, [0, 1, 2])
    assert receipt["deployment"] is None and receipt["flow_run_id"]
    stored = read_cohort(stores, receipt["cohort_id"])
    assert stored.model_dump(mode="json") == receipt
    assert [c.cohort_id for c in list_cohorts(stores)] == [receipt["cohort_id"]]
    for run in receipt["runs"]:
        record = rules.read_run(stores, run["run_id"])
        assert (record.goal_id, record.recipe_id, record.seed) == (GOAL, RECIPE, run["seed"])
        terminal = rules.read_terminal(stores, run["run_id"], "attempt-001")
        assert terminal.outcome == run["outcome"] == "succeeded" and terminal.promotion is not None
    stats = cohort.doc["stats"]
    assert stats["n_seeds"] == 3 and stats["accepted"] == 3 and stats["objective"] == "eval/outcome/success/rate"
    assert stats["iqm"]["low"] is not None and stats["iqm"]["low"] <= stats["iqm"]["value"] <= stats["iqm"]["high"]


def test_leaders_rank_the_recipe_and_its_checkpoints(cohort: Cohort, stores) -> None:
    out = cli(["leaders", "runs", "--goal", GOAL, "--min-seeds", "3", "--json"], cohort.env)
    assert out.returncode == 0, out.stderr
    (leader,) = json.loads(out.stdout)
    assert (leader["recipe_id"], leader["n_scored"]) == (RECIPE, 3)
    assert sorted(s["run_id"] for s in leader["seeds"]) == sorted(cohort.run_ids)
    assert json.loads(cli(["leaders", "runs", "--goal", GOAL, "--min-seeds", "4", "--json"], cohort.env).stdout) == []
    out = cli(["leaders", "checkpoints", "--goal", GOAL, "--limit", "2", "--json"], cohort.env)
    rows = json.loads(out.stdout)
    assert len(rows) == 2 and all(r["promoted"] and r["run_id"] in cohort.run_ids for r in rows)
    from gradlab import receipts as rules

    for r in rows:
        promotion = rules.read_promotion(stores, r["run_id"])
        assert (r["step"], r["sha256"]) == (promotion.checkpoint_step, promotion.checkpoint_sha256)
        assert r["play_command"] == f"gradlab play {r['run_id']}:{r['step']}"
    missing = cli(["leaders", "runs", "--goal", "CartPole-v1"], cohort.env)
    assert missing.returncode == 1 and "goal CartPole-v1: no sealed runs" in missing.stderr


def test_compare_identical_cohorts_gives_one_half_and_refuses_two_goals(cohort: Cohort) -> None:
    out = cli(["compare", f"{GOAL}/{RECIPE}", f"{GOAL}/{RECIPE}", "--json"], cohort.env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["probability_of_improvement"]["value"] == 0.5
    named = cli(["compare", f"{GOAL}/{RECIPE}", f"{GOAL}/{RECIPE}", "--set-a", "train.timesteps=4096", "--set-b",
                 "train.timesteps=8192"], cohort.env)
    assert named.returncode == 1 and "no sealed runs with overrides ['train.timesteps=8192']" in named.stderr
    other = cli(["compare", f"{GOAL}/{RECIPE}", "CartPole-v1/ppo"], cohort.env)
    assert other.returncode == 1 and "different goals" in other.stderr


def _journal_points(path: Path, metric: str, axis: str) -> list[tuple[float, float]]:
    """The test's own reading of the journal's JSON lines (an independent oracle)."""
    points = []
    for line in path.read_text().splitlines():
        m = json.loads(line)["metrics"]
        if metric in m and axis in m:
            points.append((float(m[axis]), float(m[metric])))
    return points


def test_curve_points_equal_the_journal_and_the_png_is_written(cohort: Cohort, tmp_path: Path) -> None:
    run_id = cohort.run_ids[0]
    out_png = tmp_path / "curves.png"
    out = cli(["runs", "curves", run_id, "--metric", "train/episode/return/shaped/mean", "--metric",
                       "eval/outcome/success/rate", "--metric", "train/algorithm/{algorithm}/update/value_loss",
                       "--out", str(out_png), "--json"], cohort.env)
    assert out.returncode == 0, out.stderr
    curves = {c["metric"]: c for c in json.loads(out.stdout)["curves"]}
    assert set(curves) == {"train/episode/return/shaped/mean", "eval/outcome/success/rate",
                           "train/algorithm/ppo/update/value_loss"}
    journal = cohort.home / "runs" / run_id / "journal.jsonl"
    for metric, axis in (("train/episode/return/shaped/mean", "train/global_step"),
                         ("eval/outcome/success/rate", "eval/checkpoint_step"),
                         ("train/algorithm/ppo/update/value_loss", "train/global_step")):
        expected = _journal_points(journal, metric, axis)
        assert len(expected) >= 1
        assert list(zip(curves[metric]["x"], curves[metric]["y"], strict=True)) == expected
    # The success rate's band is the journal's Wilson interval.
    low = _journal_points(journal, "eval/outcome/success/rate_ci95_low", "eval/checkpoint_step")
    assert curves["eval/outcome/success/rate"]["low"] == [y for _, y in low]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out_png.stat().st_size > 10_000
    seconds = cli(["runs", "curves", run_id, "--x", "seconds", "--out", str(tmp_path / "c.svg"), "--json"],
                          cohort.env)
    assert seconds.returncode == 0, seconds.stderr
    xs = json.loads(seconds.stdout)["curves"][0]["x"]
    assert xs == sorted(xs) and xs[0] > 0 and (tmp_path / "c.svg").read_text().lstrip().startswith("<?xml")


def test_curves_refuse_bad_metric_unknown_run_missing_and_truncated_journal(cohort: Cohort, tmp_path: Path) -> None:
    run_id = cohort.run_ids[1]
    bad = cli(["runs", "curves", run_id, "--metric", "train/episode/retrun", "--out", str(tmp_path / "x.png")],
                      cohort.env)
    assert bad.returncode == 1 and "metric 'train/episode/retrun' is not registered" in bad.stderr
    unknown = cli(["runs", "curves", "gradlab-20260101T000000-deadbeef", "--out", str(tmp_path / "x.png")],
                          cohort.env)
    assert unknown.returncode == 1 and "no run gradlab-20260101T000000-deadbeef" in unknown.stderr
    # A copy of the home, so the module's cohort stays whole.
    home = tmp_path / "home"
    shutil.copytree(cohort.home, home, ignore=shutil.ignore_patterns("wandb", "*.sqlite*", "checkpoints"))
    env = {**cohort.env, "GRADLAB_HOME": str(home), "GRADLAB_CONFIG": str(home / "config.toml")}
    journal = home / "runs" / run_id / "journal.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines[: len(lines) // 2]))
    truncated = cli(["runs", "curves", run_id, "--out", str(tmp_path / "x.png")], env)
    assert truncated.returncode == 1
    assert f"run {run_id}: metric journal {journal} is truncated" in truncated.stderr.replace("\n", "")
    journal.unlink()
    missing = cli(["runs", "curves", run_id, "--out", str(tmp_path / "x.png")], env)
    assert missing.returncode == 1 and f"run {run_id}: metric journal {journal} is missing" in missing.stderr.replace("\n", "")
    assert not (tmp_path / "x.png").exists()


def test_training_runs_show_progress_evaluations_and_receipt_artifacts(cohort: Cohort, stores) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from gradlab import receipts as rules

    run_id = cohort.run_ids[2]
    receipt = rules.read_terminal(stores, run_id, "attempt-001")
    key = f"run-{run_id.lower()}"
    with temporary_settings(updates={PREFECT_API_URL: cohort.api_url}), get_client(sync_client=True) as client:
        latest = {k: client.read_latest_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{key}-{k}"])))
                  for k in ("progress", "evaluations", "receipt")}
    progress, evaluations, markdown = (latest[k][0] for k in ("progress", "evaluations", "receipt"))
    spec = json.loads((cohort.home / "runs" / run_id / "spec.json").read_text())
    timesteps = spec["recipe"]["train"]["timesteps"]
    assert progress.type == "progress"
    # Issue 22 item 9: a run's progress ends at its final state (100 % for a succeeded run, the
    # outcome, the step and why); test_a_run_stopped_early_... checks one stopped before its budget.
    assert receipt.outcome == "succeeded"
    assert float(progress.data) == 100.0
    assert progress.description == (f"{run_id}: succeeded at step {receipt.final_step:,} of {timesteps:,} "
                                     f"({100.0 * receipt.final_step / timesteps:.1f} % of the budget): {receipt.reason}")
    rows = json.loads(evaluations.data) if isinstance(evaluations.data, str) else evaluations.data
    done = [e for e in receipt.evaluations if e.status in ("accepted", "rejected")]
    assert [(r["checkpoint_step"], r["return_mean"], r["verdict"]) for r in rows] == [
        (e.checkpoint_step, e.return_mean, e.status) for e in done]
    assert all(r["ci95_low"] <= r["return_mean"] <= r["ci95_high"] for r in rows)
    text = markdown.data
    assert run_id in text and f"**{receipt.outcome}**" in text and receipt.promotion.sha256 in text
    assert f"gradlab play {run_id}:{receipt.promotion.checkpoint_step}" in text
    # Every flow run of the run links its artifacts to itself, and its evaluations are one table
    # updated in place (not one artifact version per result).
    assert progress.flow_run_id == markdown.flow_run_id == evaluations.flow_run_id
    with temporary_settings(updates={PREFECT_API_URL: cohort.api_url}), get_client(sync_client=True) as client:
        versions = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{key}-evaluations"])))
    assert [v.id for v in versions] == [evaluations.latest_id]  # one artifact, updated in place
    assert len(rows) >= 1 and [r["verdict"] for r in rows] != ["pending"] * len(rows)
    assert next(r for r in cohort.doc["cohort"]["runs"] if r["run_id"] == run_id)["flow_run_id"] == str(progress.flow_run_id)
    with temporary_settings(updates={PREFECT_API_URL: cohort.api_url}), get_client(sync_client=True) as client:
        (table,) = client.read_latest_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[cohort.doc["cohort"]["cohort_id"].lower()])))
        sweep_run = client.read_flow_run(uuid.UUID(cohort.doc["cohort"]["flow_run_id"]))
        child = client.read_flow_run(progress.flow_run_id)
    # A child flow run of the sweep; its W&B run carries the cohort id as a tag.
    assert child.parameters["cohort_id"] == cohort.doc["cohort"]["cohort_id"] and child.parent_task_run_id is not None
    assert sweep_run.name and table.flow_run_id == sweep_run.id
    assert sorted(r["run_id"] for r in json.loads(table.data)) == sorted(cohort.run_ids)


@pytest.mark.browser
def test_report_renders_its_leaders_table_and_images_in_chromium(cohort: Cohort, tmp_path: Path) -> None:
    from tests.browser import open_page, screenshot

    site = tmp_path / "site"
    out = cli(["reports", "build", "--out", str(site), "--json"], cohort.env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["goals"] == [GOAL] and f"smoke/{GOAL}.html" in doc["pages"]
    page_path = site / "smoke" / f"{GOAL}.html"
    assert "http://" not in page_path.read_text() and "https://" not in page_path.read_text()
    with open_page() as page:
        page.goto((site / "index.html").as_uri())
        page.get_by_role("link", name=GOAL).click()
        page.wait_for_selector("#leaders")
        cells = page.locator("#leaders tr").nth(1).locator("td").all_inner_texts()
        assert cells[:3] == ["1", f"{RECIPE} [train.timesteps=4096]", "3/3"]  # seeds scored / seeds
        assert page.locator("#seeds tr").count() == 4 and page.locator("#checkpoints tr").count() == 4
        widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
        assert widths and all(w > 100 for w in widths)
        screenshot(page, "results-report-gradlab__bandit")


def test_reports_sync_is_create_only_by_content_hash_with_a_cas_index(cohort: Cohort, tmp_path: Path, stores,
                                                                      s3_bucket) -> None:  # noqa: F811
    from gradlab.results.reports import INDEX_KEY, build_site, site_manifest, sync_site
    from gradlab.settings import load_settings
    from gradlab.stores import open_store

    site = tmp_path / "site"
    build_site(load_settings(), stores, site)
    again = build_site(load_settings(), stores, tmp_path / "again")
    assert site_manifest(site) == site_manifest(again.root)  # same stores and journals: same bytes
    for store in (open_store((tmp_path / "store").as_uri()), open_store(s3_bucket.url("reports-site"))):
        first = sync_site(site, store)
        assert first["uploaded"] == first["files"] == len(site_manifest(site))
        second = sync_site(again.root, store)
        assert second["build"] == first["build"] and second["uploaded"] == 0
        index = json.loads(store.get(INDEX_KEY))
        assert index["latest"] == first["build"] and len(index["builds"]) == 1
        page = store.get(f"reports/builds/{first['build']}/smoke/{GOAL}.html")
        assert page == (site / "smoke" / f"{GOAL}.html").read_bytes()
    # The CLI publishes to the same file store: an unchanged site is the same build.
    out = cli(["reports", "sync", "--store", (tmp_path / "store").as_uri(), "--json"], cohort.env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["build"] == first["build"]


def test_sweep_refuses_an_unknown_deployment_and_a_bad_seed_count(cohort: Cohort) -> None:
    out = run_gradlab(["sweep", f"{GOAL}/{RECIPE}", "--seeds", "2", "--deployment", "training-run/nope"], cohort.env)
    assert out.returncode == 1 and "--deployment training-run/nope: no such deployment" in out.stderr
    assert "cohort-" not in out.stderr  # refused before a cohort was started
    bad = cli(["sweep", f"{GOAL}/{RECIPE}", "--seeds", "0"], cohort.env)
    assert bad.returncode == 2 and "--seeds: expected at least 1, found 0" in bad.stderr


def test_every_run_of_the_cohorts_key_shares_one_wandb_group_sweep_or_plain_train(cohort: Cohort, tmp_path: Path) -> None:
    # Issue 22 item 8: only sweep runs had a W&B group (the cohort id). The group is now the leaders'
    # cohort key, so a plain `gradlab train` of the same recipe and overrides joins the sweep's group.
    from gradlab.metrics.wandb_sink import read_offline_run
    from gradlab.results.cohorts import cohort_group

    group = cohort_group(GOAL, RECIPE, ["train.timesteps=4096"])
    assert group == "gradlab__bandit/ppo [train.timesteps=4096]"
    cohort_id = cohort.doc["cohort"]["cohort_id"]
    for run_id in cohort.run_ids:
        run = read_offline_run(cohort.home / "runs" / run_id / "wandb", run_id)
        assert run is not None and (run["group"], run["tags"]) == (group, [cohort_id]), run
    home = tmp_path / "home"  # its own home: the cohort's leaders stay three seeds
    env = gradlab_env(cohort.api_url, GRADLAB_HOME=str(home), GRADLAB_CONFIG=str(home / "config.toml"),
                      WANDB_DIR=str(home / "wandb"))
    out = run_gradlab(["train", f"{GOAL}/{RECIPE}", "--seed", "7", "--set", "train.timesteps=4096", "--json"], env)
    assert out.returncode == 0, out.stderr[-3000:]
    run_id = last_json_line(out.stdout)["run_id"]
    run = read_offline_run(home / "runs" / run_id / "wandb", run_id)
    assert run is not None and (run["group"], run["tags"]) == (group, []), run


def _artifacts(api_url: str, run_id: str) -> dict[str, list]:
    """Every artifact version of a run's three keys, by key suffix."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.settings import PREFECT_API_URL, temporary_settings

    key = f"run-{run_id.lower()}"
    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        return {k: client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{key}-{k}"])))
                for k in ("progress", "evaluations", "receipt")}


def test_a_run_stopped_early_on_acceptance_ends_its_progress_at_its_final_state_with_one_evaluations_table(
        cohort: Cohort, tmp_path: Path) -> None:
    # Issue 22 item 9: the progress of a run that stopped early said "24.8 %", and each new
    # evaluation result was another artifact card. A budget far beyond what acceptance needs.
    home = tmp_path / "home"
    env = gradlab_env(cohort.api_url, GRADLAB_HOME=str(home), GRADLAB_CONFIG=str(home / "config.toml"),
                      WANDB_DIR=str(home / "wandb"))
    timesteps = 1_048_576
    out = run_gradlab(["train", f"{GOAL}/{RECIPE}", "--seed", "11", "--set", f"train.timesteps={timesteps}", "--json"],
                      env, timeout_s=600)
    assert out.returncode == 0, out.stderr[-3000:]
    receipt = last_json_line(out.stdout)
    assert receipt["outcome"] == "succeeded" and receipt["final_step"] < timesteps, receipt["reason"]
    found = _artifacts(cohort.api_url, receipt["run_id"])
    (progress,), (table,), (markdown,) = found["progress"], found["evaluations"], found["receipt"]
    assert float(progress.data) == 100.0
    share = 100.0 * receipt["final_step"] / timesteps
    assert progress.description == (f"{receipt['run_id']}: succeeded at step {receipt['final_step']:,} of {timesteps:,} "
                                     f"({share:.1f} % of the budget): {receipt['reason']}")
    rows = json.loads(table.data)
    done = [e for e in receipt["evaluations"] if e["status"] in ("accepted", "rejected")]
    assert [(r["checkpoint_step"], r["verdict"]) for r in rows if r["verdict"] != "pending"] == [
        (e["checkpoint_step"], e["status"]) for e in done]
    assert "accepted" in [r["verdict"] for r in rows]
    assert progress.flow_run_id == table.flow_run_id == markdown.flow_run_id
