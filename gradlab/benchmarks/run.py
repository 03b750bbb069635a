"""``gradlab benchmark run``: wall seconds from ``gradlab train`` to a sealed receipt.

Each case runs the real command in a fresh process, as a user would, and reads from its outbox
when the learner took its first env step (the first rollout's metrics event, minus the rollout's
own duration) and from its receipt the final step. Next to it, in the same run, the bare learner:
plain stable-baselines3 ``PPO.learn`` with the recipe's hyperparameters for the same number of
steps, also in a fresh process, imports included. The ratio ``bare / gradlab`` is the share of the
wall time spent training; the rest is orchestration (Prefect, publication, evaluation, receipts).

All runs share one temporary ``GRADLAB_HOME``, as a user's runs share theirs. Prefect's API: with
``--server`` a ``gradlab server`` is started there first (with its warm learner zygote, waited for
until ready; both stopped at the end), as a user who ran ``gradlab server start`` has; without it
each command pays Prefect's ephemeral server start (12–20 s here) and starts a fresh learner
process. The "learner" column says which it was.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

CASES = {
    "cartpole-acceptance": "CartPole-v1/ppo",
    "bandit-acceptance": "gradlab__bandit/ppo",
}

_BARE = r"""
import sys, time
t0 = time.perf_counter()
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from gradlab.contracts import Experiments
from gradlab.learn.schedules import schedule_fn
resolved = Experiments().resolve(sys.argv[1])
cfg = resolved.recipe.train.backend.typed_config()
torch.set_num_threads(resolved.recipe.train.torch_threads)
torch.distributions.Distribution.set_default_validate_args(False)
env_id = resolved.environment.env_id
if resolved.environment.provider == "gymnasium":
    env = make_vec_env(env_id, n_envs=resolved.environment.n_envs, seed=int(sys.argv[3]))
else:
    from gradlab.envs import make_vector_env
    from gradlab.envs.sb3 import SB3VecEnv
    env = SB3VecEnv(make_vector_env(resolved.environment, seed=int(sys.argv[3])))
arch = resolved.recipe.train.policy_model.net_arch
model = PPO("MlpPolicy", env, n_steps=cfg.n_steps, batch_size=cfg.batch_size, n_epochs=cfg.n_epochs,
            gamma=cfg.gamma, gae_lambda=cfg.gae_lambda,
            ent_coef=cfg.ent_coef if isinstance(cfg.ent_coef, float) else cfg.ent_coef.initial,
            learning_rate=schedule_fn(cfg.learning_rate), clip_range=schedule_fn(cfg.clip_range),
            policy_kwargs={"net_arch": arch}, seed=int(sys.argv[3]), device="cpu", verbose=0)
model.learn(int(sys.argv[2]))
print(time.perf_counter() - t0)
"""


@dataclass
class Row:
    case: str
    seed: int
    outcome: str
    wall_s: float
    first_step_s: float | None
    final_step: int | None
    bare_s: float | None
    learner: str = "-"

    @property
    def train_share(self) -> float | None:
        return self.bare_s / self.wall_s if self.bare_s and self.wall_s else None


def _first_step_s(run_dir: Path, started_at: float) -> float | None:
    """Seconds from command start to the learner's first env step (first rollout end minus its duration)."""
    from gradlab.outbox import Outbox

    try:
        outbox = Outbox(run_dir / "outbox.sqlite", readonly=True)
    except Exception:  # noqa: BLE001 - reported as unknown
        return None
    for event in outbox.read(0, 100):
        if event.kind == "metrics":
            at = datetime.fromisoformat(event.created_at).timestamp()
            rollout_s = float(event.payload.get("metrics", {}).get("train/throughput/rollout/seconds", 0.0))
            return at - rollout_s - started_at
    return None


