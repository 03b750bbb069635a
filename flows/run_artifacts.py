"""Prefect artifacts of a training-run flow run: the science in the Prefect UI (docs/ARCHITECTURE.md section 12).

Three artifacts per flow run, keyed by the run id so every attempt of a run groups under the same
keys: ``run-<run id>-progress`` (progress in % of the step budget, updated every few seconds; at
the end the run's final state: 100 % for a run that succeeded, also one that stopped early on
acceptance, the step's share of the budget otherwise, and the description says the outcome, the
step and why), ``run-<run id>-evaluations`` (one table per flow run whose rows are the evaluations
recorded so far: checkpoint step, return mean with its 95% interval, success rate, verdict; the
same artifact updated in place whenever a result arrives, so the Artifacts tab shows one table, not
a card per result) and ``run-<run id>-receipt`` (markdown of the terminal receipt and the
promotion, at the end).

Artifacts are a view: a failure to write one is logged and never disturbs the run.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

POLL_S = 2.0


def artifact_key(run_id: str, what: str) -> str:
    """``run-<run id, lower case>-<what>`` (Prefect keys allow lower-case letters, digits and dashes)."""
    return f"run-{run_id.lower()}-{what}"


def evaluation_rows(stores: Any, run_id: str) -> list[dict]:
    """One row per recorded evaluation of the run, by checkpoint step."""
    from gradlab.receipts import list_evaluations
    from gradlab.results.curves import mean_interval

    rows = []
    for intent, record in list_evaluations(stores, run_id):
        if record is None:
            rows.append({"checkpoint_step": intent.checkpoint_step, "return_mean": None, "ci95_low": None,
                         "ci95_high": None, "success_rate": None, "verdict": "pending"})
            continue
        agg = (record.result or {}).get("aggregates", {})
        interval = None
        if record.return_mean is not None:
            completed = agg.get("eval/acceptance/episodes/completed")
            interval = mean_interval(record.return_mean, agg.get("eval/episode/return/std"),
                                     int(completed) if completed is not None else None)
        rows.append({"checkpoint_step": record.checkpoint_step, "return_mean": record.return_mean,
                     "ci95_low": interval[0] if interval else None, "ci95_high": interval[1] if interval else None,
                     "success_rate": agg.get("eval/outcome/success/rate"), "verdict": record.status})
    return rows


def receipt_markdown(receipt: dict) -> str:
    """The terminal receipt and its promotion as markdown."""
    promo = receipt.get("promotion")
    lines = [f"# {receipt['run_id']} ({receipt['attempt_id']})", "",
             f"**{receipt['outcome']}**: {receipt['reason']}", "",
             "| field | value |", "|---|---|",
             f"| goal / recipe | {receipt['goal_id']} / {receipt['recipe_id']} |",
             f"| seed | {receipt['seed']} |", f"| final step | {receipt['final_step']} |",
             f"| checkpoints | {len(receipt['checkpoints'])} |",
             f"| promotion | {'step ' + str(promo['checkpoint_step']) + ' (`' + promo['sha256'][:16] + '`)' if promo else 'none'} |",
             f"| metrics | {receipt['metrics']['local_high_water']} events in the journal |",
             f"| sealed at | {receipt['sealed_at']} |", "",
             "| checkpoint step | status | return mean |", "|---|---|---|"]
    for e in receipt["evaluations"]:
        rm = e.get("return_mean")
        lines.append(f"| {e['checkpoint_step']} | {e['status']} | {'-' if rm is None else f'{rm:.3f}'} |")
    if promo:
        lines += ["", f"Play it: `gradlab play {receipt['run_id']}:{promo['checkpoint_step']}`", "",
                  f"Promoted checkpoint: `{promo['uri']}` sha256 `{promo['sha256']}`"]
    return "\n".join(lines) + "\n"


class RunArtifacts:
    """Keeps the progress and evaluations artifacts of one flow run current (a daemon thread).

    Use as a context manager around the driver: ``finish(receipt)`` writes the final artifacts;
    leaving the block stops the updates in every case.
    """

    def __init__(self, spec: Any, paths: Any, stores: Any, poll_s: float = POLL_S):
        self.spec, self.paths, self.stores, self.poll_s = spec, paths, stores, poll_s
        self.run_id = spec.run_id
        self.timesteps = int(spec.recipe.train.timesteps)
        self._stop = threading.Event()
        self._progress_id = None
        self._table_id = None
        self._rows: list[dict] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> RunArtifacts:
        ctx = contextvars.copy_context()  # the flow run context: artifacts link to this flow run
        self._thread = threading.Thread(target=ctx.run, args=(self._loop,), name=f"artifacts-{self.run_id}",
                                        daemon=True)
        self._thread.start()
        return self

    def __enter__(self) -> RunArtifacts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        """Stop the updates (also when the run raised before :meth:`finish`)."""
        self._stop.set()

    def _progress(self, step: int, *, final: dict | None = None) -> None:
        """Create or update the progress artifact: ``step`` of the budget, or a terminal receipt's final state."""
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        pct = max(0.0, min(100.0, 100.0 * step / max(1, self.timesteps)))
        description = f"{self.run_id}: step {step:,} of {self.timesteps:,}"
        if final is not None:
            description = (f"{self.run_id}: {final['outcome']} at step {step:,} of {self.timesteps:,} "
                           f"({pct:.1f} % of the budget): {final['reason']}")
            if final["outcome"] == "succeeded":  # done: also when it stopped early on acceptance
                pct = 100.0
        if self._progress_id is None:
            self._progress_id = create_progress_artifact(pct, key=artifact_key(self.run_id, "progress"),
                                                         description=description)
        else:
            update_progress_artifact(self._progress_id, pct, description=description)

    def _evaluations(self) -> None:
        """The evaluations table: created once per flow run, then updated in place when its rows change."""
        from prefect.artifacts import TableArtifact, create_table_artifact

        rows = evaluation_rows(self.stores, self.run_id)
        if rows == self._rows:
            return
        description = f"{self.run_id}: evaluations (95% interval of the return mean)"
        if self._table_id is None:
            self._table_id = create_table_artifact(rows, key=artifact_key(self.run_id, "evaluations"),
                                                   description=description)
        else:
            from prefect.client.orchestration import get_client
            from prefect.client.schemas.actions import ArtifactUpdate

            data = TableArtifact(table=rows).format(_sync=True)  # the form create_table_artifact stores
            get_client(sync_client=True).update_artifact(self._table_id, ArtifactUpdate(data=data, description=description))
        self._rows = rows

    def _loop(self) -> None:
        from gradlab.runs.progress import RunProgress

        progress = RunProgress(self.paths.outbox, self.timesteps)
        while True:
            try:
                self._progress(progress.refresh().step)
                self._evaluations()
            except Exception as e:  # noqa: BLE001 - a view only: the run goes on
                log.debug("artifacts of %s: %s", self.run_id, e)
            if self._stop.wait(self.poll_s):
                return

    def finish(self, receipt: dict) -> None:
        """Stop updating; write the final progress, evaluations and the receipt markdown."""
        from prefect.artifacts import create_markdown_artifact

        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self._progress(int(receipt.get("final_step") or 0), final=receipt)
            self._evaluations()
            create_markdown_artifact(receipt_markdown(receipt), key=artifact_key(self.run_id, "receipt"),
                                     description=f"{self.run_id}: terminal receipt ({receipt['outcome']})")
        except Exception as e:  # noqa: BLE001 - a view only
            log.warning("cannot write the Prefect artifacts of %s: %s", self.run_id, e)
