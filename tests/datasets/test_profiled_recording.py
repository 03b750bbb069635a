"""Datasets of a goal with an action profile keep both actions: the profile's index the policy chose
(``actions``) and the provider-native action it became (``native_actions``), and ``verify`` checks
the second against the first."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from gradlab.datasets.verify import verify_dataset
from gradlab.stores import keys, open_store

#: The profile's actions and the full ALE action set's numbers they press (NOOP FIRE RIGHT LEFTFIRE).
PROFILE = [("STAY", "[]"), ("SERVE", "[FIRE]"), ("R", "[RIGHT]"), ("L_FIRE", "[LEFT, FIRE]")]
NATIVE = [0, 1, 3, 12]


@pytest.fixture
def profiled_dataset(experiments_copy: Path, tmp_path: Path):
    from gradlab.datasets.plan import plan_recording
    from gradlab.datasets.record import record_chunk
    from gradlab.datasets.store import publish_dataset

    goal = experiments_copy / "goals" / "PaddleBreakout"
    goal.mkdir()
    actions = "\n".join(f"      - {{name: {n}, buttons: {b}}}" for n, b in PROFILE)
    (goal / "_goal.yaml").write_text(f"""defaults: [../_atari.yaml, _self_]
title: Breakout with four actions
description: Breakout through an action profile of the full action set, without sticky actions.
tags: [atari]
action_profiles:
  paddle:
    actions:
{actions}
train:
  environment:
    env_id: Breakout
    n_envs: 2
    action_profile: paddle
    preprocessing: {{repeat_action_probability: 0.0}}
eval:
  episodes: 2
  n_envs: 2
  acceptance:
    - {{metric: eval/episode/return/mean, operator: ">=", threshold: 300}}
""")
    store = open_store((tmp_path / "store").as_uri())
    plan = plan_recording("paddle", goal_id="PaddleBreakout", policy="random", episodes=2, chunk_episodes=2,
                          frames=False)
    manifest = publish_dataset(store, plan, [record_chunk(plan, 0)], created_at="now")
    return store, tmp_path / "store", manifest


def test_a_profiled_recording_keeps_the_profile_index_and_the_native_action(profiled_dataset, tmp_path):
    from gradlab.datasets.store import fetch_dataset, load_steps

    store, _, manifest = profiled_dataset
    assert manifest.action_space["type"] == "Discrete" and manifest.action_space["n"] == 4
    assert manifest.native_action_space is not None
    assert manifest.native_action_space["type"] == "Discrete" and manifest.native_action_space["n"] == 18
    assert "native_action_space" in manifest.as_json()
    folder = fetch_dataset(store, manifest, tmp_path / "cache")
    for episode in manifest.episodes:
        steps = load_steps(folder, episode)
        assert len(steps["native_actions"]) == episode.length == len(steps["actions"])
        assert set(np.unique(steps["actions"]).tolist()) <= {0, 1, 2, 3}
        assert np.array_equal(steps["native_actions"], np.asarray(NATIVE)[steps["actions"]])
    report = verify_dataset(store, manifest.name, cache=tmp_path / "verify")
    assert report.ok, (report.file_problems, report.divergences)
    assert report.episodes_replayed == 2 and report.determinism == "deterministic"


def test_a_native_action_that_is_not_what_the_profile_makes_fails_verify(profiled_dataset, tmp_path):
    """The shard and its hash are rewritten consistently, one native action changed: re-simulation names the step."""
    from gradlab.stores.base import sha256_hex

    store, folder, manifest = profiled_dataset
    episode = manifest.episodes[1]
    path = folder / keys.dataset_file(manifest.name, manifest.recording_id, episode.steps_file)
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    step = min(5, episode.length - 1)
    row = episode.step_offset + step
    arrays["native_actions"][row] = 17 if arrays["native_actions"][row] != 17 else 16  # no profile action
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    path.write_bytes(buf.getvalue())
    doc = manifest.as_json()
    doc["files"][episode.steps_file] = {"sha256": sha256_hex(buf.getvalue()), "size_bytes": len(buf.getvalue())}
    (folder / keys.dataset_manifest(manifest.name)).write_text(json.dumps(doc))

    report = verify_dataset(store, manifest.name, cache=tmp_path / "cache")
    assert not report.ok and report.file_problems == []
    assert report.divergences == [f"episode {episode.index} (seed {episode.seed}): first diverging step {step}: "
                                  "native action differ"]


def test_a_dataset_without_a_profile_keeps_its_identity(tmp_path):
    """No profile: no native_actions member, and the manifest (and its sha256) has no native_action_space key."""
    from gradlab.datasets.plan import plan_recording
    from gradlab.datasets.record import record_chunk
    from gradlab.datasets.store import fetch_dataset, load_steps, publish_dataset

    store = open_store((tmp_path / "store").as_uri())
    plan = plan_recording("bandit", goal_id="gradlab__bandit", policy="noop", episodes=2, chunk_episodes=2,
                          frames=False)
    manifest = publish_dataset(store, plan, [record_chunk(plan, 0)], created_at="now")
    assert manifest.native_action_space is None and "native_action_space" not in manifest.as_json()
    folder = fetch_dataset(store, manifest, tmp_path / "cache")
    assert "native_actions" not in load_steps(folder, manifest.episodes[0])
