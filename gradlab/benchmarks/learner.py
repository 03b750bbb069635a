"""``gradlab benchmark learner``: gradlab's learner against plain stable-baselines3 ``PPO.learn``.

Both sides train PPO with the same hyperparameters (rl-zoo3's), lanes, torch threads and
``torch.distributions`` argument validation (off, as in the learner), end to end (env and model
construction included). gradlab's side runs the whole learner: gradlab's vector env with
the task program, the outbox (a metrics event per rollout), checkpoints and the stop check. The
ratio ``gradlab / plain`` is the learner's overhead (goal: >= 0.95).

Cases: CartPole-v1 (8 lanes, MLP, 1 torch thread) and Breakout (8 lanes, Nature CNN, 2 torch
threads). Plain SB3 uses ``make_vec_env`` for CartPole and, for Breakout, ``PPO.learn`` over
gradlab's own ALE vector env (SB3's ``AtariWrapper`` needs OpenCV, not installed here).
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass
class Row:
    case: str
    steps: int
    gradlab_steps_per_s: float
    plain_steps_per_s: float

    @property
    def ratio(self) -> float:
        return self.gradlab_steps_per_s / self.plain_steps_per_s if self.plain_steps_per_s else float("nan")


def _gradlab(ref: str, steps: int, threads: int) -> float:
    from gradlab.contracts.experiments import Experiments
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.learn.learner import run_learner

    resolved = Experiments().resolve(ref, [f"train.timesteps={steps}", f"train.torch_threads={threads}",
                                           "train.device=cpu"])
    spec = RunSpec.from_resolved(resolved, seed=0)
    with tempfile.TemporaryDirectory(prefix="gradlab-bench-") as tmp:
        t0 = time.perf_counter()
        result = run_learner(spec, Path(tmp) / "run")
        seconds = time.perf_counter() - t0
    return result.final_step / seconds


def _plain_cartpole(steps: int) -> float:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    from gradlab.learn.schedules import LinearFn

    torch.set_num_threads(1)
    torch.distributions.Distribution.set_default_validate_args(False)  # the learner's setting, for a fair ratio
    t0 = time.perf_counter()
    env = make_vec_env("CartPole-v1", n_envs=8, seed=0)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                learning_rate=LinearFn(1e-3, 0.0), clip_range=LinearFn(0.2, 0.0), seed=0, device="cpu", verbose=0)
    model.learn(steps)
    seconds = time.perf_counter() - t0
    env.close()
    return model.num_timesteps / seconds


def _plain_breakout(steps: int) -> float:
    """Plain ``PPO.learn`` over the same ALE vector env gradlab trains on (SB3's ``AtariWrapper`` needs
    OpenCV, which is not installed), so the ratio isolates the learner's own overhead."""
    import torch
    from stable_baselines3 import PPO

    from gradlab.contracts.experiments import Experiments
    from gradlab.learn.schedules import LinearFn

    resolved = Experiments().resolve("Breakout-Atari2600-v0/ppo")
    torch.set_num_threads(2)
    torch.distributions.Distribution.set_default_validate_args(False)
    t0 = time.perf_counter()
    from gradlab.envs import make_vector_env
    from gradlab.envs.sb3 import SB3VecEnv

    env = SB3VecEnv(make_vector_env(resolved.environment, seed=0))
    model = PPO("CnnPolicy", env, n_steps=128, batch_size=256, n_epochs=4, learning_rate=LinearFn(2.5e-4, 0.0),
                clip_range=LinearFn(0.1, 0.0), ent_coef=0.01, vf_coef=0.5, device="cpu", verbose=0)
    model.learn(steps)
    seconds = time.perf_counter() - t0
    env.close()
    return model.num_timesteps / seconds


def run(cartpole_steps: int = 65536, breakout_steps: int = 8192, cases: tuple[str, ...] = ("cartpole", "breakout")) -> list[Row]:
    """Measure every case; returns one row per case."""
    rows = []
    if "cartpole" in cases:
        plain = _plain_cartpole(cartpole_steps)
        ours = _gradlab("CartPole-v1/ppo", cartpole_steps, 1)
        rows.append(Row("sb3.ppo CartPole-v1 (8 lanes, MLP, 1 thread)", cartpole_steps, ours, plain))
    if "breakout" in cases:
        plain = _plain_breakout(breakout_steps)
        ours = _gradlab("Breakout-Atari2600-v0/ppo", breakout_steps, 2)
        rows.append(Row("sb3.ppo Breakout (8 lanes, Nature CNN, 2 threads)", breakout_steps, ours, plain))
    return rows


def render(rows: list[Row], as_json: bool) -> None:
    if as_json:
        print(json.dumps([{**asdict(r), "ratio": r.ratio} for r in rows]))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="gradlab learner vs plain SB3 PPO.learn (steps/s, end to end)")
    for col in ("case", "steps", "gradlab", "plain SB3", "ratio"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for r in rows:
        table.add_row(r.case, str(r.steps), f"{r.gradlab_steps_per_s:,.0f}", f"{r.plain_steps_per_s:,.0f}", f"{r.ratio:.3f}")
    Console().print(table)


def main(**kwargs: Any) -> None:
    as_json = kwargs.pop("as_json", False)
    render(run(**kwargs), as_json)
