"""``gradlab eval CHECKPOINT``: evaluate a checkpoint on its goal's fixed episode manifest.

CHECKPOINT is a checkpoint directory (``<run_dir>/checkpoints/<step>-<sha16>``, its run spec read
from ``<run_dir>/spec.json``) or ``RUN_ID[:STEP]``, read from the receipt stores
(:func:`gradlab.stores.open_stores`; key layout in ``gradlab/stores/__init__.py``):

* the run spec is ``runs/<run_id>/spec.json`` in the control store (else ``spec.json`` in the local
  run directory ``$GRADLAB_HOME/runs/<run_id>/``, for a run never recorded in the stores);
* without STEP: the promoted checkpoint (``promotion.json``), else the newest published one
  (``publications/``), else the newest local checkpoint in the run directory;
* with STEP: the published checkpoint at that step, else the local one.

The local copy in the run directory is used when it exists and verifies (every file's sha256, and the
manifest's step and policy sha256 equal the receipt's); otherwise the published copy is downloaded
(every file checked against its publication receipt) into
``$GRADLAB_HOME/cache/checkpoints/<run_id>/<step:012d>-<sha16>/`` and reused from there while it
verifies. Torch and the environments are imported only when the command runs.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gradlab.cli.output import console, err_console, fail, print_json
from gradlab.errors import ConfigError, Conflict, GradlabError, IntegrityError, NotFound

if TYPE_CHECKING:
    from gradlab.receipts.models import CheckpointPublication
    from gradlab.settings import Settings
    from gradlab.stores import Stores

logger = logging.getLogger(__name__)

SPEC_FILE = "spec.json"
CACHE_DIR = Path("cache") / "checkpoints"
"""Downloaded checkpoints, under ``$GRADLAB_HOME``: ``cache/checkpoints/<run_id>/<step:012d>-<sha16>/``."""


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """A verified local checkpoint folder and the run spec it is evaluated under.

    Attributes:
        path: the checkpoint folder (verified against its manifest).
        spec: the resolved run spec JSON (``gradlab.contracts.run_spec.RunSpec``).
        spec_source: where the spec was read (file path or store URL), for error messages.
        origin: ``directory`` (given as a folder), ``local`` (the run directory's copy),
            ``cache`` (an earlier download) or ``downloaded`` (fetched from the model store now).
        fallback: for a bare ``RUN_ID`` whose run promoted no checkpoint, what was taken instead
            (``"the newest published checkpoint (step N)"``); None when the ref named the checkpoint
            or the promoted one was taken. Commands that publish or export warn with it.
    """

    path: Path
    spec: dict[str, Any]
    spec_source: str
    origin: str
    fallback: str | None = None


def _checkpoint_step(path: Path) -> int | None:
    head = path.name.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _read_spec_file(spec_file: Path) -> dict[str, Any]:
    if not spec_file.is_file():
        raise NotFound(f"{spec_file}: the run spec is missing (needed to rebuild the goal's environment)")
    try:
        return json.loads(spec_file.read_text())
    except json.JSONDecodeError as e:
        raise IntegrityError(f"{spec_file}: expected the run spec as JSON, found invalid JSON ({e})") from None


def _verified(path: Path, *, step: int, sha256: str, what: str,
              publication: CheckpointPublication | None = None) -> Path:
    """``path`` after :func:`verify_checkpoint` and a check that it is checkpoint (step, sha256);
    with a ``publication``, every file is checked against the publication receipt's hashes (the
    control store), not only against the folder's own manifest.

    Raises:
        NotFound, IntegrityError: as :func:`gradlab.checkpoints.verify_checkpoint` and
            :func:`gradlab.checkpoints.verify_against_publication` (naming the file and both
            hashes), or the manifest names another step or policy sha256 than ``what`` says.
    """
    from gradlab.checkpoints import verify_against_publication, verify_checkpoint

    manifest = verify_checkpoint(path) if publication is None else verify_against_publication(path, publication.files)
    if (manifest.step, manifest.sha256) != (step, sha256):
        raise IntegrityError(f"{path}/manifest.json: expected step {step} sha256 {sha256} ({what}), "
                             f"found step {manifest.step} sha256 {manifest.sha256}")
    return path


def _materialize(stores: Stores, settings: Settings, run_id: str, step: int, sha256: str,
                 publication: CheckpointPublication | None, *, what: str) -> tuple[Path, str]:
    """A verified local folder for checkpoint (step, sha256): the run directory's copy, else the cache.

    Returns:
        (folder, origin) with origin ``local``, ``cache`` or ``downloaded``.

    Raises:
        NotFound: no verified local copy and no publication to download.
        IntegrityError: the run directory's copy or a downloaded file differs from its
            publication receipt (naming the file and both hashes).
        StoreUnavailable: the model store cannot be reached.
    """
    from gradlab.receipts import rules
    from gradlab.stores import keys

    name = keys.checkpoint_name(step, sha256)
    local = settings.run_dir(run_id) / "checkpoints" / name
    if local.is_dir():
        from gradlab.checkpoints import verify_checkpoint

        try:
            verify_checkpoint(local)
        except (IntegrityError, NotFound) as e:  # damaged (fails its own manifest): the published copy
            if publication is None:
                raise
            err_console.print(f"local copy fails verification ({e}); using the published copy", highlight=False)
        else:
            # Intact by its own manifest, so it must be the published bytes: a copy whose manifest
            # was rewritten with its files is refused, naming the file and both hashes.
            return _verified(local, step=step, sha256=sha256, what=what, publication=publication), "local"
    if publication is None:
        raise NotFound(f"run {run_id}: {what} (step {step}, sha256 {sha256[:16]}) is neither published "
                       f"({stores.control.url(keys.publication(run_id, step, sha256))} missing) nor under "
                       f"{settings.run_dir(run_id) / 'checkpoints'}")
    cache = settings.home / CACHE_DIR / run_id / name
    if cache.is_dir():
        try:
            return _verified(cache, step=step, sha256=sha256, what=what, publication=publication), "cache"
        except (IntegrityError, NotFound) as e:
            err_console.print(f"cached copy fails verification ({e}); downloading again", highlight=False)
            shutil.rmtree(cache)
    try:
        rules.download_checkpoint(stores, publication, cache)
    except Conflict:  # another process downloaded it at the same moment: use theirs if it verifies
        return _verified(cache, step=step, sha256=sha256, what=what, publication=publication), "cache"
    return _verified(cache, step=step, sha256=sha256, what=what, publication=publication), "downloaded"


def _check_published_copy(path: Path, *, settings: Settings | None, stores: Stores | None) -> None:
    """A checkpoint folder named by path is checked against its publication receipt when its run
    published it (the folder's own manifest could have been rewritten with its files).

    Raises:
        IntegrityError: a file differs from the publication receipt (named, with both hashes).
    """
    from gradlab.checkpoints import read_manifest, verify_against_publication
    from gradlab.errors import StoreUnavailable
    from gradlab.receipts.io import read_optional
    from gradlab.receipts.models import CheckpointPublication
    from gradlab.stores import keys, open_stores

    manifest = read_manifest(path)
    try:
        stores = stores or open_stores(settings)
        pub = read_optional(stores.control, keys.publication(manifest.run_id, manifest.step, manifest.sha256),
                            CheckpointPublication)
    except (StoreUnavailable, ConfigError) as e:
        err_console.print(f"{path}: publication receipt not checked ({e}); verifying against its manifest only",
                          highlight=False)
        return
    if pub is not None:
        verify_against_publication(path, pub.files)


def resolve_checkpoint(ref: str, *, settings: Settings | None = None, stores: Stores | None = None) -> ResolvedCheckpoint:
    """The checkpoint folder and run spec for a directory or ``RUN_ID[:STEP]`` (see the module docstring).

    Args:
        ref: a checkpoint directory, ``RUN_ID`` or ``RUN_ID:STEP`` (STEP in env steps).
        settings: default :func:`gradlab.settings.load_settings`.
        stores: default :func:`gradlab.stores.open_stores` of ``settings``.

    Returns:
        The verified local folder (possibly downloaded) with the run spec JSON.

    Raises:
        NotFound: no such directory, run, step or checkpoint (naming what was looked for and where).
        IntegrityError: the chosen checkpoint fails verification and has no good published copy.
        StoreUnavailable: a store cannot be reached (transient).
    """
    from gradlab.checkpoints import list_checkpoints

    if ref.startswith("file://"):  # the URIs receipts print for file stores
        ref = ref.removeprefix("file://")
    path = Path(ref).expanduser()
    try:
        is_dir = path.is_dir()
    except OSError:  # a name the OS refuses (too long): not a folder; the run-id checks name it below
        is_dir = False
    if is_dir:
        if not (path / "manifest.json").is_file():
            raise NotFound(f"{path}: not a checkpoint directory (no manifest.json)")
        path = path.resolve()
        _check_published_copy(path, settings=settings, stores=stores)
        spec_file = path.parent.parent / SPEC_FILE
        if spec_file.is_file():
            return ResolvedCheckpoint(path=path, spec=_read_spec_file(spec_file), spec_source=str(spec_file),
                                      origin="directory")
        # A published copy (model store) has no run directory around it: its manifest names the run,
        # whose spec the control store holds.
        import json

        from gradlab.receipts import rules
        from gradlab.stores import keys, open_stores

        run_id = json.loads((path / "manifest.json").read_text()).get("run_id")
        stores = stores or open_stores(settings)
        try:
            spec = rules.read_run_spec(stores, str(run_id))
        except NotFound:
            raise NotFound(f"{path}: no run spec beside it ({spec_file}) and no run {run_id} in "
                           f"{stores.control.url(keys.run_spec(str(run_id)))}") from None
        return ResolvedCheckpoint(path=path, spec=spec, spec_source=stores.control.url(keys.run_spec(str(run_id))),
                                  origin="directory")
    if "/" in ref or ref.startswith("."):
        raise NotFound(f"{ref}: no such checkpoint directory")

    from gradlab.receipts import rules
    from gradlab.settings import load_settings
    from gradlab.stores import keys, open_stores

    settings = settings or load_settings()
    stores = stores or open_stores(settings)
    run_id, _, step_text = ref.partition(":")
    if step_text and not step_text.isdigit():
        raise NotFound(f"{ref}: STEP must be a non-negative integer, found {step_text!r}")
    run_dir = settings.run_dir(run_id)
    spec_url = stores.control.url(keys.run_spec(run_id))
    try:
        spec, spec_source = rules.read_run_spec(stores, run_id), spec_url
    except NotFound:
        if not run_dir.is_dir():
            raise NotFound(f"{ref}: neither a checkpoint directory nor a run (no {spec_url} in the control store "
                           f"and no {run_dir}); expected RUN_ID[:STEP] (see `gradlab runs list`) or a "
                           "checkpoint folder") from None
        spec, spec_source = _read_spec_file(run_dir / SPEC_FILE), str(run_dir / SPEC_FILE)
    publications = rules.list_publications(stores, run_id)
    promotion = rules.read_promotion(stores, run_id)
    local = list_checkpoints(run_dir)

    def done(folder: Path, origin: str, fallback: str | None = None) -> ResolvedCheckpoint:
        return ResolvedCheckpoint(path=folder, spec=spec, spec_source=spec_source, origin=origin, fallback=fallback)

    def local_newest(candidates: list[Path], what: str, fallback: bool = False) -> ResolvedCheckpoint:
        from gradlab.checkpoints import verify_checkpoint

        folder = candidates[-1]
        manifest = verify_checkpoint(folder)
        logger.info("run %s: %s is the local checkpoint %s (not published)", run_id, what, folder)
        return done(folder, "local", f"{what} (step {manifest.step}, local, not published)" if fallback else None)

    if step_text:
        step = int(step_text)
        pubs = [p for p in publications if p.step == step]
        if pubs:
            pub = pubs[-1]
            return done(*_materialize(stores, settings, run_id, pub.step, pub.sha256, pub, what=f"step {step}"))
        matches = [p for p in local if _checkpoint_step(p) == step]
        if matches:
            return local_newest(matches, f"step {step}")
        steps = sorted({p.step for p in publications} | {s for p in local if (s := _checkpoint_step(p)) is not None})
        raise NotFound(f"run {run_id}: no checkpoint at step {step} (steps: {', '.join(map(str, steps)) or 'none'})")
    if promotion is not None:
        pub = next((p for p in publications
                    if (p.step, p.sha256) == (promotion.checkpoint_step, promotion.checkpoint_sha256)), None)
        return done(*_materialize(stores, settings, run_id, promotion.checkpoint_step, promotion.checkpoint_sha256,
                                  pub, what="the promoted checkpoint"))
    if publications:
        pub = publications[-1]
        return done(*_materialize(stores, settings, run_id, pub.step, pub.sha256, pub,
                                  what="the newest published checkpoint"),
                    fallback=f"the newest published checkpoint (step {pub.step})")
    if local:
        return local_newest(local, "the newest checkpoint", fallback=True)
    raise NotFound(f"run {run_id}: no checkpoint (no promotion or publication under "
                   f"{stores.control.url(keys.run_prefix(run_id))}, nothing under {run_dir / 'checkpoints'})")


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


def _render(result: Any, goal: Any, *, protocol: bool, success_defined: bool, title: str | None = None) -> None:
    """Print the human table of an evaluation.

    Args:
        result: the :class:`gradlab.evaluation.result.EvalResult`.
        goal: the run spec's goal (its acceptance rules are listed with their values).
        protocol: False when episodes or policy were overridden (the verdict is then not the goal's).
        success_defined: the evaluation environment's task program names ``termination.success``
            events; without them no episode can be a success, so the success rate (always 0) is not
            shown, only the outcome counts.
    """
    from rich.table import Table

    agg = result.aggregates
    verdict = "[green]accepted[/]" if result.accepted else "[red]rejected[/]"
    table = Table(title=title or f"{result.goal_id} · checkpoint step {result.checkpoint_step} · "
                                 f"{result.checkpoint_sha256[:16]}", show_header=False)
    table.add_column("metric")
    table.add_column("value")
    table.add_row("verdict", verdict + ("" if protocol else " [yellow](not the goal's protocol)[/]"))
    table.add_row("episodes", f"{result.completed} of {result.planned} ({result.policy})"
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
) -> None:
    """Evaluate a checkpoint (or a --baseline policy) on its goal's fixed episode manifest and print the verdict."""
    if video is not None and video.exists() and not video.is_dir():  # before the evaluation, not after it
        fail(f"--video {video}: expected a folder, found a file")
    if baseline is not None:
        _baseline_command(checkpoint, baseline, episodes=episodes, json_out=json_out, video=video,
                          video_episodes=video_episodes)
        return
    try:
        from gradlab.checkpoints import read_manifest
        from gradlab.evaluation import EvalRequest
        from gradlab.evaluation.runner import parse_spec

        verify = "full"
        if checkpoint.startswith("hf://"):  # a published repository: weights-only files, verified against gradlab.json
            from gradlab.share.hub import load_repo

            hub = load_repo(checkpoint)
            resolved = ResolvedCheckpoint(path=hub.checkpoint, spec=hub.spec, spec_source=f"{checkpoint} run_spec.json",
                                          origin="hub")
            verify = "weights_only"
        else:
            resolved = resolve_checkpoint(checkpoint)
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
                      video_episodes: int) -> None:
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
        _render(result, goal, protocol=stored is not None, title=f"{goal_id} · {name} baseline",
                success_defined=bool(goal.train.environment.task.termination.success))
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
