"""The stores as the commands read them: opened, or exit 1 with the store's message; a run's view
(:func:`gradlab.runs.view.run_view`), or exit 1 naming the store that has no such run."""

from __future__ import annotations

from typing import Any

from gradlab.cli.output import fail


def open_stores_or_exit() -> Any:
    """:func:`gradlab.stores.open_stores` of this machine's settings; exits 1 when they cannot be opened.

    Returns:
        :class:`gradlab.stores.Stores`.
    """
    from gradlab.stores import open_stores

    try:
        return open_stores()
    except Exception as e:  # noqa: BLE001 - reported with the store's own message
        fail(f"cannot open the stores: {e}")


def run_view_or_exit(stores: Any, run_id: str) -> dict[str, Any]:
    """:func:`gradlab.runs.view.run_view`; exits 1 with one line when the stores have no such run.

    Args:
        stores: :class:`gradlab.stores.Stores`.
        run_id: the run id.
    """
    from gradlab.errors import NotFound
    from gradlab.runs.view import run_view

    try:
        return run_view(stores, run_id)
    except NotFound as e:
        fail(str(e))
