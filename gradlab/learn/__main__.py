"""``python -m gradlab.learn --spec RUN_SPEC.json --run-dir DIR [--resume-from CHECKPOINT_DIR]``.

Exit status: 0 after ``learner_finished`` (budget, stop request, SIGTERM, early stop, or
``supervisor_lost``: the parent process that started it is gone); 2 for a bad spec or checkpoint
(nothing trained); 1 for anything else.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gradlab.learn", description="The gradlab learner process.")
    parser.add_argument("--spec", required=True, type=Path, help="RUN_SPEC.json (gradlab.contracts.run_spec.RunSpec).")
    parser.add_argument("--run-dir", required=True, type=Path, help="Run directory (outbox.sqlite, checkpoints/).")
    parser.add_argument("--resume-from", type=Path, default=None, help="Checkpoint folder to continue from.")
    parser.add_argument("--stop-at-step", type=int, default=None, help="Stop (as if requested) at the first boundary at or past N steps.")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="The supervising process; the learner stops (supervisor_lost) once it is gone.")
    parser.add_argument("--await-supervisor", action="store_true",
                        help="Take the first step only once the outbox says its attempt's supervisor is watching.")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from pydantic import ValidationError

    from gradlab.contracts.run_spec import RunSpec
    from gradlab.errors import PermanentError
    from gradlab.learn.learner import run_learner

    try:
        spec = RunSpec.model_validate_json(args.spec.read_bytes())
    except (OSError, ValidationError) as e:
        print(f"{args.spec}: not a valid run spec: {e}", file=sys.stderr)
        return 2
    try:
        result = run_learner(spec, args.run_dir, resume_from=args.resume_from,
                             stop_at_step=args.stop_at_step, parent_pid=args.parent_pid,
                             await_supervisor=args.await_supervisor)
    except PermanentError as e:
        print(f"gradlab.learn: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result.as_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
