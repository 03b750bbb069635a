"""``gradlab benchmark learner``: gradlab's learner against plain stable-baselines3 ``PPO.learn``.

What is compared: the same PPO training, once through gradlab's learner (:func:`run_learner`:
outbox with a ``metrics`` event per rollout, the metric-name check, early-stop monitor, stop
checks, periodic and final checkpoints) and once as plain ``PPO.learn``. Everything else is the
same on both sides, so the ratio ``gradlab / plain`` is the learner's own overhead (issue 4's
goal: >= 0.95, "the outbox, metrics and checkpointing cost under 5%"):

* the same vector env: gradlab's :func:`make_vector_env` (task program, same-step autoreset)
  behind :class:`SB3VecEnv` (SB3's ``AtariWrapper`` needs OpenCV, not installed here, and SB3's
  ``DummyVecEnv`` + ``Monitor`` is a different env stack, which would measure envs, not the learner);
* the same hyperparameters, read from the recipe (rl-zoo3's), the same policy network, the same
  seeds (``set_random_seed(seed)`` before the model is built, lane seeds ``seed * 1024 + lane``),
  so both sides take the same actions and end with the same parameters
  (``params_sha256`` in each measurement shows it);
* the same torch threads, ``torch.distributions`` argument validation off, device ``cpu``;
* the same construction counted: each measurement runs in a fresh Python process whose imports
  (torch, SB3, torch's lazily imported ``torch._dynamo``, ale-py, gradlab) happen before the clock
  starts; the clock covers env and model construction, training and closing on both sides.

Runs alternate (plain, gradlab, then gradlab, plain, ...) for ``rounds`` rounds and the fastest
run of each side is reported, because the 2-core machine is shared. Each measurement also
reports where the time went: ``rollout`` and ``update`` seconds (SB3's two phases, from
``train/throughput/*`` on gradlab's side and a rollout callback on the plain side) and ``other``
(construction, the learner's bookkeeping and checkpoints, closing), plus the process CPU seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Case:
    """One benchmark case: an experiment ref and its torch threads."""

    ref: str
    threads: int
    label: str


CASES: dict[str, Case] = {
    "cartpole": Case("CartPole-v1/ppo-sb3", 1, "sb3.ppo CartPole-v1 (8 lanes, MLP, 1 thread)"),
    "breakout": Case("Breakout-Atari2600-v0/ppo-sb3", 2, "sb3.ppo Breakout (8 lanes, Nature CNN, 2 threads)"),
}


@dataclass
class Measurement:
    """One timed run of one side, in its own process.

    Attributes:
        side: ``gradlab`` or ``plain``.
        steps: env steps trained (``num_timesteps`` at the end).
        seconds: wall seconds from before env construction to after closing.
        cpu_seconds: process CPU seconds (user + system, every thread) over the same span.
        rollout_s, update_s: wall seconds in SB3's ``collect_rollouts`` and ``train``, summed.
        other_s: ``seconds - rollout_s - update_s`` (construction, bookkeeping, checkpoints, close).
        detail: side-specific parts of ``other_s`` (gradlab: ``bookkeeping_s``, ``checkpoint_s``).
        params_sha256: sha256 over the final policy parameters (sorted names, float32 bytes).
    """

    side: str
    steps: int
    seconds: float
    cpu_seconds: float
    rollout_s: float
    update_s: float
    other_s: float
    params_sha256: str
    detail: dict[str, float] = field(default_factory=dict)

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Row:
    case: str
    steps: int
    rounds: int
    gradlab_steps_per_s: float
    plain_steps_per_s: float
    gradlab: Measurement
    plain: Measurement
    same_parameters: bool

    @property
    def ratio(self) -> float:
        return self.gradlab_steps_per_s / self.plain_steps_per_s if self.plain_steps_per_s else float("nan")

    @property
    def extra_share(self) -> float:
        """The learner's time outside SB3's two phases beyond plain's (construction differences, bookkeeping,
        checkpoints) as a share of plain's total: ``(gradlab.other_s - plain.other_s) / plain.seconds``. Less
        sensitive to load than ``ratio``: the two phases run the same computation on both sides (same
        parameters at the end), so their difference under load is mostly the machine's."""
        return (self.gradlab.other_s - self.plain.other_s) / self.plain.seconds if self.plain.seconds else float("nan")


