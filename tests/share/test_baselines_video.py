"""Baselines (random / noop on a goal's manifest) and `gradlab eval --video`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest

from gradlab.contracts import Experiments
from gradlab.evaluation.baselines import baseline_sha256, evaluate_baseline, read_baselines, store_baseline
from gradlab.evaluation.manifest import build_manifest
from gradlab.video import count_frames, read_mp4_metadata
from tests.share.conftest import gradlab


def _bandit_targets(goal) -> list[int]:
    """The rewarding arm of every manifest episode, read from a reset of the goal's own environment."""
    from gradlab.envs import make_vector_env

    targets = []
    for ident in build_manifest(goal).episodes:
        env = make_vector_env(goal.eval_environment().model_copy(update={"n_envs": 1}), seed=0, lane_seeds=[ident.seed])
        targets.append(int(np.argmax(env.reset()[0])))
        env.close()
    return targets


def test_bandit_baselines_match_the_hand_computed_means(gradlab_home: Path) -> None:
    goal = Experiments().load_goal("gradlab__bandit")
    targets = _bandit_targets(goal)
    noop = evaluate_baseline(goal, "noop")
    # noop always pulls arm 0: reward 1 exactly on the episodes whose rewarding arm is 0.
    assert noop.aggregates["eval/episode/return/mean"] == pytest.approx(np.mean([t == 0 for t in targets]))
    random = evaluate_baseline(goal, "random")
    n_arms = goal.train.environment.provider_args["n_arms"]
    # A uniform random arm earns the mean arm reward, 1/n_arms; 100 episodes: within 3 standard errors.
    p = 1.0 / n_arms
    assert abs(random.aggregates["eval/episode/return/mean"] - p) <= 3 * math.sqrt(p * (1 - p) / random.planned)
    assert random.checkpoint_sha256 == baseline_sha256("random") and random.verdict == "rejected"
    assert evaluate_baseline(goal, "random").episodes == random.episodes  # same manifest rng: same episodes


@pytest.mark.slow
def test_eval_baseline_command_stores_beside_results_and_shows_reference(gradlab_home: Path, experiments_copy: Path) -> None:
    goal_file = experiments_copy / "goals" / "gradlab__bandit" / "_goal.yaml"
    goal_file.write_text(goal_file.read_text() + "reference_scores: {human: 1.0}\n")
    out = gradlab("eval", "--baseline", "random", "gradlab__bandit", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    stored = list((gradlab_home / "stores" / "eval" / "baselines" / "gradlab__bandit").glob("random-*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["episodes"] == result["episodes"]
    noop = gradlab("eval", "--baseline", "noop", "gradlab__bandit")
    assert noop.returncode == 0, noop.stderr
    assert "reference human: 1" in noop.stderr and "human-normalised" in noop.stderr
    from gradlab.stores import open_stores

    goal = Experiments(experiments_copy).load_goal("gradlab__bandit")
    assert set(read_baselines(open_stores(), goal)) == {"random", "noop"}
    bad = gradlab("eval", "--baseline", "smart", "gradlab__bandit")
    assert bad.returncode == 2 and "--baseline" in bad.stderr


def test_a_stored_baseline_is_create_only(gradlab_home: Path) -> None:
    from gradlab.errors import Conflict
    from gradlab.stores import open_stores

    goal = Experiments().load_goal("gradlab__bandit")
    stores = open_stores()
    result = evaluate_baseline(goal, "noop")
    url = store_baseline(stores, goal, "noop", result)
    assert store_baseline(stores, goal, "noop", result) == url  # the same result again: agreed
    forged = result.model_copy(update={"wall_s": 5.0, "run_id": "someone"})
    with pytest.raises(Conflict, match="different noop baseline"):
        store_baseline(stores, goal, "noop", forged)


@pytest.mark.slow
def test_eval_video_records_manifest_episodes_with_provenance(cartpole_run: Path, tmp_path: Path) -> None:
    from gradlab.checkpoints import list_checkpoints, read_manifest

    ckpt = list_checkpoints(cartpole_run)[-1]
    out = gradlab("eval", str(ckpt), "--episodes", "4", "--json", "--video", str(tmp_path / "videos"),
                  "--video-episodes", "2")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    files = sorted((tmp_path / "videos").glob("*.mp4"))
    assert [f.name for f in files] == ["CartPole-v1__step4096__ep0000.mp4", "CartPole-v1__step4096__ep0001.mp4"]
    sha = read_manifest(ckpt).sha256
    for path, row in zip(files, result["episodes"][:2], strict=True):
        tags = read_mp4_metadata(path)
        assert tags["checkpoint_sha256"] == sha and tags["goal_id"] == "CartPole-v1"
        assert int(tags["seed"]) == row["seed"] and float(tags["return"]) == row["return"]
        assert tags["replay_matches_evaluation"] == "true"
        frames = list(iio.imiter(path, plugin="FFMPEG"))  # opens with imageio
        assert len(frames) == count_frames(path) == row["length"] > 5
        assert frames[0].shape == (400, 600, 3)  # CartPole's rgb_array frame
