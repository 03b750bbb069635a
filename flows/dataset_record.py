"""The ``dataset-record`` flow: one recording, one Prefect task per chunk of its episode plan
(docs/ARCHITECTURE.md section 12).

Each ``record-chunk`` task runs its chunk in a local evaluation worker process
(:func:`gradlab.datasets.record.record_chunk_in_worker`), at most ``workers`` at a time; when every
chunk has finished, ``publish-dataset`` checks that every planned episode was recorded exactly once
and stores the files, then the manifest (create-only, last). A failed or killed recording stores no
manifest, so no dataset appears (a recording that finds its name taken when it publishes, by another
recording of the same name, ends Failed saying so, without a traceback); running it again records under a new recording id. The flow
holds its staging folder while it runs (:func:`gradlab.datasets.staging.claim_staging`); when it
starts and when it ends it removes the staging folders that earlier, ended recordings of the same
dataset name left behind (a killed one's included).
"""

from __future__ import annotations

import shutil
import time
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed
from prefect.task_runners import ThreadPoolTaskRunner

from flows._futures import task_finished
from flows._process import record_this_flow_run

#: Most chunks in flight in this process (the pool's threads; ``workers`` limits further).
MAX_THREADS = 32


@task(name="record-chunk", task_run_name="record-{plan[name]}-chunk-{chunk}", cache_policy=NO_CACHE,
      persist_result=False)
def record_chunk(plan: dict[str, Any], chunk: int) -> dict[str, Any]:
    """Record chunk ``chunk`` of the plan in a worker process; returns its ChunkResult JSON."""
    from gradlab.datasets.plan import RecordingPlan
    from gradlab.datasets.record import record_chunk_in_worker

    return record_chunk_in_worker(RecordingPlan.model_validate(plan), chunk).model_dump(mode="json")


@task(name="publish-dataset", task_run_name="publish-dataset-{plan[name]}", cache_policy=NO_CACHE,
      persist_result=False)
def publish(plan: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    """Store the recording's files and manifest; returns the manifest JSON, or ``{"conflict": message}``
    when a dataset of that name exists (another recording stored it first): an outcome, not a crash."""
    from gradlab.datasets.plan import ChunkResult, RecordingPlan
    from gradlab.datasets.store import publish_dataset
    from gradlab.errors import Conflict
    from gradlab.receipts.models import utcnow
    from gradlab.stores import open_dataset_store

    try:
        manifest = publish_dataset(open_dataset_store(), RecordingPlan.model_validate(plan),
                                   [ChunkResult.model_validate(r) for r in results], created_at=utcnow().isoformat())
    except Conflict as e:
        return {"conflict": str(e)}
    return manifest.as_json()


@flow(name="dataset-record", task_runner=ThreadPoolTaskRunner(max_workers=MAX_THREADS), persist_result=False,
      log_prints=False)
def dataset_record(plan: dict[str, Any], workers: int = 1) -> dict[str, Any]:
    """Record the plan's chunks on ``workers`` worker processes, then publish the dataset.

    Args:
        plan: a :class:`gradlab.datasets.plan.RecordingPlan` as JSON.
        workers: chunks recorded at once.

    Returns:
        The dataset's manifest JSON; a Failed state naming the dataset when one of that name was stored
        first (by another recording of the same name).
    """
    from gradlab.datasets.staging import claim_staging, clean_stale

    record_this_flow_run()
    claim = claim_staging(plan["staging_dir"], name=plan["name"], recording_id=plan["recording_id"])
    lost = False  # another recording stored the name first: this one's staged files serve nobody
    try:
        futures: list[Any] = []
        for chunk in range(len(plan["chunks"])):
            while sum(not task_finished(f) for f in futures) >= max(1, workers):
                time.sleep(0.1)
            futures.append(record_chunk.submit(plan, chunk))
        results = [f.result() for f in futures]
        stored = publish(plan, results)
        if "conflict" in stored:
            lost = True
            return Failed(message=stored["conflict"])
        return stored
    finally:
        claim.release()
        if lost:
            shutil.rmtree(claim.folder, ignore_errors=True)
        clean_stale(claim.folder.parent, name=claim.name, epoch=claim.epoch)