def _one(ref: str, case: str, seed: int, home: Path) -> Row:
    env = {**os.environ, "GRADLAB_HOME": str(home), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    started_at = time.time()
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "gradlab.cli.app", "train", ref, "--seed", str(seed), "--json"],
                         capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - t0
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    try:
        receipt = json.loads(lines[-1]) if lines else {}
    except ValueError:
        receipt = {}
    run_id = receipt.get("run_id")
    first = _first_step_s(home / "runs" / run_id, started_at) if run_id else None
    zygote_log = home / "zygote" / "zygote.log"
    forked = run_id is not None and zygote_log.is_file() and f"/{run_id}/" in zygote_log.read_text(errors="replace")
    final = receipt.get("final_step")
    bare = None
    if final:
        b = subprocess.run([sys.executable, "-c", _BARE, ref, str(final), str(seed)], capture_output=True, text=True,
                           env=env, timeout=1800)
        bare = float(b.stdout.strip().splitlines()[-1]) if b.returncode == 0 and b.stdout.strip() else None
    return Row(case, seed, receipt.get("outcome", f"no receipt (exit {out.returncode})"), wall, first, final, bare,
               "zygote" if forked else "new process")


def run(cases: tuple[str, ...], seeds: int, *, server: bool = False) -> list[Row]:
    from rich.progress import Progress

    rows = []
    with tempfile.TemporaryDirectory(prefix="gradlab-bench-run-") as tmp, Progress(transient=True) as bar:
        home = Path(tmp) / "home"
        if server:
            bar.console.print("starting a Prefect server and a warm learner zygote ...")
            _start_server(home)
        try:
            task = bar.add_task("runs", total=len(cases) * seeds)
            for case in cases:
                for seed in range(seeds):
                    if server:
                        _wait_for_zygote(home)
                    rows.append(_one(CASES[case], case, seed, home))
                    bar.advance(task)
        finally:
            if server:
                _stop_server(home)
    return rows


def _settings(home: Path):
    from gradlab.settings import load_settings

    os.environ["GRADLAB_HOME"] = str(home)
    return load_settings()


def _start_server(home: Path) -> None:
    from gradlab.runs.server import start_server

    state = start_server(_settings(home))
    os.environ["PREFECT_API_URL"] = state.api_url


def _stop_server(home: Path) -> None:
    from gradlab.runs.server import stop_server

    stop_server(_settings(home))
    os.environ.pop("PREFECT_API_URL", None)


def _wait_for_zygote(home: Path, timeout_s: float = 120.0) -> None:
    """Wait until the zygote (restarted after each run by ``gradlab train``) is ready, as it is for a
    user who does not start runs back to back within seconds."""
    from gradlab.learn.zygote import ready_zygotes, starting_zygotes, zygote_dir

    directory = zygote_dir(home)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready_zygotes(directory) and not starting_zygotes(directory):
            return
        time.sleep(0.2)


def render(rows: list[Row], as_json: bool) -> None:
    if as_json:
        print(json.dumps([{**asdict(r), "train_share": r.train_share} for r in rows]))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="gradlab train → sealed receipt vs the bare learner (seconds, fresh processes)")
    for col in ("case", "seed", "outcome", "learner", "wall s", "first step s", "final step", "bare SB3 s",
                "bare/wall"):
        table.add_column(col, justify="left" if col in ("case", "outcome", "learner") else "right")
    for r in rows:
        table.add_row(r.case, str(r.seed), r.outcome, r.learner, f"{r.wall_s:.1f}",
                      f"{r.first_step_s:.1f}" if r.first_step_s is not None else "-", str(r.final_step),
                      f"{r.bare_s:.1f}" if r.bare_s else "-", f"{r.train_share:.2f}" if r.train_share else "-")
    for case in sorted({r.case for r in rows}):
        walls = [r.wall_s for r in rows if r.case == case]
        firsts = [r.first_step_s for r in rows if r.case == case and r.first_step_s is not None]
        table.add_row(f"{case} median (min–max)", "", "", "", f"{statistics.median(walls):.1f}",
                      f"{statistics.median(firsts):.1f}" if firsts else "", "", "",
                      f"{min(walls):.1f}–{max(walls):.1f}")
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def main(cases: tuple[str, ...], seeds: int, start_server: bool, as_json: bool) -> None:
    render(run(cases, seeds, server=start_server), as_json)
