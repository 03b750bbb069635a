"""The metric registry and METRICS.md agree; names are checked exactly or by template."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradlab.errors import ContractViolation
from gradlab.metrics.registry import REGISTRY, check_name, check_names, is_registered

METRICS_MD = Path(__file__).resolve().parents[2] / "METRICS.md"


def _table_rows() -> list[tuple[str, str, str, str]]:
    rows = []
    in_table = False
    for line in METRICS_MD.read_text().splitlines():
        if line.startswith("| name | meaning | unit | cadence |"):
            in_table = True
            continue
        if not in_table or not line.startswith("|"):
            continue
        if set(line.replace("|", "").strip()) <= {"-", " "}:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"METRICS.md row does not have 4 cells: {line}"
        rows.append((cells[0].strip("`"), cells[1], cells[2], cells[3]))
    return rows


def test_metrics_md_equals_registry() -> None:
    md = _table_rows()
    code = [(m.name, m.meaning, m.unit, m.cadence) for m in REGISTRY]
    assert len(md) == len(set(md)), "METRICS.md lists a row twice"
    assert len({m.name for m in REGISTRY}) == len(REGISTRY), "registry lists a name twice"
    assert sorted(set(md) - set(code)) == [], "rows in METRICS.md but not in the registry"
    assert sorted(set(code) - set(md)) == [], "registry entries missing from METRICS.md"


def test_exact_and_template_matching() -> None:
    assert check_name("train/global_step").unit == "steps"
    assert is_registered("train/algorithm/ppo/update/approx_kl")
    assert is_registered("train/algorithm/a2c/policy/entropy")
    assert check_name("train/episode/reason/native_time_limit/count").name == "train/episode/reason/{reason}/count"
    # A placeholder matches exactly one path segment.
    assert not is_registered("train/algorithm/ppo/extra/update/approx_kl")
    assert not is_registered("train/algorithm//update/approx_kl")
    assert not is_registered("train/global_steps")
    with pytest.raises(ContractViolation, match="train/globl_step"):
        check_name("train/globl_step")
    with pytest.raises(ContractViolation, match="a/b, c/d"):
        check_names(["train/global_step", "c/d", "a/b"])


def test_every_template_uses_known_placeholders() -> None:
    for m in REGISTRY:
        m.pattern()  # raises ContractViolation for an unknown placeholder
        assert m.unit and m.cadence and m.meaning.endswith(".")
