"""Warm start, the part both training backends share: the verified parent and its fitting tensors.

A run with ``spec.init_from`` (``gradlab train --init-from``, docs/ARCHITECTURE.md section 6)
starts from a parent checkpoint's weights. :func:`read_warm_start_parent` verifies the parent
against its manifest and the sha256 the run spec recorded, and returns its weights-only policy
tensors; :func:`check_warm_start_tensors` refuses a parent of another architecture, naming the
first tensor that does not fit. What else a backend loads (optimizer state, observation
statistics) is its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradlab.checkpoints.manifest import WEIGHTS_FILE
from gradlab.errors import ContractViolation
from gradlab.learn.resume_state import policy_tensors


def read_warm_start_parent(init: Any, *, extra: list[str]) -> tuple[Path, dict[str, Any]]:
    """The verified parent checkpoint folder of a warm start and its policy tensors (SB3's names).

    Every file the warm start reads (the weights-only policy, its spec, ``extra`` resume files) and
    every other file present is checked against the parent's manifest, and the manifest's policy
    sha256 against the one recorded in the run spec (``init.checkpoint_sha256``). A published
    repository's ``checkpoint/`` holds only the weights-only files (the rest was verified against
    its ``gradlab.json`` at download).

    Args:
        init: the run spec's ``init_from`` (``path``, ``checkpoint_sha256``).
        extra: further files the backend will read, relative to the checkpoint folder
            (``resume/optimizer.pt`` for ``sb3.*`` with ``--init-optimizer``).

    Returns:
        (folder, {tensor name: CPU tensor}) without gradlab's own entries.

    Raises:
        IntegrityError: a needed file is missing, a file differs from the manifest, or the parent is
            not the recorded sha256.
    """

    from gradlab.checkpoints.bundle import file_sha256, read_manifest
    from gradlab.checkpoints.manifest import POLICY_SPEC_FILE
    from gradlab.errors import IntegrityError

    path = Path(init.path)
    manifest = read_manifest(path)
    needed = [WEIGHTS_FILE, POLICY_SPEC_FILE, *extra]
    present = [rel for rel in manifest.files if (path / rel).is_file()]
    for rel in sorted(set(needed) | set(present)):
        entry = manifest.files.get(rel)
        if entry is None or not (path / rel).is_file():
            raise IntegrityError(f"{path / rel}: needed for the warm start but not in the checkpoint")
        digest = file_sha256(path / rel)
        if digest != entry.sha256:
            raise IntegrityError(f"{path / rel}: sha256 expected {entry.sha256}, found {digest}")
    if manifest.sha256 != init.checkpoint_sha256:
        raise IntegrityError(f"{path}: --init-from expected policy sha256 {init.checkpoint_sha256}, found {manifest.sha256}")
    return path, policy_tensors(path)

def check_warm_start_tensors(own: dict[str, Any], parent: dict[str, Any], *, source: str) -> None:
    """Refuse a parent whose tensors do not fit this policy, naming the first mismatching tensor.

    Args:
        own: this recipe's policy state dict (name -> tensor), in module order.
        parent: the parent checkpoint's tensors (gradlab's own ``gradlab.*`` entries removed).

    Raises:
        ContractViolation: ``--init-from SOURCE: tensor NAME: ...`` for the first tensor of ``own``
            missing from ``parent`` or of another shape, else the first extra tensor of ``parent``.
    """
    for name, tensor in own.items():
        if name not in parent:
            raise ContractViolation(f"--init-from {source}: tensor {name}: this recipe's policy has it "
                                    f"{tuple(tensor.shape)}, the parent checkpoint has no such tensor (another architecture)")
        if tuple(parent[name].shape) != tuple(tensor.shape):
            raise ContractViolation(f"--init-from {source}: tensor {name}: shape expected {tuple(tensor.shape)} "
                                    f"(this recipe's policy), found {tuple(parent[name].shape)} in the parent checkpoint")
    extra = [name for name in parent if name not in own]
    if extra:
        raise ContractViolation(f"--init-from {source}: tensor {extra[0]}: in the parent checkpoint but not in this "
                                "recipe's policy (another architecture)")


