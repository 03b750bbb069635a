"""A fresh shell's ``gradlab train`` starts the background daemon before the command-line
application is imported (docs/ARCHITECTURE.md section 11); the console script is
:mod:`gradlab.cli.__main__`.

The local Prefect server's start-up is the longest wait of a fresh shell's first run, and every
command's own imports (typer, click, every command group's options) come before its body. So
the console script looks at the arguments first: for ``gradlab train REF ...`` (not ``--help``) it
starts the daemon with the same checks ``gradlab train`` makes (:func:`start_daemon_early`), and
only then imports :mod:`gradlab.cli.app`. The command finds the daemon this process started
(:func:`take_started`) instead of starting one. A command whose options then turn out wrong has
started a server that stops after its idle timeout; the line saying so is printed at once.
"""

from __future__ import annotations

import os
import sys

#: Set in the warm flow's child's environment (the zygote's pid): that process never hands off again
#: (:mod:`gradlab.cli.warm_handoff`), nor starts a daemon. Here so that reading it imports nothing.
CHILD_ENV = "GRADLAB_WARM_FLOW"

_started: int | None = None


def _is_train(argv: list[str]) -> bool:
    """``train`` with a positional argument after it and no help option (typer's ``--help``)."""
    words = [a for a in argv if not a.startswith("-")]
    return len(words) >= 2 and argv[:1] == ["train"] and "--help" not in argv


def start_daemon_early(argv: list[str]) -> int | None:
    """For ``gradlab train REF ...``: the background daemon's pid when this process started it.

    None when the arguments are not a training command, when ``gradlab train`` would not start one
    (``GRADLAB_DAEMON=0``, a Prefect API of the user's, the warm flow's child, one already running
    or starting) or when the settings cannot be read: the command then does what it always did,
    and reports a broken configuration itself. Never raises.
    """
    global _started
    if not _is_train(argv) or os.environ.get("PREFECT_API_URL") or os.environ.get(CHILD_ENV):
        return None
    try:
        from gradlab.runs.server import STARTED_DAEMON_ENV, start_daemon
        from gradlab.settings import load_settings, secure_home

        settings = load_settings()
        if not settings.daemon or settings.prefect_api_url:
            return None
        secure_home(settings)
        pid = start_daemon(settings, say=lambda line: print(line, file=sys.stderr, flush=True))
    except Exception:  # noqa: BLE001 - the command itself starts the daemon, or says why it cannot
        return None
    if pid is not None:
        os.environ[STARTED_DAEMON_ENV] = str(pid)
    _started = pid
    return pid


def take_started() -> int | None:
    """The daemon this process started before the application was imported (once; then None)."""
    global _started
    pid, _started = _started, None
    return pid

