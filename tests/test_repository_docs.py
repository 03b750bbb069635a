"""The repository explains itself: every document a tracked file cites is in the repository.

Code and docs cite ``docs/ARCHITECTURE.md section N`` (N in 1-13, the section numbers of its
headings) and ``docs/ARCHITECTURE.md, field notes`` (its appendix); any other ``*.md`` name a file
mentions must resolve to a file of the checkout, from the repository root or from the citing
file's folder.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"

#: ``*.md`` names that are not documents: stable-retro Genesis ROM files (``.md`` is the Mega
#: Drive ROM extension) that ``tests/envs/test_cli_roms.py`` creates and imports.
_NOT_DOCUMENTS = {"airstriker.md", "rom.md", "missing.md"}

_MD_NAME = re.compile(r"(?<![\w./-])((?:\.\./|[\w.-]+/)*[\w.-]+\.md)\b")
_SECTION_CITE = re.compile(r"docs/ARCHITECTURE\.md,? section (\d+)")
_TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".json", ".txt", ".js", ".html", ".css", ".cfg", ".ini", ""}


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an unpacked sdist)
        skip = {".venv", ".git", "test-artifacts", "__pycache__"}
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.parts)]
    files = [ROOT / n for n in names]
    this = Path(__file__).resolve()  # names the missing documents on purpose
    return [p for p in files if p.is_file() and p.suffix in _TEXT_SUFFIXES and p.name != "uv.lock" and p.resolve() != this]


def _citations() -> list[tuple[Path, int, str]]:
    found = []
    for path in _tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in _MD_NAME.finditer(line):
                found.append((path, lineno, m.group(1)))
    return found


def _architecture_sections() -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^## (\d+)\. (.+)$", ARCHITECTURE.read_text(), re.M)}


def test_every_cited_document_is_in_the_repository():
    citations = _citations()
    assert any(name == "docs/ARCHITECTURE.md" for _, _, name in citations)  # the scan sees real citations
    missing = []
    for path, lineno, name in citations:
        if Path(name).name in _NOT_DOCUMENTS or name.startswith("../.."):
            continue
        if not ((ROOT / name).is_file() or (path.parent / name).is_file()):
            missing.append(f"{path.relative_to(ROOT)}:{lineno}: cites {name}, which the repository does not contain")
    assert not missing, "\n".join(missing)


def test_design_document_outside_the_repository_is_never_cited():
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p, n, name in _citations() if Path(name).name in
                 {"DESIGN.md", "FIELD-NOTES.md", "interfaces.md"}]
    assert not offenders, offenders


def test_architecture_keeps_sections_1_to_13_and_every_cited_section_exists():
    sections = _architecture_sections()
    assert sorted(sections) == list(range(1, 14))
    assert sections[8] == "The training-run flow" and sections[13] == "Configuration and secrets"
    assert re.search(r"^## Appendix: field notes$", ARCHITECTURE.read_text(), re.M)
    bad = []
    for path in _tracked_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        bad += [f"{path.relative_to(ROOT)}: section {n}" for n in _SECTION_CITE.findall(text) if int(n) not in sections]
    assert not bad, bad


@pytest.mark.parametrize("name", ["docs/ARCHITECTURE.md, section 99", "see DESIGN.md section 8"])
def test_the_checks_catch_a_bad_citation(name, tmp_path):
    """The patterns the tests above rely on do match a bad citation (so an empty scan cannot pass)."""
    line = f"# {name}"
    if "99" in name:
        assert [int(n) for n in _SECTION_CITE.findall(line)] == [99] and 99 not in _architecture_sections()
    else:
        names = [m.group(1) for m in _MD_NAME.finditer(line)]
        assert names == ["DESIGN.md"] and not (ROOT / "DESIGN.md").exists()
