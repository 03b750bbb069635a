"""The run lifecycle on one machine: run directories, the learner child process, the supervisor's
bookkeeping. Plain functions and classes, tested without Prefect; ``tasks/`` and ``flows/`` wrap them.

Public names:
    RunPaths: where a run's local files live.
    LearnerProcess: start, watch and stop the learner (its own process group).
    Supervisor: the supervisor's state machine over outbox events, publications and evaluations.
"""

from gradlab.runs.paths import RunPaths
from gradlab.runs.process import LearnerProcess

__all__ = ["LearnerProcess", "RunPaths"]
