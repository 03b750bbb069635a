"""A goal with several starts, end to end without a ROM (``gradlab__keydoor/TwoStarts``): training
draws a start per episode by the recipe's weights, reproducibly per seed; evaluation gives each start
its quota and reports per-start metrics (docs/ARCHITECTURE.md sections 3 and 7)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradlab.checkpoints.bundle import list_checkpoints
from gradlab.contracts.experiments import Experiments
from gradlab.contracts.run_spec import RunSpec
from gradlab.errors import ConfigError
from gradlab.evaluation.manifest import build_manifest
from gradlab.evaluation.runner import evaluate_policy
from gradlab.learn.learner import run_learner
from gradlab.metrics.registry import check_names
from gradlab.outbox import Outbox

GOAL = "gradlab__keydoor/TwoStarts"
UP, RIGHT, DOWN, LEFT = range(4)


def _spec(seed: int, *overrides: str) -> RunSpec:
    r = Experiments().resolve(f"{GOAL}/ppo", ["train.timesteps=2048", "train.environment.n_envs=4",
                                              "train.backend.config.n_steps=64", "train.backend.config.n_epochs=1", *overrides])
    return RunSpec(run_id=f"gradlab-20250101T000000-0000000{seed}", goal_id=r.goal.goal_id, recipe_id="ppo",
                   seed=seed, goal=r.goal, recipe=r.recipe, environment=r.environment,
                   eval_environment=r.goal.eval_environment(r.environment), checkpoint_freq=r.checkpoint_freq,
                   goal_contract_sha256=r.hashes.goal_contract_sha256, recipe_sha256=r.hashes.recipe_sha256,
                   environment_sha256=r.hashes.environment_sha256, created_at="2025-01-01T00:00:00+00:00")


def _start_counts(spec: RunSpec, run_dir: Path, resume_from: Path | None = None) -> dict[str, float]:
    result = run_learner(spec, run_dir, resume_from=resume_from, watch_parent=False)
    assert result.final_step == 2048
    metrics = [e.payload["metrics"] for e in Outbox(run_dir / "outbox.sqlite").read(limit=10_000)
               if e.kind == "metrics"]
    check_names({n for m in metrics for n in m})
    last = [m for m in metrics if "train/episode/count" in m][-1]
    counts = {k: v for k, v in last.items() if k.startswith("train/start/")}
    assert sum(v for k, v in counts.items() if k.endswith("/episode/count")) == last["train/episode/count"]
    return counts


def test_training_draws_each_episodes_start_by_the_recipes_weights_reproducibly(tmp_path: Path) -> None:
    spec = _spec(0)
    assert spec.recipe.train.start_weights(spec.goal.eval.starts) == {"corner": 0.25, "door": 0.75}
    first, again = _start_counts(spec, tmp_path / "a"), _start_counts(spec, tmp_path / "b")
    corner, door = first["train/start/corner/episode/count"], first["train/start/door/episode/count"]
    assert corner > 0 and door > 0 and door > corner  # both starts, the door drawn 3:1
    assert first == again  # the same seed draws the same starts (per-lane draws: tests/envs/test_starts.py)
    # Resumed at step 1024, the lanes (plain data here) continue with their draw streams: same starts.
    halves = _spec(0, "train.checkpoint_freq=1024")
    _start_counts(halves, tmp_path / "h1")
    middle = next(p for p in list_checkpoints(tmp_path / "h1") if p.name.startswith("000000001024-"))
    assert _start_counts(halves, tmp_path / "h2", resume_from=middle) == first
    only_door = _start_counts(_spec(0, "train.starts={door: 1, corner: 0}"), tmp_path / "d")
    assert "train/start/corner/episode/count" not in only_door and only_door["train/start/door/episode/count"] > 0


def test_start_weights_must_name_the_goals_starts() -> None:
    with pytest.raises(ConfigError) as info:
        Experiments().resolve(f"{GOAL}/ppo", ["train.starts={corner: 1, window: 2}"])
    assert [(p.key_path, p.message) for p in info.value.problems] == [
        ("train.starts.window", f"goal '{GOAL}' has no start 'window'; expected one of ['corner', 'door'] "
                                "(its eval.starts)")]
    with pytest.raises(ConfigError, match="start weights must be >= 0"):
        Experiments().resolve(f"{GOAL}/ppo", ["train.starts={corner: -1, door: 2}"])
    with pytest.raises(ConfigError) as info:
        Experiments().resolve("gradlab__keydoor/ppo", ["train.starts={door: 1}"])
    assert "goal 'gradlab__keydoor' names no starts (eval.starts), found 'door'" in info.value.problems[0].message


class _MazeSolver:
    """Walks the KeyDoor-v0 layout to the goal from either start: fetch the key, go through the door."""

    def act(self, obs: np.ndarray, *, deterministic: bool, rng: np.random.Generator) -> np.ndarray:
        out = []
        for x, y, key in np.rint(obs * np.array([18, 8, 1])).astype(int):
            if not key:
                out.append(DOWN if y < 7 else RIGHT)  # the key is at (9, 7)
            elif x <= 9 and y != 4:
                out.append(LEFT if x == 9 else UP if y > 4 else DOWN)  # to the door's row
            elif x < 17:
                out.append(RIGHT)
            else:
                out.append(DOWN)  # the goal is at (17, 7)
        return np.array(out, dtype=np.int64)


def test_a_two_start_evaluation_gives_each_start_its_quota_and_per_start_metrics() -> None:
    resolved = Experiments().resolve(f"{GOAL}/ppo")
    goal, env = resolved.goal, resolved.goal.eval_environment(resolved.environment)
    manifest = build_manifest(goal)
    assert [e.start for e in manifest.episodes] == ["corner", "door"] * 4
    hashes = resolved.hashes.as_dict()
    result = evaluate_policy(_MazeSolver(), goal=goal, environment=env, hashes=hashes, checkpoint_sha256="0" * 64,
                             checkpoint_step=0)
    agg = result.aggregates
    assert (result.completed, result.accepted) == (8, True)
    assert [r.start for r in result.episodes] == ["corner", "door"] * 4
    lengths = {r.start: r.length for r in result.episodes}
    assert lengths["door"] < lengths["corner"]  # the door start is nearer the goal
    for start in ("corner", "door"):
        assert agg[f"eval/start/{start}/episodes"] == 4.0
        assert agg[f"eval/start/{start}/success/rate"] == 1.0
        assert agg[f"eval/start/{start}/success/rate_ci95_low"] < 1.0 == agg[f"eval/start/{start}/success/rate_ci95_high"]
