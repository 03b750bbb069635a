"""Reading an offline W&B run back from its ``.wandb`` files: what :class:`gradlab.metrics.wandb_sink.WandbSink`
wrote, for tests, ``gradlab`` results and the sync of offline segments (docs/ARCHITECTURE.md section 10).

:func:`offline_segments` lists a run's offline folders (one per ``wandb.init``), :func:`read_offline_history`
the logged rows, :func:`read_offline_run` the run's settings; :func:`wait_for_exit_record` waits for the
exit record that marks a closed run.
"""

from __future__ import annotations

import re
import struct
import time
from pathlib import Path
from typing import Any

# -- reading offline runs back -----------------------------------------------------------------
# W&B's transaction log (.wandb) is LevelDB-log framed: a 7-byte file header (":W&B", magic 0xBEE1,
# version 0), then 32 KiB blocks of records, each with a 7-byte header (crc32 u32, length u16,
# type u8: 1 full, 2 first, 3 middle, 4 last) and a protobuf ``wandb.proto.Record`` payload.
# Source: wandb/sdk/internal/datastore.py (wandb <= 0.18), still the format written by wandb-core.
_FILE_HEADER = b":W&B\xe1\xbe\x00"
_BLOCK = 32768
_RECORD_HEADER = 7


def _records(data: bytes, where: str) -> list[bytes]:
    if not data.startswith(_FILE_HEADER):
        raise ValueError(f"{where}: not a W&B transaction log (header {data[:7]!r})")
    out, pending, pos = [], b"", len(_FILE_HEADER)
    while pos + _RECORD_HEADER <= len(data):
        left_in_block = _BLOCK - pos % _BLOCK
        if left_in_block < _RECORD_HEADER:
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _RECORD_HEADER])
        pos += _RECORD_HEADER
        if pos + length > len(data):  # a record still being written
            break
        chunk, pos = data[pos : pos + length], pos + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
            pending = b""
    return out


def _record_types(path: Path) -> list[str]:
    from wandb.proto import wandb_internal_pb2

    types = []
    for payload in _records(path.read_bytes(), str(path)):
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(payload)
        except Exception:  # noqa: BLE001 - a partially written record
            break
        types.append(record.WhichOneof("record_type"))
    return types


def wait_for_exit_record(run_folder: Path, deadline: float) -> bool:
    """Poll an offline run's ``.wandb`` file until its ``exit`` record is written (or the deadline)."""
    while True:
        for path in run_folder.glob("run-*.wandb"):
            if "exit" in _record_types(path):
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def offline_segments(dir: Path | str, run_id: str) -> list[Path]:
    """``<dir>/wandb/offline-run-<yyyymmdd_hhmmss>-<run_id>[-<n>]`` folders of ``run_id``, oldest first."""
    # ``-<n>`` is added when several start in one second.
    pattern = re.compile(rf"(?:offline-)?run-(\d{{8}}_\d{{6}})-{re.escape(run_id)}(?:-(\d+))?")
    folders = []
    for folder in Path(dir).glob("wandb/*run-*"):
        match = pattern.fullmatch(folder.name)
        if match and folder.is_dir():
            folders.append(((match.group(1), int(match.group(2) or 0)), folder))
    return [folder for _, folder in sorted(folders)]


def read_offline_history(dir: Path | str, run_id: str) -> list[dict[str, Any]]:
    """Every history row logged for ``run_id`` under ``<dir>/wandb/``, across offline run folders.

    Returns:
        Rows in folder (time) then log order; each a dict metric name → value plus ``_step``.
    """
    import json

    from wandb.proto import wandb_internal_pb2

    rows: list[dict[str, Any]] = []
    for folder in offline_segments(dir, run_id):
        path = folder / f"run-{run_id}.wandb"
        if not path.exists():
            continue
        for payload in _records(path.read_bytes(), str(path)):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            if record.WhichOneof("record_type") != "history":
                continue
            row: dict[str, Any] = {}
            for item in record.history.item:
                name = item.key or "/".join(item.nested_key)
                row[name] = json.loads(item.value_json)
            row.setdefault("_step", record.history.step.num)
            rows.append(row)
    return rows


def read_offline_run(dir: Path | str, run_id: str) -> dict[str, Any] | None:
    """The run record of ``run_id``'s newest offline segment under ``<dir>/wandb/``, or None without one.

    Returns:
        ``{"run_id", "project", "group", "name", "tags"}`` as W&B recorded them at ``init``.
    """
    from wandb.proto import wandb_internal_pb2

    for folder in reversed(offline_segments(dir, run_id)):
        path = folder / f"run-{run_id}.wandb"
        if not path.exists():
            continue
        for payload in _records(path.read_bytes(), str(path)):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            if record.WhichOneof("record_type") == "run":
                run = record.run
                return {"run_id": run.run_id, "project": run.project, "group": run.run_group,
                        "name": run.display_name, "tags": list(run.tags)}
    return None
