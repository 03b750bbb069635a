"""``gradlab export`` and ``gradlab publish``: a checkpoint for rl-zoo3 / SB3 users and the Hugging Face Hub.

Both take ``RUN[:STEP]`` or a checkpoint folder, read as ``gradlab eval`` reads it (verified against
its manifest and, for a published checkpoint, its publication receipt). docs/SHARING.md has the
layouts; docs/ARCHITECTURE.md section 12 the contracts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gradlab.cli.output import err_console, fail, print_json, say
from gradlab.errors import GradlabError


def export_command(
    checkpoint: Annotated[str, typer.Argument(help="RUN_ID[:STEP] (default: promoted, else newest) or a checkpoint folder.")],
    out: Annotated[Path, typer.Option("--out", help="Output folder.")],
    fmt: Annotated[str, typer.Option("--format", help="rl-zoo (rl-zoo3's folder layout; refused for a goal rl-zoo3 cannot play) or sb3 (policy.zip + vecnormalize.pkl).")] = "rl-zoo",
    json_out: Annotated[bool, typer.Option("--json", help="Print the export's provenance as one JSON document.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an earlier export there (sb3: the folder; rl-zoo: "
                                                        "its <algo>/<env>_1 run folder).")] = False,
) -> None:
    """Export a checkpoint so rl-zoo3's enjoy or plain stable-baselines3 can play it."""
    if fmt not in ("rl-zoo", "sb3"):
        raise typer.BadParameter(f"expected rl-zoo or sb3, found {fmt!r}", param_hint="--format")
    try:
        import json

        from gradlab.checkpoints.resolve import resolve_checkpoint
        from gradlab.evaluation.runner import parse_spec
        from gradlab.share.export import export_checkpoint

        resolved = resolve_checkpoint(checkpoint, warn=say)
        if resolved.fallback:
            why = ("evaluation was off for this run" if resolved.spec.get("evaluate") is False
                   else "no checkpoint passed its acceptance rule, or the run has not finished")
            err_console.print(f"note: run {escape(checkpoint)} promoted no checkpoint ({why}): exporting "
                              f"{resolved.fallback}; name one with RUN_ID:STEP", highlight=False)
        spec = parse_spec(resolved.spec, source=resolved.spec_source)
        written, files = export_checkpoint(resolved.path, spec, out, fmt=fmt, force=force)
    except GradlabError as e:
        fail(str(e))
    except OSError as e:  # the output folder cannot be written (permissions, a full disk)
        fail(f"--out {out}: cannot write {e.filename or out} ({e.strerror})")
    for path in files:
        err_console.print(f"wrote {escape(str(path))}", highlight=False)
    if written == "rl-zoo":
        from gradlab.share.export import SB3_ALGORITHMS

        algo = SB3_ALGORITHMS[spec.recipe.train.backend.id]
        err_console.print(f"play it: python -m rl_zoo3.enjoy --algo {algo} --env {spec.environment.env_id} "
                          f"-f {escape(str(out))} --exp-id 1", highlight=False)
    if json_out:
        print_json(json.loads((Path(out) / "gradlab_export.json").read_text()))


