"""Object keys of every receipt and bundle, in one place (the layout is documented in ``__init__``)."""

from __future__ import annotations

from gradlab.errors import ContractViolation

#: Longest key segment: a file name's limit on common filesystems (bytes, UTF-8).
MAX_SEGMENT_BYTES = 255


def _seg(value: str, what: str) -> str:
    if (not value or "/" in value or "\\" in value or value.startswith(".")
            or any(ord(c) < 32 for c in value) or len(value.encode()) > MAX_SEGMENT_BYTES):
        shown = value if len(value) <= 80 else value[:80] + f"... ({len(value)} characters)"
        raise ContractViolation(f"{what} {shown!r}: expected a non-empty name of at most {MAX_SEGMENT_BYTES} "
                                "bytes without '/', '\\', control characters or a leading '.'")
    return value


def checkpoint_name(step: int, sha256: str) -> str:
    """``<step:012d>-<sha16>``: the folder name of a checkpoint (steps zero-padded so names sort)."""
    if step < 0 or len(sha256) < 16:
        raise ContractViolation(f"checkpoint step {step} / sha256 {sha256!r}: expected step >= 0, a sha256 hex")
    return f"{step:012d}-{sha256[:16]}"


# -- control store ---------------------------------------------------------------------------
def run_prefix(run_id: str) -> str:
    return f"runs/{_seg(run_id, 'run id')}/"


def run_record(run_id: str) -> str:
    return run_prefix(run_id) + "run.json"


def run_spec(run_id: str) -> str:
    return run_prefix(run_id) + "spec.json"


def lease(run_id: str) -> str:
    return run_prefix(run_id) + "lease.json"


def stop_request(run_id: str) -> str:
    return run_prefix(run_id) + "stop.json"


def promotion(run_id: str) -> str:
    return run_prefix(run_id) + "promotion.json"


def attempts_prefix(run_id: str) -> str:
    return run_prefix(run_id) + "attempts/"


def attempt(run_id: str, attempt_id: str) -> str:
    return attempts_prefix(run_id) + f"{_seg(attempt_id, 'attempt id')}/attempt.json"


def terminal(run_id: str, attempt_id: str) -> str:
    return attempts_prefix(run_id) + f"{_seg(attempt_id, 'attempt id')}/terminal.json"


def publications_prefix(run_id: str) -> str:
    return run_prefix(run_id) + "publications/"


def publication(run_id: str, step: int, sha256: str) -> str:
    return publications_prefix(run_id) + checkpoint_name(step, sha256) + ".json"


# -- eval store ------------------------------------------------------------------------------
def evaluations_prefix(run_id: str) -> str:
    return run_prefix(run_id) + "evaluations/"


def evaluation_intent(run_id: str, intent_key: str) -> str:
    return evaluations_prefix(run_id) + f"{_seg(intent_key, 'intent key')}/intent.json"


def evaluation_result(run_id: str, intent_key: str) -> str:
    return evaluations_prefix(run_id) + f"{_seg(intent_key, 'intent key')}/result.json"


def baselines_prefix(goal_id: str) -> str:
    """``baselines/<goal_id>/``: reference policies' results on a goal's manifest (eval store).

    A nested goal id (``Family/Sub``) is one key segment per name, each checked.
    """
    return "baselines/" + "".join(f"{_seg(part, 'goal id')}/" for part in goal_id.split("/"))


def baseline_result(goal_id: str, baseline: str, manifest_sha256: str) -> str:
    """``baselines/<goal_id>/<baseline>-<manifest sha16>.json`` (eval store)."""
    return baselines_prefix(goal_id) + f"{_seg(baseline, 'baseline')}-{manifest_sha256[:16]}.json"


# -- model store -----------------------------------------------------------------------------
def checkpoint_prefix(run_id: str, step: int, sha256: str) -> str:
    return run_prefix(run_id) + f"checkpoints/{checkpoint_name(step, sha256)}/"


def checkpoint_file(run_id: str, step: int, sha256: str, name: str) -> str:
    return checkpoint_prefix(run_id, step, sha256) + name


def run_index(run_id: str) -> str:
    return run_prefix(run_id) + "index.json"


# -- dataset store ---------------------------------------------------------------------------
def dataset_prefix(name: str) -> str:
    """``datasets/<name>/``."""
    return f"datasets/{_seg(name, 'dataset name')}/"


def dataset_manifest(name: str) -> str:
    """``datasets/<name>/manifest.json``: written last, create-only; the dataset exists once it is there."""
    return dataset_prefix(name) + "manifest.json"


def dataset_file(name: str, recording_id: str, path: str) -> str:
    """``datasets/<name>/recordings/<recording_id>/<path>`` (``path`` as the manifest lists it)."""
    return dataset_prefix(name) + f"recordings/{_seg(recording_id, 'recording id')}/{path}"