def _spec(case: Case, steps: int, backend: str | None = None, precision: str = "fp32", seed: int = 0) -> Any:
    """The case's run spec; ``backend`` switches ``train.backend.id`` (same hyperparameters), and for
    ``gradlab.ppo`` sets its ``threads`` to the case's torch threads and its ``precision``."""
    from gradlab.contracts.experiments import Experiments
    from gradlab.contracts.run_spec import RunSpec

    overrides = [f"train.timesteps={steps}", f"train.torch_threads={case.threads}", "train.device=cpu"]
    if backend is not None:
        overrides.append(f"train.backend.id={backend}")
    if backend == "gradlab.ppo":
        overrides += [f"train.backend.config.threads={case.threads}", f"train.backend.config.precision={precision}"]
    resolved = Experiments().resolve(case.ref, overrides)
    return RunSpec.from_resolved(resolved, seed=seed)


def _warm_up(spec: Any) -> None:
    """Import, on both sides alike, everything either side imports lazily (not part of training)."""
    import stable_baselines3  # noqa: F401
    import torch
    from stable_baselines3 import PPO  # noqa: F401

    import gradlab.checkpoints.bundle  # noqa: F401
    import gradlab.checkpoints.policy  # noqa: F401
    import gradlab.envs.sb3  # noqa: F401
    import gradlab.learn.learner  # noqa: F401
    import gradlab.learn.ppo  # noqa: F401
    import gradlab.learn.sb3  # noqa: F401
    from gradlab.envs.registry import get_provider

    get_provider(spec.environment.provider)
    if spec.environment.provider == "ale":
        import ale_py.vector_env  # noqa: F401
    # The first optimizer built in a process imports torch._dynamo (~1.7 s here).
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])


def _params_sha256(state: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().cpu().float().numpy().tobytes())
    return h.hexdigest()


def _cpu_seconds() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _run_gradlab(spec: Any) -> Measurement:
    from safetensors.torch import load_file

    from gradlab.checkpoints.manifest import WEIGHTS_FILE
    from gradlab.learn.learner import OUTBOX_FILE, run_learner
    from gradlab.outbox import Outbox

    with tempfile.TemporaryDirectory(prefix="gradlab-bench-") as tmp:
        run_dir = Path(tmp) / "run"
        c0 = _cpu_seconds()
        t0 = time.perf_counter()
        result = run_learner(spec, run_dir, watch_parent=False)
        seconds = time.perf_counter() - t0
        cpu = _cpu_seconds() - c0
        sums = {"rollout": 0.0, "update": 0.0, "bookkeeping": 0.0, "save": 0.0}
        keys = {"train/throughput/rollout/seconds": "rollout", "train/throughput/update/seconds": "update",
                "train/throughput/bookkeeping/seconds": "bookkeeping", "train/artifact/save/seconds": "save"}
        outbox = Outbox(run_dir / OUTBOX_FILE)
        try:
            for event in outbox.read(0, limit=1_000_000):
                for key, value in event.payload.get("metrics", {}).items():
                    if key in keys:
                        sums[keys[key]] += float(value)
        finally:
            outbox.close()
        tensors = load_file(str(Path(result.checkpoints[-1]) / WEIGHTS_FILE))
        sha = _params_sha256({k: v for k, v in tensors.items() if not k.startswith("gradlab.")})
    return Measurement("gradlab", result.final_step, seconds, cpu, sums["rollout"], sums["update"],
                       seconds - sums["rollout"] - sums["update"], sha,
                       {"bookkeeping_s": sums["bookkeeping"], "checkpoint_s": sums["save"]})


