"""The ``gradlab`` console script (also ``python -m gradlab.cli``).

Before the application's imports, a fresh shell's ``gradlab train REF`` starts the background
daemon (:mod:`gradlab.cli.early`); then :func:`gradlab.cli.app.main` runs the command.
"""

from __future__ import annotations

import sys


def main() -> None:
    """The console script (``gradlab``)."""
    from gradlab.cli.early import start_daemon_early

    start_daemon_early(sys.argv[1:])
    from gradlab.cli.app import main as app_main

    app_main()


if __name__ == "__main__":
    main()