def publish_command(
    checkpoint: Annotated[str, typer.Argument(help="RUN_ID[:STEP] (default: the promoted checkpoint) or a checkpoint folder.")],
    repo: Annotated[str | None, typer.Option("--repo", help="OWNER/NAME on the Hugging Face Hub to upload to (needs HF_TOKEN or `hf auth login`).")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="The repository folder to write (default: $GRADLAB_HOME/publish/<run>-<step>).")] = None,
    private: Annotated[bool, typer.Option("--private", help="Create the hub repository as private.")] = False,
    allow_unaccepted: Annotated[bool, typer.Option("--allow-unaccepted", help="Publish a checkpoint that is not the run's accepted promotion (the card says so).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print gradlab.json (and the commit URL) as one JSON document.")] = False,
) -> None:
    """Assemble a Hugging Face model repository of a promoted checkpoint (card, evidence, SB3 zip, replay) and upload it."""
    from gradlab.share.hub import parse_hf_ref

    if out is not None and out.exists() and not out.is_dir():
        fail(f"--out {out}: expected a new or empty folder, found a file")
    if repo is not None:
        try:
            parse_hf_ref(f"hf://{repo}")
        except GradlabError as e:
            raise typer.BadParameter(str(e).removeprefix("hf://"), param_hint="--repo") from None
    try:
        from gradlab import receipts as rules
        from gradlab.checkpoints import read_manifest
        from gradlab.checkpoints.resolve import resolve_checkpoint
        from gradlab.evaluation.runner import parse_spec
        from gradlab.settings import load_settings
        from gradlab.share.evidence import accepted_result
        from gradlab.share.hub import build_repo_folder, commit_message, hf_token, upload_folder
        from gradlab.stores import open_stores

        settings = load_settings()
        resolved = resolve_checkpoint(checkpoint, warn=say)
        spec = parse_spec(resolved.spec, source=resolved.spec_source)
        manifest = read_manifest(resolved.path)
        stores = open_stores(settings)
        promotion = rules.read_promotion(stores, spec.run_id)
        promoted = promotion is not None and promotion.checkpoint_sha256 == manifest.sha256
        if not promoted and not allow_unaccepted:
            which = (f"its promotion is step {promotion.checkpoint_step}" if promotion is not None
                     else "it has no promotion (no checkpoint was accepted)")
            fail(f"run {spec.run_id}: checkpoint step {manifest.step} ({manifest.sha16}) is not promoted ({which}); "
                 "only promoted checkpoints publish: pass --allow-unaccepted to publish it anyway (the model card "
                 "then says it was not accepted)")
        result = accepted_result(stores, spec, manifest.sha256) if promoted else None
        if result is None:
            from gradlab.evaluation import EvalRequest, run_evaluation

            err_console.print(f"evaluating step {manifest.step} on the goal's manifest for the model card", highlight=False)
            result = run_evaluation(EvalRequest(checkpoint_dir=str(resolved.path), checkpoint_sha256=manifest.sha256,
                                                checkpoint_step=manifest.step, spec=resolved.spec))
        folder = out or settings.home / "publish" / f"{spec.display_name.replace('/', '~')}-{manifest.step}"
        index = build_repo_folder(resolved.path, spec, result, folder, accepted=promoted and result.accepted,
                                  repo_id=repo)
    except GradlabError as e:
        fail(str(e))
    except OSError as e:  # the repository folder cannot be written (permissions, a full disk)
        fail(f"--out {folder}: cannot write {e.filename or folder} ({e.strerror})")
    err_console.print(f"repository folder {escape(str(folder))}: {len(index['files']) + 1} files"
                      + ("" if index["accepted"] else " (not accepted: the card says so)"), highlight=False)
    url = None
    if repo is not None:
        try:
            token = hf_token()
        except GradlabError as e:
            fail(f"{e}; nothing uploaded; the repository folder is kept at {folder}")
        if not token:
            fail(f"no Hugging Face token (set HF_TOKEN, [hub] token_ref in the config file, or run `hf auth login`): nothing uploaded; the repository "
                 f"folder is kept at {folder}; upload it with `hf upload {repo} {folder} .` or run this command again "
                 "with a token")
        try:
            url = upload_folder(folder, repo, token=token, private=private, message=commit_message(index))
        except GradlabError as e:
            fail(f"{e}; the repository folder is kept at {folder}")
        err_console.print(f"uploaded to hf://{repo}: {escape(url)}", highlight=False)
    else:
        err_console.print(f"not uploaded (no --repo): to upload, run this command again with --repo OWNER/NAME and "
                          f"a token, or `hf upload OWNER/NAME {escape(str(folder))} .`", highlight=False)
    if json_out:
        print_json({**index, "folder": str(folder), "commit_url": url})