def _run_plain(spec: Any) -> Measurement:
    """Plain ``PPO.learn`` with the recipe's settings over gradlab's vector env."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.torch_layers import FlattenExtractor, NatureCNN
    from stable_baselines3.common.utils import set_random_seed

    from gradlab.envs import make_vector_env
    from gradlab.envs.sb3 import SB3VecEnv
    from gradlab.learn.schedules import schedule_fn

    train = spec.recipe.train
    cfg = train.backend.typed_config()
    pm = train.policy_model
    phases = {"rollout": 0.0, "update": 0.0}

    class Phases(BaseCallback):
        """Rollout seconds (start to end of ``collect_rollouts``) and update seconds (the rest of ``learn``)."""

        t_start = 0.0
        t_end: float | None = None

        def _on_rollout_start(self) -> None:
            self.t_start = time.perf_counter()
            if self.t_end is not None:
                phases["update"] += self.t_start - self.t_end

        def _on_rollout_end(self) -> None:
            self.t_end = time.perf_counter()
            phases["rollout"] += self.t_end - self.t_start

        def _on_step(self) -> bool:
            return True

    c0 = _cpu_seconds()
    t0 = time.perf_counter()
    torch.set_num_threads(train.torch_threads)
    torch.distributions.Distribution.set_default_validate_args(False)
    env = SB3VecEnv(make_vector_env(spec.environment, seed=spec.seed))
    image = len(env.observation_space.shape or ()) == 3
    policy_kwargs: dict[str, Any] = dict(
        net_arch=pm.net_arch, activation_fn={"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[pm.activation],
        ortho_init=pm.ortho_init, share_features_extractor=pm.share_features_extractor,
        features_extractor_class=NatureCNN if image else FlattenExtractor,
    )
    if image:
        policy_kwargs["features_extractor_kwargs"] = {"features_dim": pm.features_dim}
    set_random_seed(spec.seed)
    model = PPO("CnnPolicy" if image else "MlpPolicy", env, learning_rate=schedule_fn(cfg.learning_rate),
                n_steps=cfg.n_steps, batch_size=cfg.batch_size, n_epochs=cfg.n_epochs, gamma=cfg.gamma,
                gae_lambda=cfg.gae_lambda, clip_range=schedule_fn(cfg.clip_range), clip_range_vf=cfg.clip_range_vf,
                normalize_advantage=cfg.normalize_advantage, ent_coef=schedule_fn(cfg.ent_coef)(1.0),
                vf_coef=cfg.vf_coef, max_grad_norm=cfg.max_grad_norm, target_kl=cfg.target_kl,
                policy_kwargs=policy_kwargs, device="cpu", verbose=0)
    callback = Phases()
    model.learn(train.timesteps, callback=callback)
    t_learned = time.perf_counter()
    env.close()
    seconds = time.perf_counter() - t0
    cpu = _cpu_seconds() - c0
    if callback.t_end is not None:
        phases["update"] += t_learned - callback.t_end
    return Measurement("plain", int(model.num_timesteps), seconds, cpu, phases["rollout"], phases["update"],
                       seconds - phases["rollout"] - phases["update"], _params_sha256(model.policy.state_dict()))


BACKEND_SIDES: dict[str, tuple[str, str]] = {
    "sb3.ppo": ("sb3.ppo", "fp32"), "gradlab.ppo": ("gradlab.ppo", "fp32"), "gradlab.ppo-bf16": ("gradlab.ppo", "bf16"),
}
"""Sides of ``--backend`` runs: the learner with that backend (and precision) on the case's recipe."""

#: Issue 27's speed goals: the side's median steps/s over sb3.ppo's, by case (docs/BENCHMARKS.md).
SPEED_GOALS: dict[tuple[str, str], float] = {
    ("cartpole", "gradlab.ppo"): 2.5, ("breakout", "gradlab.ppo"): 1.8, ("breakout", "gradlab.ppo-bf16"): 2.5,
}


def measure(case: str, side: str, steps: int) -> Measurement:
    """One timed run of ``side`` in this process (imports warmed first): ``gradlab`` (sb3.ppo through the
    learner, the recipe as checked in), ``plain`` (SB3's ``PPO.learn``), or a :data:`BACKEND_SIDES` key
    (the learner with that backend).

    Raises:
        KeyError: unknown case or side.
    """
    if side in BACKEND_SIDES:
        backend, precision = BACKEND_SIDES[side]
        spec = _spec(CASES[case], steps, backend=backend, precision=precision)
        _warm_up(spec)
        m = _run_gradlab(spec)
        m.side = side
        return m
    spec = _spec(CASES[case], steps)
    _warm_up(spec)
    return {"gradlab": _run_gradlab, "plain": _run_plain}[side](spec)


