"""``gradlab runs sync RUN``: one W&B history for a run, rebuilt from its journal's surviving lineage.

A run with several attempts leaves one offline W&B folder per attempt, all with the run's id;
``wandb sync`` of them as they are keeps only the last one's history, so the terminal receipt
reports such a run's W&B state as pending (:meth:`gradlab.metrics.wandb_sink.WandbSink.complete`).
This module rebuilds the history once, from the journal (the always-complete local record):
every line of the surviving lineage (:meth:`gradlab.metrics.journal.Journal.read`), in order,
into one fresh offline run under ``<run_dir>/wandb-sync/``, then uploads that single folder with
``wandb sync`` (docs/ARCHITECTURE.md section 10). W&B's step (and ``orchestration/event_seq``) is
the line's position (1..N), so it stays monotonic even when a replaced outbox restarted
``event_seq``; ``train/*`` curves are drawn against ``train/global_step``.

``<run_dir>/wandb-sync/synced.json`` records what was uploaded: ``{"run_id", "points", "folder",
"synced_at"}``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from gradlab.errors import GradlabError

SYNC_DIR = "wandb-sync"
SYNCED_FILE = "synced.json"


class SyncFailed(GradlabError):
    """``wandb sync`` did not upload the rebuilt history (no key, no network, a W&B error)."""


def rebuild_history(run_dir: Path, run_id: str, project: str, *, entity: str | None = None) -> tuple[Path, int]:
    """Write the journal's surviving lineage as one offline W&B run (an earlier rebuild is replaced).

    Returns:
        (the offline run folder, number of points).

    Raises:
        SyncFailed: W&B could not write the offline run (its error).
        NotFound: the run folder has no journal.
    """
    from gradlab.errors import NotFound
    from gradlab.metrics.journal import Journal
    from gradlab.metrics.wandb_sink import WandbSink, offline_segments

    run_dir = Path(run_dir)
    journal = run_dir / "journal.jsonl"
    try:  # read-only: a live run may be appending to it (a torn last line is left out, not cut)
        entries = Journal(journal, readonly=True).read()
    except FileNotFoundError:
        raise NotFound(f"{journal}: no metrics journal (the run wrote no metrics on this machine)") from None
    target = run_dir / SYNC_DIR
    shutil.rmtree(target, ignore_errors=True)
    sink = WandbSink(run_id, "offline", target, project, {"rebuilt_from": "journal"}, entity=entity)
    for n, entry in enumerate(entries, start=1):
        if not sink.log(n, entry.metrics):  # W&B's step (and orchestration/event_seq) is the position n
            break
    sink.finish()
    if sink.status != "ok":
        raise SyncFailed(f"{target}: the rebuilt W&B history could not be written: {sink.error}")
    [folder] = offline_segments(target, run_id)
    return folder, len(entries)


def upload(folder: Path, run_id: str, project: str, *, entity: str | None = None, timeout_s: float = 600) -> None:
    """``wandb sync --id RUN_ID -p PROJECT [-e ENTITY] FOLDER`` (needs ``WANDB_API_KEY`` and the network).

    Raises:
        SyncFailed: wandb sync exited non-zero or timed out (its last output line).
    """
    args = [sys.executable, "-m", "wandb", "sync", "--id", run_id, "-p", project]
    if entity:
        args += ["-e", entity]
    try:
        proc = subprocess.run([*args, str(folder)], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SyncFailed(f"{folder}: wandb sync did not finish in {timeout_s:g} s") from None
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        raise SyncFailed(f"{folder}: wandb sync exited with code {proc.returncode}: "
                         f"{lines[-1] if lines else 'no output'}")


def record_synced(run_dir: Path, run_id: str, folder: Path, points: int) -> Path:
    """Write ``synced.json`` after a successful upload; returns its path."""
    path = Path(run_dir) / SYNC_DIR / SYNCED_FILE
    path.write_text(json.dumps({"run_id": run_id, "points": points, "folder": str(folder),
                                "synced_at": datetime.now(UTC).isoformat()}, indent=1) + "\n")
    return path
