"""``gradlab benchmark ...``: speed is measured by these commands, never by timed tests.

Each sub-command lives in ``gradlab/benchmarks/<name>.py`` and is registered here.
"""

from __future__ import annotations

from pathlib import Path

import typer


def parse_seeds(seeds: list[str]) -> list[int]:
    """``--seeds 0,1,2`` (or repeated ``--seeds``) as integers, each once, each a run seed.

    Raises:
        typer.BadParameter: an empty item, a non-integer, a repeated seed, or one outside 0..MAX_RUN_SEED (exit 2).
    """
    from gradlab.contracts.seeds import MAX_RUN_SEED

    items = [x.strip() for text in seeds for x in text.split(",")]
    found = ",".join(seeds)
    if "" in items:
        raise typer.BadParameter(f"expected integers (0,1,2), found an empty item in {found!r}", param_hint="--seeds")
    try:
        seed_list = [int(x) for x in items]
    except ValueError:
        raise typer.BadParameter(f"expected integers (0,1,2), found {found!r}", param_hint="--seeds") from None
    outside = [s for s in seed_list if not 0 <= s <= MAX_RUN_SEED]
    if outside:
        raise typer.BadParameter(f"expected seeds in 0..{MAX_RUN_SEED}, found {outside[0]}", param_hint="--seeds")
    repeated = sorted({s for s in seed_list if seed_list.count(s) > 1})
    if repeated:
        raise typer.BadParameter(f"expected each seed once, found {', '.join(map(str, repeated))} repeated in "
                                 f"{found!r}", param_hint="--seeds")
    return seed_list


benchmark_app = typer.Typer(help="Measure speed against the bare libraries (tables of ratios) and learning against "
                            "stable-baselines3 (steps to acceptance, curves).",
                            no_args_is_help=True)