def _measure_in_subprocess(case: str, side: str, steps: int) -> Measurement:
    cmd = [sys.executable, "-m", "gradlab.benchmarks.learner", case, side, str(steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return Measurement(**json.loads(proc.stdout.strip().splitlines()[-1]))


def run(cartpole_steps: int = 65536, breakout_steps: int = 8192, cases: tuple[str, ...] = ("cartpole", "breakout"),
        rounds: int = 3) -> list[Row]:
    """Measure every case: ``rounds`` alternating runs per side, each in a fresh process; the fastest counts."""
    rows = []
    for name in cases:
        steps = {"cartpole": cartpole_steps, "breakout": breakout_steps}[name]
        runs: dict[str, list[Measurement]] = {"gradlab": [], "plain": []}
        for i in range(rounds):
            for side in (("plain", "gradlab") if i % 2 == 0 else ("gradlab", "plain")):
                runs[side].append(_measure_in_subprocess(name, side, steps))
        best = {side: min(ms, key=lambda m: m.seconds) for side, ms in runs.items()}
        rows.append(Row(CASES[name].label, steps, rounds, best["gradlab"].steps_per_s, best["plain"].steps_per_s,
                        best["gradlab"], best["plain"], best["gradlab"].params_sha256 == best["plain"].params_sha256))
    return rows


@dataclass
class BackendRow:
    """Every round of every side of one case in a ``--backend`` run (alternating order)."""

    case: str
    steps: int
    rounds: int
    runs: dict[str, list[Measurement]]
    load: tuple[float, float]

    def best(self, side: str) -> float:
        return max(m.steps_per_s for m in self.runs[side])

    def median(self, side: str) -> float:
        import statistics

        return statistics.median(m.steps_per_s for m in self.runs[side])

    def per_cpu_s(self, side: str) -> float:
        """Best env steps per process CPU second (less sensitive to a shared machine's load than wall time)."""
        return max(m.steps / m.cpu_seconds for m in self.runs[side] if m.cpu_seconds > 0)


def run_backend(backend: str, cases: tuple[str, ...], steps: dict[str, int], rounds: int,
                progress: Any = None) -> list[BackendRow]:
    """``backend`` against ``sb3.ppo`` through the same learner, per case: ``rounds`` rounds whose side
    order alternates (and, on Breakout, ``backend`` in bf16 too), each run in a fresh process.

    Raises:
        KeyError: a backend other than ``gradlab.ppo``, or an unknown case.
    """
    if backend != "gradlab.ppo":
        raise KeyError(f"--backend: expected gradlab.ppo, found {backend!r}")
    rows = []
    for name in cases:
        sides = ["sb3.ppo", "gradlab.ppo"] + (["gradlab.ppo-bf16"] if name == "breakout" else [])
        runs: dict[str, list[Measurement]] = {side: [] for side in sides}
        load0 = os.getloadavg()[0]
        for i in range(rounds):
            for side in (sides if i % 2 == 0 else sides[::-1]):
                runs[side].append(_measure_in_subprocess(name, side, steps[name]))
                if progress is not None:
                    progress()
        rows.append(BackendRow(CASES[name].label.replace("sb3.ppo ", ""), steps[name], rounds, runs,
                               (load0, os.getloadavg()[0])))
    return rows


def render_backend(rows: list[BackendRow], as_json: bool) -> None:
    if as_json:
        print(json.dumps([{**asdict(r), "best": {s: r.best(s) for s in r.runs},
                           "median": {s: r.median(s) for s in r.runs},
                           "per_cpu_s": {s: r.per_cpu_s(s) for s in r.runs}} for r in rows]))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 260)
    table = Table(title="gradlab.ppo vs sb3.ppo through the same learner (steps/s over every round, fresh process each)")
    for col in ("case", "side", "steps", "rounds", "best steps/s", "median steps/s", "spread (min-max)", "ratio best",
                "ratio median", "goal (median)", "steps/CPU-s", "ratio CPU", "rollout s*", "update s*", "load 1-min"):
        table.add_column(col, justify="left" if col in ("case", "side") else "right")
    for r in rows:
        for side, ms in r.runs.items():
            fastest = min(ms, key=lambda m: m.seconds)
            ratio = r.median(side) / r.median("sb3.ppo")
            goal = next((g for (case, s), g in SPEED_GOALS.items()
                         if s == side and r.case == CASES[case].label.replace("sb3.ppo ", "")), None)
            table.add_row(r.case, side, str(r.steps), str(len(ms)), f"{r.best(side):,.0f}", f"{r.median(side):,.0f}",
                          f"{min(m.steps_per_s for m in ms):,.0f}-{max(m.steps_per_s for m in ms):,.0f}",
                          f"{r.best(side) / r.best('sb3.ppo'):.2f}x", f"{ratio:.2f}x",
                          "" if goal is None else f">= {goal}x: {'met' if ratio >= goal else 'not met'}",
                          f"{r.per_cpu_s(side):,.0f}", f"{r.per_cpu_s(side) / r.per_cpu_s('sb3.ppo'):.2f}x",
                          f"{fastest.rollout_s:.2f}", f"{fastest.update_s:.2f}", f"{r.load[0]:.1f} -> {r.load[1]:.1f}")
    console.print(table)
    console.print("* of the side's fastest round. load 1-min: the machine's 1-minute load average at the case's "
                  "start and end (ratios of one run on a busy machine are not results).")


def main_backend(backend: str, cases: tuple[str, ...], steps: dict[str, int], rounds: int, as_json: bool) -> None:
    from rich.progress import Progress

    total = sum(rounds * (3 if c == "breakout" else 2) for c in cases)
    with Progress(transient=True, disable=as_json) as bar:
        task = bar.add_task(f"{backend} vs sb3.ppo", total=total)
        rows = run_backend(backend, cases, steps, rounds, progress=lambda: bar.advance(task))
    render_backend(rows, as_json)


def render(rows: list[Row], as_json: bool) -> None:
    if as_json:
        print(json.dumps([{**asdict(r), "ratio": r.ratio, "extra_share": r.extra_share} for r in rows]))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 200)  # piped: keep the table whole
    table = Table(title="gradlab learner vs plain SB3 PPO.learn (steps/s, fastest of the rounds, same vector env)")
    for col in ("case", "steps", "rounds", "gradlab", "plain SB3", "ratio", "extra outside phases", "same params"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for r in rows:
        table.add_row(r.case, str(r.steps), str(r.rounds), f"{r.gradlab_steps_per_s:,.0f}",
                      f"{r.plain_steps_per_s:,.0f}", f"{r.ratio:.3f}", f"{r.extra_share:+.1%}",
                      "yes" if r.same_parameters else "no")
    console.print(table)
    phases = Table(title="where the time went in those runs (seconds)")
    for col in ("case", "side", "total", "rollout", "update", "other", "of which", "CPU s"):
        phases.add_column(col, justify="left" if col in ("case", "side", "of which") else "right")
    for r in rows:
        for m in (r.gradlab, r.plain):
            detail = ", ".join(f"{k} {v:.3f}" for k, v in m.detail.items())
            phases.add_row(r.case.split(" (")[0], m.side, f"{m.seconds:.2f}", f"{m.rollout_s:.2f}", f"{m.update_s:.2f}",
                           f"{m.other_s:.2f}", detail, f"{m.cpu_seconds:.1f}")
    console.print(phases)


def main(**kwargs: Any) -> None:
    as_json = kwargs.pop("as_json", False)
    render(run(**kwargs), as_json)


if __name__ == "__main__":  # one measurement, as a JSON line: python -m gradlab.benchmarks.learner CASE SIDE STEPS
    import logging

    logging.basicConfig(level=logging.WARNING)
    _case, _side, _steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print(json.dumps(asdict(measure(_case, _side, _steps))))
