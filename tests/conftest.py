"""Shared fixtures: every test gets its own GRADLAB_HOME so nothing touches the user's data, and no
command under test starts a background Prefect server (GRADLAB_DAEMON=0)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.hub_stand_in import hub_stand_in  # noqa: F401 - the Hub stand-in fixture (tests/share, tests/datasets)

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(autouse=True)
def gradlab_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path_factory.mktemp("gradlab_home")
    monkeypatch.setenv("GRADLAB_HOME", str(home))
    monkeypatch.setenv("GRADLAB_CONFIG", str(home / "config.toml"))
    monkeypatch.setenv("WANDB_DIR", str(home / "wandb"))
    # No background Prefect server started by a command under test (gradlab.runs.server): each one
    # that needs Prefect uses the test's own server or Prefect's ephemeral one, so no test leaves a
    # daemon behind. The daemon's own tests (tests/cli/test_daemon.py) set GRADLAB_DAEMON=1.
    monkeypatch.setenv("GRADLAB_DAEMON", "0")
    for var in ("GRADLAB_CONTROL_STORE_URL", "GRADLAB_EVAL_STORE_URL", "GRADLAB_MODEL_STORE_URL", "GRADLAB_DATASET_STORE_URL",
                "GRADLAB_DAEMON_IDLE_S", "GRADLAB_SERVER_START_TIMEOUT_S"):
        monkeypatch.delenv(var, raising=False)
    return home


@pytest.fixture(autouse=True)
def log_handlers_follow_the_capture() -> None:
    """A logging handler made while an earlier test's output was captured (Prefect configures its
    console handler when it is first imported, on whatever ``sys.stderr`` is then) writes to that
    test's closed capture stream: "--- Logging error ---" tracebacks in every later test. Point such
    handlers (and a rich console inside them) at this test's stderr."""
    import logging
    import sys

    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "closed", False):
                handler.stream = sys.stderr  # not setStream: it flushes the closed stream first
                if getattr(handler, "console", None) is not None:
                    handler.console.file = sys.stderr


@pytest.fixture
def experiments_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A writable copy of the checked-in experiments tree, selected through GRADLAB_EXPERIMENTS."""
    dst = tmp_path / "experiments"
    shutil.copytree(REPO / "experiments", dst)
    monkeypatch.setenv("GRADLAB_EXPERIMENTS", str(dst))
    return dst


#: Fixtures that start a real Prefect server, its workers or warm learners: a test that uses one is
#: end to end and must carry ``@pytest.mark.slow`` (checked when tests are collected).
END_TO_END_FIXTURES = frozenset({"prefect_server", "prefect_api", "queue", "long_runs", "warm"})


def unmarked_end_to_end(items) -> list[str]:
    """Node ids of collected tests that use an end-to-end fixture without the ``slow`` marker."""
    return [item.nodeid for item in items
            if END_TO_END_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("slow") is None]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = unmarked_end_to_end(items)
    if unmarked:
        raise pytest.UsageError("end-to-end tests without @pytest.mark.slow: " + ", ".join(unmarked))
