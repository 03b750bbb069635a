"""``gradlab benchmark run``: the whole lifecycle against SB3 alone, both sides in one run.

One side is the real command, ``gradlab train GOAL/RECIPE --seed N --json``, in a fresh process
as a user would type it, timed from start to the sealed (promoted) receipt. The other is SB3 alone:
plain ``PPO.learn`` (or ``A2C``, by the recipe's backend) with the recipe's hyperparameters and
policy network, trained for exactly the run's final step count, with the same seed, also in a
fresh process with its imports counted. The sides alternate (one gradlab run, then its bare SB3
run, then the next seed's gradlab run...; bare SB3 comes second because it trains the step count
the run reached), and the table reports ``gradlab / bare``, the lifecycle's wall time over SB3's
for the same training (issue 27's goal: <= 0.5; issue 14's was <= 0.6), with the seconds beside it.

The bare side reads only backend-neutral hyperparameter names (those SB3's constructor accepts:
``n_steps``, ``batch_size``, ``n_epochs``, ``gamma``, ``gae_lambda``, ``learning_rate``,
``clip_range``, ...), so a recipe on another PPO backend (``gradlab.ppo``) is compared with the SB3
PPO of the same hyperparameters. The environment: gymnasium's own vector env through SB3's
``make_vec_env`` for gymnasium goals; gradlab's vector env behind ``SB3VecEnv`` for goals only
gradlab provides (the bandit).

All runs share one temporary ``GRADLAB_HOME``, as a user's runs share theirs, and start from no
server: ``--prefect daemon`` (the default) is a fresh shell after installation, where the first
command that needs Prefect starts the local server and warm learner in the background
(``gradlab.runs.server``) and later ones attach; that first command is shown separately (marked
``first``: it pays the start) and is left out of the medians. ``--prefect ephemeral`` runs every
command with ``GRADLAB_DAEMON=0`` (Prefect's ephemeral server per command); ``--prefect server``
starts the server by hand first. Whatever was started is stopped at the end. The "learner" column
says whether the warm learner forked the run's learner, "flow" whether the warm flow
(``gradlab.cli.warm_flow``) ran the command's supervising flow.
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

PREFECT_MODES = ("daemon", "ephemeral", "server")

_BARE = r"""
import inspect, sys, time
t0 = time.perf_counter()
import torch
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.env_util import make_vec_env
from gradlab.contracts import Experiments
from gradlab.learn.schedules import schedule_fn
resolved = Experiments().resolve(sys.argv[1])
train = resolved.recipe.train
algorithm = {"ppo": PPO, "a2c": A2C}[train.backend.id.rsplit(".", 1)[-1]]
accepted = set(inspect.signature(algorithm.__init__).parameters) - {"self", "policy", "env", "seed", "device",
                                                                    "verbose", "policy_kwargs", "tensorboard_log"}
kwargs = {}
for key, value in dict(train.backend.config).items():
    if key not in accepted:
        continue
    if isinstance(value, dict):  # a schedule: SB3 takes callables for these, the start value elsewhere
        value = schedule_fn(value) if key in ("learning_rate", "clip_range", "clip_range_vf") else schedule_fn(value)(1.0)
    elif key in ("learning_rate", "clip_range") and value is not None:
        value = schedule_fn(value)
    kwargs[key] = value
torch.set_num_threads(train.torch_threads)
torch.distributions.Distribution.set_default_validate_args(False)
seed = int(sys.argv[3])
if resolved.environment.provider == "gymnasium":
    env = make_vec_env(resolved.environment.env_id, n_envs=resolved.environment.n_envs, seed=seed)
else:
    from gradlab.envs import make_vector_env
    from gradlab.envs.sb3 import SB3VecEnv
    env = SB3VecEnv(make_vector_env(resolved.environment, seed=seed))