@benchmark_app.command("learner")
def learner(
    cartpole_steps: int = typer.Option(65536, help="Env steps per CartPole run."),
    breakout_steps: int = typer.Option(8192, help="Env steps per Breakout run."),
    case: list[str] = typer.Option(["cartpole", "breakout"], help="Cases to run: cartpole, breakout."),
    rounds: int = typer.Option(3, min=1, help="Alternating runs per side, each in a fresh process; the fastest counts."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as one JSON document."),
    backend: str = typer.Option(None, help="gradlab.ppo: that backend vs sb3.ppo through the same learner, "
                                           "steps/s per side and their ratios (goals: CartPole >= 2.5x, Breakout "
                                           "fp32 >= 1.8x, bf16 >= 2.5x; docs/BENCHMARKS.md)."),
) -> None:
    """sb3.ppo through gradlab's learner vs plain SB3 PPO.learn (steps/s and the ratio, goal >= 0.95);
    with --backend gradlab.ppo, that backend vs sb3.ppo through the same learner."""
    from gradlab.benchmarks.learner import CASES

    unknown = [c for c in case if c not in CASES]
    if unknown:
        raise typer.BadParameter(f"expected {' or '.join(CASES)}, found {unknown[0]!r}", param_hint="--case")
    if backend is not None:
        from gradlab.benchmarks.learner import main_backend

        if backend != "gradlab.ppo":
            raise typer.BadParameter(f"expected gradlab.ppo, found {backend!r}", param_hint="--backend")
        main_backend(backend, tuple(case), {"cartpole": cartpole_steps, "breakout": breakout_steps}, rounds, as_json)
        return
    from gradlab.benchmarks.learner import main

    main(cartpole_steps=cartpole_steps, breakout_steps=breakout_steps, cases=tuple(case), rounds=rounds,
         as_json=as_json)


@benchmark_app.command("learning")
def learning(
    ref: str = typer.Option("CartPole-v1/ppo", metavar="GOAL/RECIPE", help="The recipe both backends train (its "
                            "train.backend.id switched, nothing else)."),
    seeds: int = typer.Option(5, min=1, help="Seeds per backend."),
    first_seed: int = typer.Option(0, min=0, help="The first seed: seeds FIRST_SEED .. FIRST_SEED+SEEDS-1."),
    jobs: int = typer.Option(1, min=1, help="Trainings at a time, each in its own process with one torch thread "
                             "(at most the CPU count). Steps to acceptance do not depend on it; train seconds do."),
    checkpoint_freq: int = typer.Option(8192, min=1, help="Env steps between the evaluated checkpoints (each lands "
                                        "on the first rollout boundary at or after its step)."),
    max_steps: int = typer.Option(None, min=1, help="Stop training there, at the first rollout boundary at or "
                                  "after it (default: the recipe's budget); the "
                                  "schedules keep the recipe's horizon. A seed not accepted by then counts as inf."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as one JSON document (a seed never accepted: "
                                 "null)."),
) -> None:
    """Env steps to the goal's acceptance, gradlab.ppo vs sb3.ppo, per seed (parity: gradlab.ppo's median is no higher),
    with P(a gradlab.ppo seed accepts sooner) and its 95% interval."""
    import os

    from gradlab.benchmarks.learning import main
    from gradlab.contracts.seeds import MAX_RUN_SEED

    if first_seed + seeds - 1 > MAX_RUN_SEED:
        raise typer.BadParameter(f"expected seeds up to {MAX_RUN_SEED}, found {first_seed}..{first_seed + seeds - 1}",
                                 param_hint="--first-seed")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if jobs > cpus:
        raise typer.BadParameter(f"expected at most this machine's {cpus} CPUs, found {jobs}", param_hint="--jobs")
    try:
        main(ref, seeds, checkpoint_freq, as_json, max_steps=max_steps, first_seed=first_seed, jobs=jobs)
    except RuntimeError as e:  # a worker process failed (gradlab's own errors end as one line in app.main)
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


@benchmark_app.command("curves")
def curves(
    goal: str = typer.Option("Breakout-Atari2600-v0", help="Goal whose recipes the sides train (ppo-sb3 for sb3.ppo "
                             "when it has one, else ppo; ppo for gradlab.ppo)."),
    side: list[str] = typer.Option(["sb3.ppo", "gradlab.ppo"], help="BACKEND[:PRECISION][@RECIPE]: sb3.ppo, "
                                   "gradlab.ppo, gradlab.ppo:bf16, or a recipe of the goal on a backend "
                                   "(gradlab.ppo@ppo-archive-curriculum: episodes begun from archived states stay "
                                   "out of its curve); repeat it; the first is the reference."),
    steps: int = typer.Option(1_000_000, min=1, help="Env steps per run (rounded up to whole rollouts; the "
                              "tables stop at --steps)."),
    seeds: list[str] = typer.Option(["0"], help="Seeds per side: 0,1,2 or --seeds 0 --seeds 1 (>= 2 to judge "
                                    "seed noise)."),
    threads: int = typer.Option(1, min=1, help="Torch threads per run."),
    jobs: int = typer.Option(1, min=1, help="Runs trained at the same time, each in its own process."),
    milestone: int = typer.Option(None, min=1, help="Env steps between the milestone tables (default: a tenth of "
                                  "--steps). A milestone's table prints once every run, queued ones included, has "
                                  "passed it: with --jobs below the number of runs, early tables wait for the last "
                                  "runs, and milestones passed together print as one table."),
    out: Path = typer.Option(None, help="Folder for curves.json, curves.png and runs/ (default: "
                             "$GRADLAB_HOME/benchmarks/curves-<goal>-<UTC time>)."),
    flush_s: float = typer.Option(120.0, min=1.0, help="Seconds between rewrites of the JSON and the plot."),
    schedule_horizon: str = typer.Option("recipe", help="recipe: the schedules (learning rate, clip range) run over "
                                         "the recipe's train.timesteps and each run stops at --steps (the first "
                                         "--steps of the recipe's run); steps: they anneal over --steps."),
) -> None:
    """Learning curves (raw training return vs env steps) per side and seed, and whether sides agree within noise."""
    from gradlab.benchmarks.curve_sides import Side
    from gradlab.benchmarks.curves import run
    from gradlab.errors import ConfigError

    seed_list = parse_seeds(seeds)
    try:
        parsed = [Side.parse(s) for s in side]
    except ConfigError as e:  # a malformed command line: exit 2 like the other options
        raise typer.BadParameter(str(e).removeprefix("--side "), param_hint="--side") from None
    labels = [s.label for s in parsed]
    if len(set(labels)) != len(labels):
        raise typer.BadParameter(f"expected each side once, found {', '.join(labels)}", param_hint="--side")
    try:
        run(goal, parsed, seed_list, steps, threads=threads, jobs=jobs, out=out, milestone=milestone,
            flush_s=flush_s, horizon=schedule_horizon)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except RuntimeError as e:  # a run's process failed (gradlab's own errors end as one line in app.main)
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


@benchmark_app.command("envs")
def envs(
    case: list[str] = typer.Option(["gymnasium", "ale", "vizdoom", "retro"], help="Providers to measure."),
    seconds: float = typer.Option(1.0, min=0.1, help="Timed seconds per measurement."),
    rounds: int = typer.Option(3, min=1, help="Alternating measurements per side; the fastest counts."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as one JSON document."),
) -> None:
    """gradlab's vector envs vs the bare libraries' loops: lane steps/s and the ratio (goal >= 0.9)."""
    from gradlab.benchmarks.envs import main

    main(cases=tuple(case), seconds=seconds, as_json=as_json, rounds=rounds)


@benchmark_app.command("run")
def run_benchmark(
    case: list[str] = typer.Argument(None, help="cartpole-acceptance, bandit-acceptance (default: both)."),
    seeds: int = typer.Option(3, min=1, help="Rounds per case (one seed each): gradlab train, then bare SB3."),
    prefect: str = typer.Option("daemon", "--prefect", help="daemon: a fresh shell, the first command starts the "
                                "background server (default); ephemeral: GRADLAB_DAEMON=0; server: started by "
                                "hand first."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows and the summary as one JSON document."),
) -> None:
    """`gradlab train` to a sealed receipt vs bare SB3 for the same steps: gradlab / bare per round and its median.

    In a temporary GRADLAB_HOME (removed after, its server stopped): with ``--prefect daemon``, first
    one more round of the first case, the first command of that fresh home; then, per case and seed, one
    ``gradlab train`` and bare SB3 for the steps it trained. The first command uses this machine's
    pre-migrated Prefect database ($GRADLAB_CACHE_DIR, default ~/.cache/gradlab) as any new home
    does. About 2-3 minutes with the defaults on a quiet 2-core machine.
    """
    from gradlab.benchmarks.run import CASES, PREFECT_MODES, main

    cases = tuple(case or CASES)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise typer.BadParameter(f"unknown case(s) {', '.join(unknown)}; expected {', '.join(CASES)}")
    if prefect not in PREFECT_MODES:
        raise typer.BadParameter(f"--prefect: expected {', '.join(PREFECT_MODES)}, found {prefect!r}")
    main(cases, seeds, prefect, as_json)


@benchmark_app.command("reports")
def reports(
    runs: int = typer.Option(100, min=1, help="Synthetic runs (each with a journal)."),
    rounds: int = typer.Option(3, min=1, help="Timed repetitions; the fastest counts."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as one JSON document."),
) -> None:
    """`reports build` and `leaders runs` over synthetic runs with journals (budgets: 10 s and 1 s for 100 runs)."""
    from gradlab.benchmarks.reports import main

    main(runs=runs, rounds=rounds, as_json=as_json)


@benchmark_app.command("commands")
def commands_benchmark(
    rounds: int = typer.Option(3, min=1, help="Fresh processes per command; the fastest counts."),
    prefect_api: str = typer.Option(None, "--prefect-api", help="A Prefect API URL: also time `experiment status`."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as one JSON document."),
) -> None:
    """`runs list|show`, `leaders`, `goals list`, `recipe show` (and `experiment status`) in fresh processes: seconds
    (budget 1.5 s on a quiet machine) and the heavy modules each imported (none)."""
    from gradlab.benchmarks.commands import main

    main(rounds=rounds, prefect_api=prefect_api, as_json=as_json)


@benchmark_app.command("play")
def play_benchmark(
    case: list[str] = typer.Option(["cartpole", "breakout"], help="Cases to run: cartpole, breakout."),
    seconds: float = typer.Option(5.0, min=1.0, help="Timed seconds per measurement."),
    settle_s: float = typer.Option(20.0, min=0.0, help="Wait before the warm page open (the reserve worker's imports)."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as one JSON document."),
) -> None:
    """The web player in headless chromium: first frame, steps/s at fps 0 with every panel, CPU at fps 30."""
    from gradlab.benchmarks.play import CASES, main

    unknown = [c for c in case if c not in CASES]
    if unknown:
        raise typer.BadParameter(f"unknown case(s) {', '.join(unknown)}; expected {', '.join(CASES)}")
    main(cases=tuple(case), seconds=seconds, settle_s=settle_s, as_json=as_json)


@benchmark_app.command("datasets")
def datasets_benchmark(
    goal: list[str] = typer.Option(["gradlab__bandit", "CartPole-v1"], help="Goals to record."),
    episodes: int = typer.Option(200, min=1, help="Episodes per side and round."),
    rounds: int = typer.Option(3, min=1, help="Timed repetitions, alternating which side goes first; the fastest counts."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as one JSON document."),
) -> None:
    """Dataset recording throughput against the bare evaluation of the same episodes (goal: ratio >= 0.8)."""
    from gradlab.benchmarks.datasets import main

    main(goals=tuple(goal), episodes=episodes, rounds=rounds, as_json=as_json)


@benchmark_app.command("exploration")
def exploration_benchmark(
    goal: str = typer.Option("MontezumaRevenge-Atari2600-v0", help="Goal whose search recipe runs."),
    recipe: str = typer.Option("go-explore", help="The goal's search recipe (gradlab.go_explore or gradlab.jerk)."),
    seeds: list[str] = typer.Option(["0,1"], help="Seeds: 0,1 or --seeds 0 --seeds 1; one worker each."),
    steps: int = typer.Option(None, min=1, help="Agent steps per search at most, rounded up to whole rollouts "
                              "(default: the recipe's train.timesteps)."),
    score: float = typer.Option(100.0, help="The score to reach (shaped return from reset; 100: Montezuma's first key)."),
    jobs: int = typer.Option(1, min=1, help="Seeds run at the same time, each in its own process."),
    out: Path = typer.Option(None, help="Folder for exploration.json, exploration.png and runs/ (default: "
                             "$GRADLAB_HOME/benchmarks/exploration-<goal>-<UTC time>)."),
) -> None:
    """Agent steps a search run needs to reach --score, against the best score of random actions in as many steps.

    The table's "archive then" is the search's archive when it reached the score: Go-Explore's cells, or
    the sequences JERK retains.
    """
    import math

    from gradlab.benchmarks.exploration import run

    seed_list = parse_seeds(seeds)
    if not math.isfinite(score):
        raise typer.BadParameter(f"expected a finite number, found {score}", param_hint="--score")
    try:
        run(goal, recipe, seed_list, steps, score=score, jobs=jobs, out=out)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except RuntimeError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
