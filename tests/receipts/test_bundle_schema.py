"""Only a checkpoint's own files are published: a retry publishing an earlier attempt's unpublished
checkpoint uploads exactly the bundle's files; anything planted in the folder is refused by name."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from gradlab.errors import IntegrityError
from gradlab.receipts import begin_attempt, open_run
from gradlab.stores import Stores
from tests.receipts.test_attempt_close import _local_checkpoint
from tests.receipts.test_receipts import RUN, T0, _spec


def _plant(folder: Path, rel: str, data: bytes) -> None:
    """An attacker with write access to the run directory adds a file and lists it in the manifest
    (the policy's sha256, the checkpoint's identity, is unchanged)."""
    (folder / rel).parent.mkdir(parents=True, exist_ok=True)
    (folder / rel).write_bytes(data)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size_bytes": len(data)}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _announce(paths, *checkpoints: tuple[int, Path, str]) -> None:
    from gradlab.outbox import Outbox

    outbox = Outbox(paths.outbox)
    for step, folder, sha in checkpoints:
        outbox.append("checkpoint_ready", step, {"step": step, "sha256": sha, "path": str(folder), "purpose": "final"})


def test_a_retry_publishes_exactly_the_bundles_files_and_refuses_a_planted_one(
        stores: Stores, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from gradlab.checkpoints import verify_checkpoint
    from gradlab.runs import operations
    from gradlab.runs.paths import RunPaths

    spec = _spec()
    paths = RunPaths(tmp_path / "run").ensure()
    open_run(stores, spec, now=T0)
    begin_attempt(stores, RUN, mode="fresh", ttl_s=1, now=T0)  # long expired: its process died
    good, good_sha = _local_checkpoint(paths.root, 256, b"policy-256")
    planted, planted_sha = _local_checkpoint(paths.root, 512, b"policy-512")
    _plant(planted, "resume/payload.pkl", b"\x80\x04cos\nsystem\n")
    assert verify_checkpoint(planted).sha256 == planted_sha  # its own manifest cannot tell
    _announce(paths, (256, good, good_sha), (512, planted, planted_sha))

    with caplog.at_level(logging.WARNING, logger="gradlab"):
        plan = operations.open_attempt(stores, spec, paths)
    assert [(c.step, c.sha256) for c in plan.unpublished] == [(256, good_sha)]  # the planted one is not resumed
    assert plan.resume_dir == good
    assert any(f"{planted / 'resume' / 'payload.pkl'}: not a file a checkpoint holds" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]

    # Published anyway (the folder as the retry would hand it over): refused by name, nothing uploaded.
    with pytest.raises(IntegrityError, match=r"resume/payload.pkl: not a file a checkpoint holds"):
        operations.publish(stores, RUN, plan.attempt.attempt_id, planted, epoch=plan.fence[1])
    assert not [k for k in stores.model.list("runs/") if "000000000512" in k]
    publication = operations.publish(stores, RUN, plan.attempt.attempt_id, good, epoch=plan.fence[1])
    assert sorted(publication.files) == ["manifest.json", "policy.zip", "resume/state.json"]
    assert sorted(k.rsplit("/checkpoints/", 1)[1].split("/", 1)[1] for k in stores.model.list("runs/")
                  if "/checkpoints/" in k) == ["manifest.json", "policy.zip", "resume/state.json"]
