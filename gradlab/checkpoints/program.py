"""Action programs: the evaluable artifact of a search backend (``gradlab.go_explore``, ``gradlab.jerk``).

A search run's checkpoint holds the best retained action program instead of network weights, in
the same files so evaluation, acceptance, promotion and receipts work unchanged
(docs/ARCHITECTURE.md section 12a):

* ``policy.safetensors``: one int64 tensor ``gradlab.program.actions`` of shape (L,), the
  discrete actions from reset, in order;
* ``policy_spec.json``: :class:`ProgramSpec` (``format: gradlab.program/1``), which
  :func:`gradlab.checkpoints.load_policy` recognises;
* ``policy.zip``: ``program.json`` (the spec and the actions as JSON) in a deterministic zip, the
  policy file whose sha256 names the checkpoint. It is not a stable-baselines3 model.

:class:`ProgramPolicy` replays the program open loop: lane ``l``'s ``t``-th action of an episode is
``actions[t]`` (action 0 past the end), whatever the observation, so a deterministic goal's every
manifest episode follows the same trajectory.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from gradlab.checkpoints.manifest import POLICY_FILE, POLICY_SPEC_FILE, WEIGHTS_FILE
from gradlab.errors import ContractViolation

PROGRAM_FORMAT = "gradlab.program/1"
ACTIONS_KEY = "gradlab.program.actions"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


class ProgramSpec(BaseModel):
    """``policy_spec.json`` of a search backend's checkpoint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["gradlab.program/1"] = PROGRAM_FORMAT
    backend_id: str
    algorithm: str
    n_actions: int = Field(ge=1, description="Size of the Discrete action space the program indexes.")
    length: int = Field(ge=0, description="Actions in the program.")
    completed: bool = Field(description="Whether the program's trajectory ended in success when it was found.")
    return_: float = Field(alias="return", description="Shaped return of the program's trajectory when found.")


def save_program_files(folder: Path, actions: list[int], spec: ProgramSpec) -> None:
    """Write ``policy.safetensors``, ``policy_spec.json`` and ``policy.zip`` for ``actions`` into ``folder``."""
    from safetensors.numpy import save_file

    arr = np.asarray(actions, dtype=np.int64).reshape(-1)
    if arr.size != spec.length:
        raise ContractViolation(f"action program: spec says {spec.length} actions, found {arr.size}")
    save_file({ACTIONS_KEY: arr}, str(folder / WEIGHTS_FILE))
    spec_json = spec.model_dump_json(by_alias=True, indent=2)
    (folder / POLICY_SPEC_FILE).write_text(spec_json)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        info = zipfile.ZipInfo("program.json", date_time=_ZIP_TIME)
        info.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(info, json.dumps({"spec": json.loads(spec_json), "actions": arr.tolist()}, sort_keys=True))
    (folder / POLICY_FILE).write_bytes(buf.getvalue())


def is_program(spec_json: dict[str, Any]) -> bool:
    """Whether a parsed ``policy_spec.json`` describes an action program."""
    return spec_json.get("format") == PROGRAM_FORMAT


class ProgramPolicy:
    """Open-loop replay of an action program, per lane (see the module docstring).

    The evaluation runner calls :meth:`after_step` with every step's result, so each lane's step
    counter restarts when its episode ends.
    """

    def __init__(self, spec: ProgramSpec, actions: np.ndarray):
        self.spec = spec
        self.actions = np.asarray(actions, dtype=np.int64).reshape(-1)
        self._t: np.ndarray | None = None

    def act(self, obs: np.ndarray, *, deterministic: bool = True, rng: np.random.Generator | None = None) -> np.ndarray:
        """(N, *obs_shape) observations -> (N,) int64 actions: ``actions[t]`` per lane, 0 past the end."""
        n = len(obs)
        if self._t is None or len(self._t) != n:
            self._t = np.zeros(n, dtype=np.int64)
        out = np.zeros(n, dtype=np.int64)
        inside = self._t < len(self.actions)
        out[inside] = self.actions[self._t[inside]]
        return out

    def after_step(self, result: Any) -> None:
        """Advance every lane's step counter; a lane whose episode ended starts the program again."""
        if self._t is None:
            return
        self._t += 1
        for ep in result.episodes:
            self._t[ep.lane] = 0

    def reset(self) -> None:
        """Forget the lanes' step counters (a new evaluation)."""
        self._t = None


def load_program(path: Path, spec_json: dict[str, Any]) -> ProgramPolicy:
    """The :class:`ProgramPolicy` of a checkpoint folder (files already verified).

    Raises:
        ContractViolation: the tensor is missing or its length is not the spec's.
    """
    from safetensors.numpy import load_file

    spec = ProgramSpec.model_validate(spec_json)
    tensors = load_file(str(path / WEIGHTS_FILE))
    if ACTIONS_KEY not in tensors:
        raise ContractViolation(f"{path / WEIGHTS_FILE}: no tensor {ACTIONS_KEY!r} (an action program's)")
    actions = tensors[ACTIONS_KEY]
    if actions.ndim != 1 or actions.size != spec.length:
        raise ContractViolation(f"{path / WEIGHTS_FILE}: {ACTIONS_KEY} has shape {actions.shape}, the spec says ({spec.length},)")
    return ProgramPolicy(spec, actions)
