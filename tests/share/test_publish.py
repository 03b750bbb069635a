"""`gradlab publish` and `hf://` sources: the model repository, its card, the upload, reading it back verified.

The Hub cannot be reached from here: the upload goes to a local HTTP stand-in at huggingface_hub's
endpoint setting (``HF_ENDPOINT``) that records what the client sends (repo creation, pre-upload,
the NDJSON commit), and reading back goes through a local hub cache in huggingface_hub's layout.
"""

from __future__ import annotations

import base64
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gradlab.checkpoints import list_checkpoints, read_manifest
from gradlab.contracts.hashing import sha256_json
from gradlab.contracts.run_spec import RunSpec
from gradlab.evaluation import EvalRequest, build_manifest, run_evaluation
from gradlab.receipts import (
    begin_attempt,
    make_evaluation_record,
    open_run,
    publish_checkpoint,
    record_evaluation,
    register_evaluation,
    write_promotion,
)
from gradlab.receipts.models import CheckpointRef, EvaluationIntent, Promotion
from gradlab.stores import keys, open_stores
from tests.share.conftest import gradlab, train_run

RUN_ID = "gradlab-20260101T000000-00b0b0b0"
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
EXPECTED_FILES = {"README.md", "gradlab.json", "run_spec.json", "goal.json", "recipe.json", "evaluation.json",
                  "checkpoint/manifest.json", "checkpoint/policy.safetensors", "checkpoint/policy_spec.json",
                  "ppo-Bandit-v0.zip", "replay.mp4"}


@pytest.fixture(scope="module")
def bandit_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_run(tmp_path_factory.mktemp("publish_runs"), "gradlab__bandit/ppo-sb3", run_id=RUN_ID,
                     overrides=("train.timesteps=2048",))


def _record(run_dir: Path, *, promote: bool):
    """Record the run in $GRADLAB_HOME's stores as the supervisor does: open, attempt, publish, evaluate, promote."""
    stores = open_stores()
    spec = RunSpec.model_validate_json((run_dir / "spec.json").read_bytes())
    open_run(stores, spec, now=T0)
    attempt, _ = begin_attempt(stores, RUN_ID, mode="fresh", now=T0)
    ckpt = list_checkpoints(run_dir)[-1]
    pub = publish_checkpoint(stores, run_id=RUN_ID, attempt_id=attempt.attempt_id, checkpoint_dir=ckpt, now=T0)
    result = run_evaluation(EvalRequest(checkpoint_dir=str(ckpt), checkpoint_sha256=pub.sha256,
                                        checkpoint_step=pub.step, spec=spec.to_json()))
    assert result.accepted
    intent = EvaluationIntent.create(run_id=RUN_ID, checkpoint=CheckpointRef(step=pub.step, sha256=pub.sha256, uri=pub.uri),
                                     goal_contract_sha256=spec.goal_contract_sha256,
                                     episode_manifest_sha256=build_manifest(spec.goal).sha256, backend="local", now=T0)
    register_evaluation(stores, intent)
    record_evaluation(stores, make_evaluation_record(intent, status="accepted", result=result.as_json(),
                                                     return_mean=result.aggregates["eval/episode/return/mean"], now=T0))
    if promote:
        write_promotion(stores, Promotion(
            run_id=RUN_ID, attempt_id=attempt.attempt_id, checkpoint_step=pub.step, checkpoint_sha256=pub.sha256,
            uri=pub.uri, evaluation_key=intent.key, result_uri=stores.eval.url(keys.evaluation_result(RUN_ID, intent.key)),
            return_mean=result.aggregates["eval/episode/return/mean"], promoted_at=T0))
    return result


@pytest.fixture
def home_run(bandit_run: Path, gradlab_home: Path) -> Path:
    dst = gradlab_home / "runs" / RUN_ID
    shutil.copytree(bandit_run, dst)
    return dst


def _hf_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": "", **extra}


