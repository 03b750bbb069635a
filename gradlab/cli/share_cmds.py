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

from gradlab.cli.output import err_console, fail, print_json
from gradlab.errors import GradlabError


def export_command(
    checkpoint: Annotated[str, typer.Argument(help="RUN_ID[:STEP] (default: promoted, else newest) or a checkpoint folder.")],
    out: Annotated[Path, typer.Option("--out", help="Output folder.")],
    fmt: Annotated[str, typer.Option("--format", help="rl-zoo (rl-zoo3's folder layout) or sb3 (policy.zip + vecnormalize.pkl).")] = "rl-zoo",
    json_out: Annotated[bool, typer.Option("--json", help="Print the export's provenance as one JSON document.")] = False,
) -> None:
    """Export a checkpoint so rl-zoo3's enjoy or plain stable-baselines3 can play it."""
    if fmt not in ("rl-zoo", "sb3"):
        raise typer.BadParameter(f"expected rl-zoo or sb3, found {fmt!r}", param_hint="--format")
    try:
        import json

        from gradlab.cli.eval_cmds import resolve_checkpoint
        from gradlab.evaluation.runner import parse_spec
        from gradlab.share.export import export_checkpoint

        resolved = resolve_checkpoint(checkpoint)
        spec = parse_spec(resolved.spec, source=resolved.spec_source)
        written, files, why = export_checkpoint(resolved.path, spec, out, fmt=fmt)
    except GradlabError as e:
        fail(str(e))
    if why:
        err_console.print(f"rl-zoo3 cannot build {spec.environment.provider}:{spec.environment.env_id} ({why}); "
                          f"exported the SB3 files only", highlight=False)
    for path in files:
        err_console.print(f"wrote {escape(str(path))}", highlight=False)
    if written == "rl-zoo":
        algo = spec.recipe.train.backend.id.split(".", 1)[1]
        err_console.print(f"play it: python -m rl_zoo3.enjoy --algo {algo} --env {spec.environment.env_id} "
                          f"-f {escape(str(out))} --exp-id 1", highlight=False)
    if json_out:
        print_json(json.loads((Path(out) / "gradlab_export.json").read_text()))
