"""Local layout of one run (under ``$GRADLAB_HOME/runs/<run_id>/``)::

    spec.json            the RunSpec the learner was started with
    outbox.sqlite        learner → supervisor events (WAL)
    checkpoints/         <step:012d>-<sha16>/ bundles written by the learner
    learner.log          the learner's stdout and stderr
    journal.jsonl        every metric delivered, one JSON line per outbox event
    wandb/               W&B's offline files
    attempts/<id>.json   the local copy of each attempt's terminal receipt
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def spec(self) -> Path:
        return self.root / "spec.json"

    @property
    def outbox(self) -> Path:
        return self.root / "outbox.sqlite"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def learner_log(self) -> Path:
        return self.root / "learner.log"

    @property
    def journal(self) -> Path:
        return self.root / "journal.jsonl"

    @property
    def wandb_dir(self) -> Path:
        return self.root / "wandb"

    def attempt_receipt(self, attempt_id: str) -> Path:
        return self.root / "attempts" / f"{attempt_id}.json"

    def ensure(self) -> RunPaths:
        self.root.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(exist_ok=True)
        return self
