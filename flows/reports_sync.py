"""The ``reports-sync`` flow: build the static reports and publish them to a store
(docs/ARCHITECTURE.md sections 11 and 12); ``prefect.yaml`` schedules it (deployment ``reports-sync``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows._process import record_this_flow_run
from tasks._policy import RETRIES, RETRY_DELAYS_S, retry_transient


@task(name="build-reports", cache_policy=NO_CACHE, persist_result=False)
def build_reports(out: Path, goal: str | None) -> list[str]:
    """Build the site from the stores and local journals; returns its pages."""
    from gradlab.results.reports import build_site
    from gradlab.settings import load_settings
    from gradlab.stores import open_stores

    return list(build_site(load_settings(), open_stores(), out, goal=goal).pages)


@task(name="sync-reports", cache_policy=NO_CACHE, persist_result=False, retries=RETRIES,
      retry_delay_seconds=RETRY_DELAYS_S, retry_condition_fn=retry_transient)
def sync_reports(out: Path, store_url: str | None) -> dict:
    """Publish the built site: files create-only under the build hash, the index by compare-and-swap."""
    from gradlab.results.reports import reports_store_url, sync_site
    from gradlab.settings import load_settings
    from gradlab.stores import open_store

    return sync_site(out, open_store(store_url or reports_store_url(load_settings())))


@flow(name="reports-sync", persist_result=False, log_prints=False)
def reports_sync(goal: str | None = None, store_url: str | None = None) -> dict:
    """Build the reports (all goals, or ``goal``) and publish them to ``store_url``.

    Args:
        goal: one goal id; None: every goal with sealed runs.
        store_url: ``file://...`` or ``s3://bucket/prefix``; None: ``GRADLAB_REPORTS_STORE_URL``, else the model store.

    Returns:
        ``{"build", "files", "uploaded", "url", "index"}`` (:func:`gradlab.results.reports.sync_site`).
    """
    record_this_flow_run()  # the daemon tells a killed process from a live one
    with tempfile.TemporaryDirectory(prefix="gradlab-reports-") as tmp:
        out = Path(tmp) / "site"
        build_reports(out, goal)
        return sync_reports(out, store_url)
