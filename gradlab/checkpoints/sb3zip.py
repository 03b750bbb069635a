"""The one writer of ``policy.zip``: a self-contained, deterministic stable-baselines3 zip.

``write_sb3_zip`` writes what ``BaseAlgorithm.save`` writes (the ``data`` JSON, ``policy.pth``,
``policy.optimizer.pth``, ``pytorch_variables.pth``, ``_stable_baselines3_version``,
``system_info.txt``), so ``PPO.load`` / ``A2C.load`` read it, with three differences
(docs/ARCHITECTURE.md section 6):

* nothing of gradlab is pickled: gradlab's schedules become SB3's own ``FloatSchedule`` over
  ``ConstantSchedule`` / ``LinearSchedule`` (same values), so the zip loads where gradlab is not
  installed;
* the bytes depend only on the model's state: entries in a fixed order with a fixed timestamp
  (1980-01-01) and mode, ``start_time`` zeroed, the episode-info windows emptied (they hold wall
  times), spaces pickled without their sampling generator (its ``repr`` holds a memory address),
  the memory addresses cut from the readable ``repr`` of each pickled value's attributes (SB3
  writes them beside ``:serialized:`` and never reads them back; they differ between processes),
  and a ``system_info.txt`` with library versions only (no OS, host or GPU);
* a value whose type comes from gradlab that cannot be translated is refused
  (:class:`~gradlab.errors.ContractViolation`) rather than pickled.
"""

from __future__ import annotations

import copy
import io
import platform
import re
import zipfile
from collections import deque
from pathlib import Path
from typing import Any

from gradlab.errors import ContractViolation

ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)
"""The timestamp of every entry (the earliest a zip can hold)."""
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _sb3_schedule(value: Any) -> Any:
    """SB3's schedule for a gradlab ``ConstantFn`` / ``LinearFn`` (other values unchanged)."""
    from stable_baselines3.common.utils import ConstantSchedule, FloatSchedule, LinearSchedule

    if isinstance(value, FloatSchedule):
        inner = _sb3_schedule(value.value_schedule)
        return value if inner is value.value_schedule else FloatSchedule(inner)
    module = type(value).__module__ or ""
    if not module.startswith("gradlab"):
        return value
    if hasattr(value, "initial") and hasattr(value, "final"):
        # LinearSchedule(start, end, 1.0)(p) = start + (1 - p) * (end - start), LinearFn's line.
        return FloatSchedule(LinearSchedule(float(value.initial), float(value.final), 1.0))
    if hasattr(value, "value"):
        return FloatSchedule(ConstantSchedule(float(value.value)))
    raise ContractViolation(f"policy.zip: cannot store {module}.{type(value).__name__} without pickling gradlab")


def _plain_space(space: Any) -> Any:
    """A copy of a gymnasium space without its lazily created sampling generator."""
    if space is None or not hasattr(space, "_np_random"):
        return space
    out = copy.copy(space)
    out._np_random = None
    if hasattr(out, "spaces"):  # Dict / Tuple
        inner = out.spaces
        out.spaces = type(inner)({k: _plain_space(v) for k, v in inner.items()}) if isinstance(inner, dict) \
            else tuple(_plain_space(s) for s in inner)
    return out


def _zip_data(model: Any) -> dict[str, Any]:
    """The ``data`` entry's dict: ``BaseAlgorithm.save``'s selection, made gradlab-free and deterministic."""
    data = model.__dict__.copy()
    exclude = set(model._excluded_save_params())
    state_dicts, torch_vars = model._get_torch_save_params()
    exclude.update(name.split(".")[0] for name in state_dicts + torch_vars)
    for name in exclude:
        data.pop(name, None)
    for key, value in list(data.items()):
        data[key] = _sb3_schedule(value)
    data["start_time"] = 0
    for key in ("ep_info_buffer", "ep_success_buffer"):
        if isinstance(data.get(key), deque):
            data[key] = deque(maxlen=data[key].maxlen)
    for key in ("observation_space", "action_space"):
        data[key] = _plain_space(data.get(key))
    for key, value in data.items():
        module = type(value).__module__ or ""
        if module.startswith("gradlab"):
            raise ContractViolation(f"policy.zip: data.{key} is a gradlab {type(value).__name__}; refusing to pickle it")
    return data


def _system_info() -> str:
    from importlib import metadata

    lines = [f"- Python: {platform.python_version()}"]
    for label, dist in (("Stable-Baselines3", "stable-baselines3"), ("PyTorch", "torch"),
                        ("Numpy", "numpy"), ("Cloudpickle", "cloudpickle"), ("Gymnasium", "gymnasium")):
        try:
            lines.append(f"- {label}: {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    return "\n".join(lines) + "\n"


def _entry(name: str) -> zipfile.ZipInfo:
    """A member written as SB3 reads it; tensors (``*.pth``) stored, not deflated: float weights and
    optimizer moments shrink by ~7% at ~25 ms of CPU per MB (0.17 s of every Breakout checkpoint),
    and torch's own ``torch.save`` archive inside is uncompressed anyway."""
    info = zipfile.ZipInfo(name, date_time=ZIP_DATE_TIME)
    info.compress_type = zipfile.ZIP_STORED if name.endswith(".pth") else zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    info.create_system = 3  # unix, whatever the host
    return info


def sb3_zip_bytes(model: Any) -> bytes:
    """The bytes of the SB3 zip of an SB3 model (see the module docstring).

    Raises:
        ContractViolation: a value of gradlab's own type that has no SB3 equivalent.
    """
    import stable_baselines3 as sb3
    import torch
    from stable_baselines3.common.save_util import data_to_json, recursive_getattr

    # " at 0x7f..." in a repr differs per process; base64 (":serialized:") holds no space, so only reprs change.
    serialized = _ADDRESS.sub("", data_to_json(_zip_data(model)))
    state_dicts, torch_vars = model._get_torch_save_params()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, mode="w") as archive:
        archive.writestr(_entry("data"), serialized)
        members = [("pytorch_variables", {name: recursive_getattr(model, name) for name in torch_vars})]
        members += [(name, getattr(recursive_getattr(model, name), "_orig_mod", recursive_getattr(model, name)).state_dict())
                    for name in state_dicts]
        for name, obj in members:
            inner = io.BytesIO()
            torch.save(obj, inner)
            archive.writestr(_entry(f"{name}.pth"), inner.getvalue())
        archive.writestr(_entry("_stable_baselines3_version"), sb3.__version__)
        archive.writestr(_entry("system_info.txt"), _system_info())
    return buf.getvalue()


def write_sb3_zip(model: Any, path: Path) -> None:
    """Write :func:`sb3_zip_bytes` of ``model`` to ``path`` (the caller fsyncs and hashes it)."""
    Path(path).write_bytes(sb3_zip_bytes(model))
