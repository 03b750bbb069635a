"""``gradlab eval CHECKPOINT``: evaluate a checkpoint on its goal's fixed episode manifest.

CHECKPOINT is a checkpoint directory (``<run_dir>/checkpoints/<step>-<sha16>``) or ``RUN_ID[:STEP]``
(runs under ``$GRADLAB_HOME/runs``). Without STEP: the promoted checkpoint (``promotion.json`` in the
run directory) if there is one, else the newest. Torch and the environments are imported only when
the command runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from gradlab.cli.output import console, err_console, fail, print_json
from gradlab.errors import GradlabError, NotFound

SPEC_FILE = "spec.json"
PROMOTION_FILE = "promotion.json"


def _checkpoint_step(path: Path) -> int | None:
    head = path.name.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _promoted(run_dir: Path, checkpoints: list[Path]) -> Path | None:
    """The checkpoint ``promotion.json`` names (by sha256 or step; flat or under ``checkpoint``)."""
    file = run_dir / PROMOTION_FILE
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise NotFound(f"{file}: not valid JSON ({e})") from None
    if isinstance(data.get("checkpoint"), dict):
        data = {**data, **data["checkpoint"]}
    sha = data.get("sha256") or data.get("checkpoint_sha256")
    step = data.get("checkpoint_step", data.get("step"))
    for path in checkpoints:
        if sha and path.name.endswith(str(sha)[:16]):
            return path
        if sha is None and step is not None and _checkpoint_step(path) == int(step):
            return path
    raise NotFound(f"{file}: names checkpoint sha256={sha} step={step}, which is not under {run_dir / 'checkpoints'}")


def resolve_checkpoint(ref: str) -> tuple[Path, Path]:
    """``(checkpoint_dir, run_dir)`` for a directory or ``RUN_ID[:STEP]``.

    Raises:
        NotFound: no such directory, run, step or checkpoint.
    """
    from gradlab.checkpoints import list_checkpoints

    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "manifest.json").is_file():
            raise NotFound(f"{path}: not a checkpoint directory (no manifest.json)")
        return path.resolve(), path.resolve().parent.parent
    from gradlab.settings import load_settings

    run_id, _, step_text = ref.partition(":")
    run_dir = load_settings().run_dir(run_id)
    if not run_dir.is_dir():
        raise NotFound(f"{ref}: neither a checkpoint directory nor a run (no {run_dir})")
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise NotFound(f"run {run_id}: no checkpoints under {run_dir / 'checkpoints'}")
    if step_text:
        if not step_text.isdigit():
            raise NotFound(f"{ref}: STEP must be an integer, found {step_text!r}")
        matches = [p for p in checkpoints if _checkpoint_step(p) == int(step_text)]
        if not matches:
            steps = ", ".join(str(_checkpoint_step(p)) for p in checkpoints)
            raise NotFound(f"run {run_id}: no checkpoint at step {step_text} (steps: {steps})")
        return matches[-1], run_dir
    return (_promoted(run_dir, checkpoints) or checkpoints[-1]), run_dir


def _render(result: Any, goal: Any, *, protocol: bool) -> None:
    from rich.table import Table

    agg = result.aggregates
    verdict = "[green]accepted[/]" if result.accepted else "[red]rejected[/]"
    table = Table(title=f"{result.goal_id} · checkpoint step {result.checkpoint_step} · "
                        f"{result.checkpoint_sha256[:16]}", show_header=False)
    table.add_column("metric")
    table.add_column("value")
    table.add_row("verdict", verdict + ("" if protocol else " [yellow](not the goal's protocol)[/]"))
    table.add_row("episodes", f"{result.completed} of {result.planned} ({result.policy})"
                  + (" — fail-fast stop" if result.completed < result.planned else ""))
    table.add_row("return", f"{agg['eval/episode/return/mean']:.3f} ± {agg['eval/episode/return/std']:.3f} "
                            f"(median {agg['eval/episode/return/median']:.3f}, min {agg['eval/episode/return/min']:.3f}, "
                            f"max {agg['eval/episode/return/max']:.3f})")
    table.add_row("success rate", f"{agg['eval/outcome/success/rate']:.3f} "
                                  f"[95% CI {agg['eval/outcome/success/rate_ci95_low']:.3f}, "
                                  f"{agg['eval/outcome/success/rate_ci95_high']:.3f}]")
    table.add_row("length", f"{agg['eval/episode/length/mean']:.1f} steps (mean)")
    reasons = {k.split("/")[3]: v for k, v in agg.items() if k.startswith("eval/outcome/failure/") and k.count("/") == 4}
    if reasons:
        table.add_row("failure reasons", ", ".join(f"{r} {v:.3f}" for r, v in sorted(reasons.items())))
    from gradlab.evaluation.acceptance import compare, rule_value

    for rule in goal.eval.acceptance:
        value = rule_value(rule, agg)
        ok = compare(value, rule.operator, rule.threshold)
        table.add_row("rule", f"{rule.metric} = {value:.4g} {rule.operator} {rule.threshold:g}: "
                              + ("[green]pass[/]" if ok else "[red]fail[/]"))
    console.print(table)


def eval_command(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint directory, or RUN_ID[:STEP] (default: promoted, else newest).")],
    episodes: Annotated[int | None, typer.Option("--episodes", min=1, help="Episodes N instead of the goal's (not a protocol result).")] = None,
    deterministic: Annotated[bool | None, typer.Option("--deterministic/--stochastic", help="Action mode (default: the goal's).", show_default=False)] = None,
    backend: Annotated[str, typer.Option("--backend", help="inline (this process), local (worker process) or modal.")] = "inline",
    json_out: Annotated[bool, typer.Option("--json", help="Print the full result as one JSON document.")] = False,
) -> None:
    """Evaluate a checkpoint on its goal's fixed episode manifest and print the verdict."""
    try:
        from gradlab.checkpoints import read_manifest
        from gradlab.evaluation import EvalRequest
        from gradlab.evaluation.runner import parse_spec

        ckpt, run_dir = resolve_checkpoint(checkpoint)
        spec_file = run_dir / SPEC_FILE
        if not spec_file.is_file():
            raise NotFound(f"{spec_file}: the run spec is missing (needed to rebuild the goal's environment)")
        spec_json = json.loads(spec_file.read_text())
        spec = parse_spec(spec_json, source=str(spec_file))
        manifest = read_manifest(ckpt)
        policy = None if deterministic is None else ("deterministic" if deterministic else "stochastic")
        request = EvalRequest(checkpoint_dir=str(ckpt), checkpoint_sha256=manifest.sha256,
                              checkpoint_step=manifest.step, spec=spec_json, episodes=episodes, policy=policy)
        if not json_out:
            err_console.print(f"evaluating {ckpt} ({backend})", highlight=False)
        if backend == "inline":
            from gradlab.evaluation import run_evaluation

            result = run_evaluation(request)
        else:
            from gradlab.evaluation.backends import evaluate_with, get_backend

            runner = get_backend(backend)
            try:
                result = evaluate_with(runner, request)
            finally:
                runner.close()
    except GradlabError as e:
        fail(str(e))
    protocol = result.planned == spec.goal.eval.episodes and result.policy == spec.goal.eval.policy
    if json_out:
        print_json(result.as_json())
    else:
        _render(result, spec.goal, protocol=protocol)