pm = train.policy_model
policy_kwargs = {"net_arch": pm.net_arch, "activation_fn": {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[pm.activation]}
model = algorithm("MlpPolicy", env, policy_kwargs=policy_kwargs, seed=seed, device="cpu", verbose=0, **kwargs)
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
    #: Where the supervising flow ran: ``warm`` (forked by the warm flow, gradlab.cli.warm_flow) or
    #: ``in-process`` (in the command's own process, imports paid).
    flow: str = "-"
    #: How this command reached Prefect: ``started`` (it started the background server), ``daemon``
    #: (attached to it), ``server`` (started by hand), ``ephemeral``.
    prefect: str = "-"
    #: For the command that started the background server: that server's start-up, seconds, as the
    #: daemon measured it (``prefect/startup.json``, also in ``daemon.log``).
    server_startup_s: float | None = None

    @property
    def ratio(self) -> float | None:
        """gradlab wall seconds / bare SB3 seconds for the same steps (lower is better; goal <= 0.5)."""
        return self.wall_s / self.bare_s if self.bare_s and self.wall_s else None

    @property
    def first(self) -> bool:
        return self.prefect == "started"


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


def _one(ref: str, case: str, seed: int, home: Path, prefect: str) -> Row:
    env = {**os.environ, "GRADLAB_HOME": str(home), "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "GRADLAB_DAEMON": "0" if prefect == "ephemeral" else "1"}
    if prefect != "server":
        env.pop("PREFECT_API_URL", None)  # a fresh shell: no server named by hand
    flow_log = home / "zygote" / "flow" / "zygote.log"
    warm_flows = _forked_flows(flow_log)
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
    how = prefect
    if prefect == "daemon":
        how = "started" if "Prefect: started a local server" in out.stderr else "daemon"
        if "uses Prefect's ephemeral server instead" in out.stderr:
            how = "ephemeral (fallback)"
    final = receipt.get("final_step")
    bare = None
    if final:
        b = subprocess.run([sys.executable, "-c", _BARE, ref, str(final), str(seed)], capture_output=True, text=True,
                           env=env, timeout=1800)
        bare = float(b.stdout.strip().splitlines()[-1]) if b.returncode == 0 and b.stdout.strip() else None
    flow = "warm" if _forked_flows(flow_log) > warm_flows else "in-process"
    startup = None
    if how == "started":
        from gradlab.runs.server import measured_startup_s

        startup = measured_startup_s(_settings(home))
    return Row(case, seed, receipt.get("outcome", f"no receipt (exit {out.returncode})"), wall, first, final, bare,
               "zygote" if forked else "new process", flow, how, startup)


def _forked_flows(log: Path) -> int:
    """How many commands the warm flow has run (its log's ``forked flow`` lines)."""
    return log.read_text(errors="replace").count(" INFO: forked flow ") if log.is_file() else 0


def run(cases: tuple[str, ...], seeds: int, *, prefect: str = "daemon") -> list[Row]:
    """Run every case for ``seeds`` seeds (gradlab, then bare SB3, per seed) in one temporary home.

    With ``prefect="daemon"`` the very first command starts the background server; it is run as an
    extra round (seed 0 of the first case) so every case keeps ``seeds`` rounds after it.
    """
    from rich.progress import Progress

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gradlab-bench-run-") as tmp, Progress(transient=True) as bar:
        home = Path(tmp) / "home"
        plan = [(case, seed) for case in cases for seed in range(seeds)]
        if prefect == "daemon":
            plan.insert(0, plan[0])
        if prefect == "server":
            bar.console.print("starting a Prefect server and a warm learner by hand ...")
            _start_server(home)
        try:
            task = bar.add_task("gradlab train, then bare SB3", total=len(plan))
            for i, (case, seed) in enumerate(plan):
                if prefect != "ephemeral" and i > 0:
                    _wait_for_zygote(home)
                rows.append(_one(CASES[case], case, seed, home, prefect))
                bar.advance(task)
        finally:
            _stop_server(home)  # the background server too: nothing outlives the temporary home
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
    """Wait until the warm learner and the warm flow are ready, as they are for a user who does not
    start runs back to back within seconds (they import for ~5 s after the server starts)."""
    from gradlab.learn.zygote import flow_zygote_dir, ready_zygotes, starting_zygotes, zygote_dir

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(ready_zygotes(d) and not starting_zygotes(d) for d in (zygote_dir(home), flow_zygote_dir(home))):
            return
        time.sleep(0.2)


def summary(rows: list[Row]) -> dict[str, dict[str, float | int | None]]:
    """Per case, over the rows after the first command: median gradlab wall, median bare SB3,
    median, min and max of ``gradlab / bare``, and how many rows counted."""
    out: dict[str, dict[str, float | int | None]] = {}
    for case in dict.fromkeys(r.case for r in rows):
        counted = [r for r in rows if r.case == case and not r.first]
        ratios = [r.ratio for r in counted if r.ratio is not None]
        out[case] = {
            "rounds": len(counted),
            "wall_s_median": statistics.median([r.wall_s for r in counted]) if counted else None,
            "bare_s_median": statistics.median([r.bare_s for r in counted if r.bare_s]) if ratios else None,
            "ratio_median": statistics.median(ratios) if ratios else None,
            "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
        }
    return out


def first_command(rows: list[Row]) -> dict[str, float | bool] | None:
    """The fresh shell's first command against a warm one of its case (issue 27's goal: it costs at
    most the server's own start-up more): its wall seconds, the warm median, the server's start-up
    and whether ``wall - warm median <= start-up``. None without such a row or figures."""
    first = next((r for r in rows if r.first), None)
    warm = summary(rows).get(first.case, {}).get("wall_s_median") if first else None
    if first is None or warm is None or first.server_startup_s is None:
        return None
    over = first.wall_s - warm
    return {"wall_s": first.wall_s, "warm_wall_s_median": warm, "over_warm_s": over,
            "server_startup_s": first.server_startup_s, "met": over <= first.server_startup_s}


def render(rows: list[Row], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"rows": [{**asdict(r), "ratio": r.ratio, "first": r.first} for r in rows],
                          "summary": summary(rows), "first_command": first_command(rows)}))
        return
    from rich.console import Console
    from rich.table import Table

    def num(value: float | None, fmt: str = "{:.1f}") -> str:
        return fmt.format(value) if value is not None else "-"

    table = Table(title="gradlab train → sealed receipt vs bare SB3 for the same steps (seconds, fresh processes; "
                        "gradlab / bare: lower is better, goal <= 0.5)")
    for col in ("case", "seed", "outcome", "prefect", "learner", "flow", "wall s", "first step s", "final step",
                "bare SB3 s", "gradlab / bare"):
        table.add_column(col, justify="left" if col in ("case", "outcome", "prefect", "learner", "flow") else "right")
    for r in rows:
        table.add_row(r.case, str(r.seed), r.outcome, r.prefect + (" (not counted)" if r.first else ""), r.learner,
                      r.flow,
                      num(r.wall_s), num(r.first_step_s), f"{r.final_step:,}" if r.final_step else "-",
                      num(r.bare_s), num(r.ratio, "{:.2f}"))
    for case, agg in summary(rows).items():
        spread = (f"{agg['ratio_median']:.2f} ({agg['ratio_min']:.2f}–{agg['ratio_max']:.2f})"
                  if agg["ratio_median"] is not None else "-")
        table.add_row(f"[bold]{case}[/] median of {agg['rounds']}", "", "", "", "", "", num(agg["wall_s_median"]), "", "",
                      num(agg["bare_s_median"]), spread)
    console = Console(width=None if sys.stdout.isatty() else 220)
    console.print(table)
    if (fc := first_command(rows)) is not None:
        console.print(f"first command of a fresh shell: {fc['wall_s']:.1f} s, {fc['over_warm_s']:.1f} s over the warm "
                      f"median ({fc['warm_wall_s_median']:.1f} s); the server's own start-up (daemon.log): "
                      f"{fc['server_startup_s']:.1f} s; goal (at most the start-up over a warm command): "
                      f"{'met' if fc['met'] else 'not met'}")


def main(cases: tuple[str, ...], seeds: int, prefect: str, as_json: bool) -> None:
    render(run(cases, seeds, prefect=prefect), as_json)