@pytest.mark.slow
def test_publish_builds_the_repository_and_uploads_it(home_run: Path, tmp_path: Path, hub_stand_in) -> None:
    from huggingface_hub import ModelCard

    result = _record(home_run, promote=True)
    endpoint, requests = hub_stand_in
    folder = tmp_path / "repo"
    out = gradlab("publish", RUN_ID, "--repo", "alice/bandit-ppo", "--out", str(folder), "--json",
                  env=_hf_env(tmp_path, HF_TOKEN="hf_test_token", HF_ENDPOINT=endpoint))
    assert out.returncode == 0, out.stderr
    index = json.loads(out.stdout)
    files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert files == EXPECTED_FILES
    assert index["accepted"] is True and index["checkpoint_sha256"] == result.checkpoint_sha256
    card = ModelCard.load(folder / "README.md")
    assert {"reinforcement-learning", "stable-baselines3", "gradlab", "Bandit-v0"} <= set(card.data.tags)
    ev = card.data.eval_results[0]
    assert (ev.task_type, ev.dataset_type, ev.metric_type) == ("reinforcement-learning", "Bandit-v0", "mean_reward")
    mean, std = (float(x) for x in ev.metric_value.split("+/-"))
    assert mean == round(result.aggregates["eval/episode/return/mean"], 2)
    assert std == round(result.aggregates["eval/episode/return/std"], 2)
    assert "illustration, not evidence" in card.text
    evidence = json.loads((folder / "evaluation.json").read_text())
    assert evidence["episodes"] == result.as_json()["episodes"]
    # The upload: one repo creation, one commit whose message and files are exactly the folder's.
    posts = [(path, auth) for path, auth, _ in requests]
    assert posts[0] == ("/api/repos/create", "Bearer hf_test_token")
    commit = [body for path, _, body in requests if path.startswith("/api/models/alice/bandit-ppo/commit/main")]
    assert len(commit) == 1
    lines = [json.loads(line) for line in commit[0].decode().splitlines() if line.strip()]
    assert lines[0] == {"key": "header", "value": {"summary": f"gradlab publish gradlab__bandit run {RUN_ID} step 2048 "
                                                               f"({result.checkpoint_sha256[:16]})", "description": ""}}
    sent = {line["value"]["path"]: base64.b64decode(line["value"]["content"]) for line in lines[1:]}
    assert set(sent) == EXPECTED_FILES
    assert all(sent[name] == (folder / name).read_bytes() for name in sent)


def _cache(folder: Path, cache: Path, repo: str) -> Path:
    """Place a repository folder in huggingface_hub's cache layout (what snapshot_download leaves)."""
    owner, name = repo.split("/")
    root = cache / f"models--{owner}--{name}"
    snapshot = root / "snapshots" / ("a" * 40)
    shutil.copytree(folder, snapshot)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text("a" * 40)
    return snapshot


