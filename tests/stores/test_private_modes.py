"""A new home and its file stores are private (0700 folders, 0600 files) unless shared (issue: run integrity)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradlab.stores import open_store


@pytest.fixture
def umask_022() -> Iterator[None]:
    """A typical login umask for the test, restored afterwards (the umask is process-wide)."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        out[path.relative_to(root).as_posix()] = stat.S_IMODE(path.stat().st_mode)
    return out


def _write(store) -> None:
    store.put_create_only("runs/r/spec.json", b"{}")
    store.put_if_match("runs/r/lease.json", b"{}", None)
    store.put_verified("runs/r/checkpoints/x/policy.zip", b"zip")


def test_file_store_folders_and_files_are_private_whatever_the_umask(tmp_path: Path, umask_022: None) -> None:
    store = open_store((tmp_path / "new" / "control").as_uri())
    _write(store)
    modes = _modes(tmp_path / "new")
    assert modes and {p: m for p, m in modes.items() if (tmp_path / "new" / p).is_dir() and m != 0o700} == {}
    assert {p: m for p, m in modes.items() if (tmp_path / "new" / p).is_file() and m != 0o600} == {}


def test_shared_permissions_is_an_opt_in(tmp_path: Path, umask_022: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADLAB_SHARED_PERMISSIONS", "1")
    store = open_store((tmp_path / "control").as_uri())
    _write(store)
    assert stat.S_IMODE((tmp_path / "control" / "runs" / "r" / "spec.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "control" / "runs").stat().st_mode) == 0o755


def test_a_new_home_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI from a fresh home: everything it creates (home, stores, run directory, outbox) is 0700/0600."""
    home = tmp_path / "fresh-home"
    monkeypatch.setenv("GRADLAB_HOME", str(home))
    script = (
        "import os, sys; os.umask(0o022); sys.argv = ['gradlab', 'runs', 'list']\n"
        "from gradlab.cli.app import _secure_home; _secure_home()\n"
        "from gradlab.settings import load_settings\n"
        "from gradlab.stores import open_stores\n"
        "from gradlab import receipts as rules\n"
        "from gradlab.runs.operations import prepare_spec\n"
        "spec, paths = prepare_spec(load_settings(), recipe='gradlab__bandit/ppo')\n"
        "rules.open_run(open_stores(), spec)\n"
        "from gradlab.outbox import Outbox\n"
        "Outbox(paths.outbox).append('metrics', 0, {'metrics': {}})\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    modes = _modes(home)
    assert any(p.endswith("outbox.sqlite") for p in modes) and any(p.endswith("run.json") for p in modes)
    wrong = {p: f"{m:04o}" for p, m in modes.items()
             if m != (0o700 if (home / p).is_dir() else 0o600)}
    assert wrong == {}


def test_an_existing_home_open_to_others_is_made_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A home made earlier with a login umask (0755, its runs 0755/0644) is closed to others by any command."""
    home = tmp_path / "old-home"
    (home / "runs" / "r").mkdir(parents=True)
    (home / "runs" / "r" / "run.json").write_text("{}")
    for folder in (home, home / "runs", home / "runs" / "r"):
        folder.chmod(0o755)
    monkeypatch.setenv("GRADLAB_HOME", str(home))
    script = ("import sys; sys.argv = ['gradlab', 'runs', 'list']\n"
              "from gradlab.cli.app import _secure_home; _secure_home()\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert stat.S_IMODE(home.stat().st_mode) == 0o700  # nothing below it is reachable by others now
    assert (home / "runs" / "r" / "run.json").read_text() == "{}"  # and nothing in it is touched
