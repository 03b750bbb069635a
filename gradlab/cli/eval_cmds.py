"""``gradlab eval CHECKPOINT``: evaluate a checkpoint on its goal's fixed episode manifest.

CHECKPOINT is a checkpoint directory or ``RUN_ID[:STEP]``, resolved and verified by
:func:`gradlab.checkpoints.resolve.resolve_checkpoint` (its module docstring has the rules: the
promoted checkpoint, else the newest published one, else the newest local one; local copies used
while they verify, published ones downloaded into ``$GRADLAB_HOME/cache/checkpoints/``), or
``hf://OWNER/NAME``, a published repository (:func:`gradlab.share.hub.load_repo`). Torch and the
environments are imported only when the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gradlab.cli.output import console, err_console, fail, print_json, say
from gradlab.errors import GradlabError


def outcome_counts(result: Any) -> str:
    """The completed episodes' outcomes as ``"success 95/100, failure 5/100"`` (in ``OUTCOMES`` order).

    Args:
        result: a :class:`gradlab.evaluation.result.EvalResult`; the denominator is its completed
            episode count (its rows), outcomes that never happened are left out.
    """
    from collections import Counter

    from gradlab.evaluation.names import OUTCOMES

    counts = Counter(row.outcome for row in result.episodes)
    total = len(result.episodes)
    return ", ".join(f"{o} {counts[o]}/{total}" for o in OUTCOMES if counts[o]) or "none"


def _render(result: Any, goal: Any, *, protocol: bool, success_defined: bool, title: str | None = None,
            actions: str | None = None) -> None:
    """Print the human table of an evaluation.

    Args:
        result: the :class:`gradlab.evaluation.result.EvalResult`.
        goal: the run spec's goal (its acceptance rules are listed with their values).
        protocol: False when episodes or policy were overridden (the verdict is then not the goal's).
        success_defined: the evaluation environment's task program names ``termination.success``
            events; without them no episode can be a success, so the success rate (always 0) is not
            shown, only the outcome counts.
        actions: how the policy acted when that is not ``result.policy`` (a baseline:
            ``BASELINE_ACTIONS``; the random one is stochastic whatever the goal's mode).
    """
    from rich.table import Table

    agg = result.aggregates
    verdict = "[green]accepted[/]" if result.accepted else "[red]rejected[/]"
    table = Table(title=title or f"{result.goal_id} · checkpoint step {result.checkpoint_step} · "
                                 f"{result.checkpoint_sha256[:16]}", show_header=False)
    table.add_column("metric")
    table.add_column("value")
    table.add_row("verdict", verdict + ("" if protocol else " [yellow](not the goal's protocol)[/]"))
    table.add_row("episodes", f"{result.completed} of {result.planned} ({actions or result.policy})"
                  + (" — fail-fast stop" if result.completed < result.planned else ""))
    table.add_row("return", f"{agg['eval/episode/return/mean']:.3f} ± {agg['eval/episode/return/std']:.3f} "
                            f"(median {agg['eval/episode/return/median']:.3f}, min {agg['eval/episode/return/min']:.3f}, "
                            f"max {agg['eval/episode/return/max']:.3f})")
    table.add_row("outcomes", outcome_counts(result))
    if success_defined:
        table.add_row("success rate", f"{agg['eval/outcome/success/rate']:.3f} "
                                      f"[95% CI {agg['eval/outcome/success/rate_ci95_low']:.3f}, "
                                      f"{agg['eval/outcome/success/rate_ci95_high']:.3f}]")
    table.add_row("length", f"{agg['eval/episode/length/mean']:.1f} steps (mean)")
    from gradlab.evaluation import names

    for start in sorted({k.split("/")[2] for k in agg if k.startswith("eval/start/")}):
        table.add_row(f"from start {start}",
                      f"success {agg[names.EVAL_START_SUCCESS_RATE.format(start=start)]:.3f} "
                      f"[95% CI {agg[names.EVAL_START_SUCCESS_LOW.format(start=start)]:.3f}, "
                      f"{agg[names.EVAL_START_SUCCESS_HIGH.format(start=start)]:.3f}], "
                      f"{agg[names.EVAL_START_EPISODES.format(start=start)]:.0f} episodes")
    reasons = {k.split("/")[3]: v for k, v in agg.items() if k.startswith("eval/outcome/failure/") and k.count("/") == 4}
    if reasons:
        table.add_row("failure reasons", ", ".join(f"{r} {v:.3f}" for r, v in sorted(reasons.items())))
    from gradlab.contracts.goal import compare
    from gradlab.evaluation.acceptance import rule_value

    for rule in goal.eval.acceptance:
        value = rule_value(rule, agg)
        ok = compare(value, rule.operator, rule.threshold)
        table.add_row("rule", f"{rule.metric} = {value:.4g} {rule.operator} {rule.threshold:g}: "
                              + ("[green]pass[/]" if ok else "[red]fail[/]"))
    console.print(table)


def eval_command(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint directory, RUN_ID[:STEP] (default: promoted, else newest), or hf://OWNER/NAME (a published repository).")],
    episodes: Annotated[int | None, typer.Option("--episodes", min=1, help="Episodes N instead of the goal's (not a protocol result).")] = None,
    deterministic: Annotated[bool | None, typer.Option("--deterministic/--stochastic", help="Action mode (default: the goal's).", show_default=False)] = None,
    backend: Annotated[str, typer.Option("--backend", help="inline (this process), local (worker process) or modal.")] = "inline",
    json_out: Annotated[bool, typer.Option("--json", help="Print the full result as one JSON document.")] = False,
    baseline: Annotated[str | None, typer.Option("--baseline", help="random or noop: evaluate that reference policy on GOAL (the argument is then a goal id); the result is stored in the eval store.")] = None,
    video: Annotated[Path | None, typer.Option("--video", help="Also record manifest episodes as MP4 files into this folder.")] = None,
    video_episodes: Annotated[int, typer.Option("--video-episodes", min=1, help="How many manifest episodes --video records (the first K).")] = 1,
    record_dataset: Annotated[str | None, typer.Option("--record-dataset", help="Also keep the evaluation's episodes as this dataset (gradlab dataset show NAME).")] = None,
) -> None:
    """Evaluate a checkpoint (or a --baseline policy) on its goal's fixed episode manifest and print the verdict."""
    if video is not None and video.exists() and not video.is_dir():  # before the evaluation, not after it
        fail(f"--video {video}: expected a folder, found a file")
    if record_dataset is not None:
        from gradlab.datasets.store import dataset_exists
        from gradlab.stores import open_dataset_store

        if dataset_exists(open_dataset_store(), record_dataset):  # before the evaluation, not after it
            fail(f"--record-dataset {record_dataset}: that dataset exists already (datasets are immutable)")
    if baseline is not None:
        result = _baseline_command(checkpoint, baseline, episodes=episodes, json_out=json_out, video=video,
                                   video_episodes=video_episodes)
        if record_dataset is not None:
            _record_dataset(record_dataset, result, goal_id=checkpoint, policy=baseline)
        return
    try:
        from gradlab.checkpoints import read_manifest
        from gradlab.checkpoints.resolve import resolve_checkpoint
        from gradlab.evaluation import EvalRequest
        from gradlab.evaluation.runner import parse_spec

        verify = "full"
        if checkpoint.startswith("hf://"):  # a published repository: weights-only files, verified against gradlab.json
            from gradlab.share.hub import resolve_repo

            resolved = resolve_repo(checkpoint)
            verify = "weights_only"
        else:
            resolved = resolve_checkpoint(checkpoint, warn=say, check_store=True)
        ckpt, spec_json = resolved.path, resolved.spec
        spec = parse_spec(spec_json, source=resolved.spec_source)
        manifest = read_manifest(ckpt)
        policy = None if deterministic is None else ("deterministic" if deterministic else "stochastic")
        request = EvalRequest(checkpoint_dir=str(ckpt), checkpoint_sha256=manifest.sha256, verify=verify,
                              checkpoint_step=manifest.step, spec=spec_json, episodes=episodes, policy=policy)
        if not json_out:
            err_console.print(f"evaluating {ckpt} ({resolved.origin}, {backend})", highlight=False)
        if backend == "inline":
            import torch

            from gradlab.evaluation import run_evaluation

            torch.set_num_threads(1)  # batched small-policy inference: a second thread only contends
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
        _render(result, spec.goal, protocol=protocol,
                success_defined=bool(spec.eval_environment.task.termination.success))
    if video is not None:
        def weights_only_policy() -> Any:
            from gradlab.checkpoints import load_policy

            return load_policy(ckpt, verify=False)  # verified by resolve_checkpoint

        _record_videos(weights_only_policy, result=result, goal=spec.goal, environment=spec.eval_environment,
                       out_dir=video, count=video_episodes, prefix=f"{spec.goal_id}__step{result.checkpoint_step}")
    if record_dataset is not None:
        _record_dataset(record_dataset, result, goal_id=spec.goal_id, policy=checkpoint)


def _record_dataset(name: str, result: Any, *, goal_id: str, policy: str) -> None:
    """``eval --record-dataset``: record the evaluation's manifest episodes as dataset ``name`` through
    the dataset-record flow, in one chunk: the chunk's manifest is then the evaluation's (same N, lanes,
    seeds, action mode and sampling generator), so the episodes are the evaluation's; says whether
    the rows agree."""
    from gradlab.cli.dataset_cmds import run_recording
    from gradlab.datasets.plan import plan_recording

    try:
        plan = plan_recording(name, goal_id=goal_id, policy=policy, episodes=result.planned, frames=False,
                              policy_mode=result.policy, chunk_episodes=result.planned, warn=say)
    except GradlabError as e:
        fail(str(e))
    manifest = run_recording(plan, workers=1)
    recorded = [(e["index"], e["return"], e["length"], e["outcome"]) for e in manifest["episodes"]]
    evaluated = [(r.index, r.return_, r.length, r.outcome) for r in result.episodes]
    same = recorded[:len(evaluated)] == evaluated
    err_console.print(f"dataset {name}: {len(recorded)} episodes stored; "
                      + ("returns, lengths and outcomes equal the evaluation's rows" if same else
                         "[yellow]its episodes differ from the evaluation's rows (a stochastic policy or environment)[/]"),
                      highlight=False)


def _record_videos(make_policy: Any, *, result: Any, goal: Any, environment: Any, out_dir: Path, count: int,
                   prefix: str, metadata: dict[str, object] | None = None) -> None:
    """``--video``: record the first ``count`` manifest episodes; one stderr line per file."""
    from gradlab.evaluation.recording import record_evaluation_videos

    try:
        recorded = record_evaluation_videos(make_policy(), result=result, goal=goal, environment=environment,
                                            out_dir=out_dir, count=min(count, result.planned),
                                            metadata=metadata or {}, prefix=prefix)
    except GradlabError as e:
        fail(str(e))
    except OSError as e:  # the folder cannot be created or written
        fail(f"--video {out_dir}: cannot write {e.filename or out_dir} ({e.strerror})")
    for rec in recorded:
        note = "" if rec.matches_evaluation in (None, True) else " (differs from the evaluated episode: stochastic policy)"
        err_console.print(f"video {rec.path}: {rec.frames} frames, return {rec.return_:.3f}{note}", highlight=False)


def _baseline_command(goal_id: str, name: str, *, episodes: int | None, json_out: bool, video: Path | None,
                      video_episodes: int) -> Any:
    """``gradlab eval --baseline random|noop GOAL``: evaluate, store (protocol runs only), print."""
    try:
        from gradlab.contracts.experiments import Experiments
        from gradlab.evaluation.baselines import BASELINES, evaluate_baseline, read_baselines, store_baseline
        from gradlab.stores import open_stores

        if name not in BASELINES:
            raise typer.BadParameter(f"expected one of {', '.join(BASELINES)}, found {name!r}", param_hint="--baseline")
        goal = Experiments().load_goal(goal_id)
        if not json_out:
            err_console.print(f"evaluating the {name} baseline on {goal_id}", highlight=False)
        result = evaluate_baseline(goal, name, episodes=episodes)
        stored = None
        stores = open_stores()
        if result.planned == goal.eval.episodes:
            stored = store_baseline(stores, goal, name, result)
        others = read_baselines(stores, goal)
    except GradlabError as e:
        fail(str(e))
    if json_out:
        print_json(result.as_json())
    else:
        from gradlab.evaluation.baselines import BASELINE_ACTIONS

        _render(result, goal, protocol=stored is not None, title=f"{goal_id} · {name} baseline",
                success_defined=bool(goal.train.environment.task.termination.success), actions=BASELINE_ACTIONS[name])
        mean = result.aggregates["eval/episode/return/mean"]
        random_mean = others["random"].aggregates["eval/episode/return/mean"] if "random" in others else None
        for ref, value in sorted(goal.reference_scores.items()):
            line = f"reference {ref}: {value:g}"
            if random_mean is not None and value != random_mean:
                from gradlab.evaluation.baselines import normalised_score

                line += f"; this {name} baseline scores {normalised_score(mean, random=random_mean, reference=value):.3f} {ref}-normalised"
            err_console.print(line, highlight=False)
        err_console.print(f"stored {stored}" if stored else "not stored (--episodes: not the goal's protocol)",
                          highlight=False)
    if video is not None:
        def baseline_policy() -> Any:
            from gradlab.envs import make_vector_env
            from gradlab.evaluation.baselines import BaselinePolicy

            probe = make_vector_env(goal.eval_environment().model_copy(update={"n_envs": 1}), seed=0)
            try:
                return BaselinePolicy(name, probe.single_action_space)
            finally:
                probe.close()

        _record_videos(baseline_policy, result=result, goal=goal, environment=goal.eval_environment(), out_dir=video,
                       count=video_episodes, prefix=f"{goal_id}__{name}", metadata={"baseline": name})
    return result