@pytest.mark.slow
def test_eval_hf_reads_the_repository_from_the_hub_cache_and_reproduces_the_result(home_run: Path, tmp_path: Path) -> None:
    result = _record(home_run, promote=True)
    folder = tmp_path / "repo"
    assert gradlab("publish", RUN_ID, "--out", str(folder), env=_hf_env(tmp_path)).returncode == 0
    snapshot = _cache(folder, tmp_path / "hub", "alice/bandit-ppo")
    env = _hf_env(tmp_path, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    out = gradlab("eval", "hf://alice/bandit-ppo", "--json", env=env)
    assert out.returncode == 0, out.stderr
    again = json.loads(out.stdout)
    assert again["episodes"] == result.as_json()["episodes"] and again["aggregates"] == result.aggregates
    assert again["verdict"] == "accepted"
    # The player takes the same source (headless: --record), verified the same way.
    from gradlab.video import count_frames, read_mp4_metadata

    video = tmp_path / "hf.mp4"
    played = gradlab("play", "hf://alice/bandit-ppo", "--record", str(video), "--episodes", "2", env=env)
    assert played.returncode == 0, played.stderr
    assert count_frames(video) > 0
    assert read_mp4_metadata(video)["checkpoint_sha256"] == result.checkpoint_sha256
    # A file changed in the downloaded copy: refused, naming it.
    spec_file = snapshot / "checkpoint" / "policy_spec.json"
    spec_file.write_text(spec_file.read_text().replace('"tanh"', '"relu"'))
    bad = gradlab("eval", "hf://alice/bandit-ppo", env=env)
    assert bad.returncode == 1
    assert f"{spec_file}: sha256 expected" in bad.stderr.replace("\n", "")
    refused = gradlab("play", "hf://alice/bandit-ppo", "--record", str(tmp_path / "bad.mp4"), env=env)
    assert refused.returncode == 1 and f"{spec_file}: sha256 expected" in refused.stderr.replace("\n", "")
    assert not (tmp_path / "bad.mp4").exists()
    missing = gradlab("eval", "hf://alice/other", env=env)
    assert missing.returncode == 1 and "not in the local hub cache" in missing.stderr


def test_publish_refuses_an_unpromoted_checkpoint_and_keeps_the_folder_without_a_token(home_run: Path, tmp_path: Path) -> None:
    _record(home_run, promote=False)
    out = gradlab("publish", RUN_ID, "--out", str(tmp_path / "r1"), env=_hf_env(tmp_path))
    assert out.returncode == 1
    assert "is not promoted (it has no promotion (no checkpoint was accepted))" in out.stderr
    assert "--allow-unaccepted" in out.stderr and not (tmp_path / "r1").exists()
    out = gradlab("publish", RUN_ID, "--allow-unaccepted", "--repo", "alice/x", "--out", str(tmp_path / "r2"),
                  env=_hf_env(tmp_path))
    assert out.returncode == 1
    assert "no Hugging Face token" in out.stderr and "hf upload alice/x" in out.stderr
    assert (tmp_path / "r2" / "gradlab.json").is_file()  # the folder is kept
    assert "**Not accepted**" in (tmp_path / "r2" / "README.md").read_text()
    index = json.loads((tmp_path / "r2" / "gradlab.json").read_text())
    assert index["accepted"] is False and index["files"]["README.md"]
    assert sha256_json(index) and read_manifest(list_checkpoints(home_run)[-1]).sha256 == index["checkpoint_sha256"]


_WARM_FROM_HUB = """
import json, sys
from pathlib import Path
from gradlab.cli.train_cmds import resolve_init_from
from gradlab.contracts import Experiments
from gradlab.contracts.run_spec import RunSpec
from gradlab.checkpoints import list_checkpoints, read_manifest
from gradlab.learn.learner import run_learner
overrides = ["train.timesteps=512", "train.checkpoint_freq=512"]
init = resolve_init_from("hf://alice/bandit-ppo", ref="gradlab__bandit/ppo", overrides=overrides, optimizer=False)
spec = RunSpec.from_resolved(Experiments().resolve("gradlab__bandit/ppo", overrides), seed=3, init_from=init,
                             run_id="gradlab-20260101T000000-00b0b0b1")
run_learner(spec, Path(sys.argv[1]), watch_parent=False)
print(json.dumps({"source": init.source, "parent": read_manifest(list_checkpoints(Path(sys.argv[1]))[-1]).init_from_sha256}))
"""


@pytest.mark.slow
def test_warm_start_from_a_published_repository(home_run: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.share.conftest import REPO

    result = _record(home_run, promote=True)
    folder = tmp_path / "repo"
    assert gradlab("publish", RUN_ID, "--out", str(folder), env=_hf_env(tmp_path)).returncode == 0
    _cache(folder, tmp_path / "hub", "alice/bandit-ppo")
    import os

    env = {**os.environ, **_hf_env(tmp_path, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")}
    out = subprocess.run([sys.executable, "-c", _WARM_FROM_HUB, str(tmp_path / "child")], capture_output=True, text=True,
                         cwd=REPO, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"source": "hf://alice/bandit-ppo",
                                                               "parent": result.checkpoint_sha256}


def test_the_upload_token_comes_from_a_secret_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``[hub] token_ref`` resolves where the token is used; HF_TOKEN wins; an unset one is named."""
    from gradlab.errors import ConfigError
    from gradlab.settings import load_settings
    from gradlab.share.hub import hf_token

    config = tmp_path / "config.toml"
    config.write_text('[hub]\ntoken_ref = "env:GRADLAB_TEST_HF_TOKEN"\n')
    config.chmod(0o600)  # a config naming secret references must be private
    monkeypatch.setenv("GRADLAB_CONFIG", str(config))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("GRADLAB_TEST_HF_TOKEN", "hf_from_ref")
    assert hf_token(load_settings()) == "hf_from_ref"
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert hf_token(load_settings()) == "hf_from_env"
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.delenv("GRADLAB_TEST_HF_TOKEN")
    with pytest.raises(ConfigError, match="hub.token_ref: secret reference env:GRADLAB_TEST_HF_TOKEN is not set"):
        hf_token(load_settings())
