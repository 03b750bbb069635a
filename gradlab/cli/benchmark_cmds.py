"""``gradlab benchmark ...``: speed is measured by these commands, never by timed tests.

Each sub-command lives in ``gradlab/benchmarks/<name>.py`` and is registered here.
"""

from __future__ import annotations

import typer

benchmark_app = typer.Typer(help="Measure speed against the bare libraries (prints a table of ratios).",
                            no_args_is_help=True)


@benchmark_app.command("learner")
def learner(
    cartpole_steps: int = typer.Option(65536, help="Env steps per CartPole run."),
    breakout_steps: int = typer.Option(8192, help="Env steps per Breakout run."),
    case: list[str] = typer.Option(["cartpole", "breakout"], help="Cases to run: cartpole, breakout."),
    rounds: int = typer.Option(3, min=1, help="Alternating runs per side, each in a fresh process; the fastest counts."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as one JSON document."),
) -> None:
    """sb3.ppo through gradlab's learner vs plain SB3 PPO.learn: steps/s and the ratio (goal >= 0.95)."""
    from gradlab.benchmarks.learner import main

    main(cartpole_steps=cartpole_steps, breakout_steps=breakout_steps, cases=tuple(case), rounds=rounds,
         as_json=as_json)


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
    seeds: int = typer.Option(3, min=1, help="Seeds per case."),
    server: bool = typer.Option(False, "--server", help="Start (or reuse) a local Prefect server first."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as one JSON document."),
) -> None:
    """`gradlab train` to a sealed receipt, per seed, next to the bare SB3 learner (median, min, max)."""
    from gradlab.benchmarks.run import CASES, main

    cases = tuple(case or CASES)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise typer.BadParameter(f"unknown case(s) {', '.join(unknown)}; expected {', '.join(CASES)}")
    main(cases, seeds, server, as_json)


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
