"""gradlab.jerk on the key-door maze: a higher return than random actions in the same budget.

The maze pays 0.1 for the key and 1.0 at the goal. JERK retains the sequences that reach the key
and replays them ever more often, so its episodes' mean return beats random actions'; in this
budget neither reaches the goal (that takes Go-Explore, tests/explore/test_go_explore.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradlab.contracts.experiments import Experiments
from gradlab.contracts.run_spec import RunSpec
from gradlab.envs.vector import make_vector_env
from gradlab.learn.learner import run_learner
from gradlab.metrics.registry import check_names
from gradlab.outbox import Outbox

BUDGET = 16384


def _random_returns(spec: RunSpec, seed: int) -> list[float]:
    """Shaped returns of the episodes uniform random actions finish in the budget."""
    rng = np.random.default_rng(seed)
    returns = []
    with make_vector_env(spec.environment, seed=seed) as venv:
        venv.reset()
        for _ in range(BUDGET // venv.num_envs):
            res = venv.step(rng.integers(venv.single_action_space.n, size=venv.num_envs))
            returns += [ep.return_ for ep in res.episodes]
    return returns


@pytest.mark.slow
def test_jerk_beats_random_actions_on_the_maze(tmp_path: Path):
    resolved = Experiments().resolve("gradlab__keydoor/jerk", [f"train.timesteps={BUDGET}",
                                                               f"train.checkpoint_freq={BUDGET}"])
    spec = RunSpec.from_resolved(resolved, seed=0)
    run_learner(spec, tmp_path, watch_parent=False)
    metrics = [e.payload["metrics"] for e in Outbox(tmp_path / "outbox.sqlite").read(kind="metrics", limit=10_000)]
    check_names({n for m in metrics for n in m})
    last = [m for m in metrics if "train/algorithm/jerk/retained/count" in m][-1]
    random = _random_returns(spec, 0)
    jerk_mean = last["train/episode/return/shaped/mean"]  # the last 100 episodes
    assert jerk_mean > 2 * float(np.mean(random[-100:])), (jerk_mean, float(np.mean(random[-100:])))
    assert jerk_mean >= 0.08  # most late episodes replay a sequence that picks up the key
    assert last["train/algorithm/jerk/best/return_mean"] >= 0.1
    assert last["train/algorithm/jerk/exploit/probability"] == 1.0
