"""Shared fixtures: every test gets its own GRADLAB_HOME so nothing touches the user's data, and no
command under test starts a background Prefect server (GRADLAB_DAEMON=0)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import tests.process_env  # noqa: F401 - first: the environment before any test imports anything
from tests.hub_stand_in import hub_stand_in  # noqa: F401 - the Hub stand-in fixture (tests/share, tests/datasets)

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# gradlab's cache (the pre-migrated Prefect database, gradlab.runs.prefect_db) in a folder of this
# test process's own, not the user's ~/.cache: shared by the tests of one process, removed at exit.
if "GRADLAB_CACHE_DIR" not in os.environ:
    os.environ["GRADLAB_CACHE_DIR"] = tempfile.mkdtemp(prefix="gradlab-test-cache-")
    atexit.register(shutil.rmtree, os.environ["GRADLAB_CACHE_DIR"], True)


@pytest.fixture(autouse=True)
def environment_restored() -> Iterator[None]:
    """The process environment as it was before the test, whatever the test ran in-process.

    A command run in this process sets variables for itself (``configure_prefect`` quiets Prefect's
    logs with ``PREFECT_LOGGING_LEVEL=WARNING``, ``use_prefect_server`` sets ``PREFECT_API_URL``);
    a later test that builds a subprocess's environment from ``os.environ`` would inherit them.
    Set up before the test's own function fixtures (higher-scoped ones come first and stay).
    """
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        os.environ.clear()
        os.environ.update(before)


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
    test's closed capture stream: "--- Logging error ---" tracebacks in every later test, or to a
    capture other than the one a ``capfd`` test reads. Point such handlers (and a rich console inside
    them) at whatever ``sys.stderr`` is when they write."""
    import logging

    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    # Handlers no logger holds count too: absl's, made on import, is closed (and closes its stream,
    # the capture of the test that imported it) when Prefect's first dictConfig shuts every handler down.
    unattached = [h for ref in list(logging._handlerList) if (h := ref()) is not None]  # noqa: SLF001
    for handlers in [*(logger.handlers for logger in loggers), unattached]:
        for handler in handlers:
            stream = getattr(handler, "stream", None)
            follows = isinstance(getattr(type(handler), "stream", None), property)  # logging's last resort
            if isinstance(handler, logging.StreamHandler) and not follows and stream is not _CURRENT_STDERR and (
                    getattr(stream, "closed", False) or type(stream).__module__.startswith("_pytest")):
                handler.stream = _CURRENT_STDERR  # not setStream: it flushes the closed stream first
                if getattr(handler, "console", None) is not None:
                    handler.console.file = _CURRENT_STDERR


@pytest.fixture(autouse=True)
def prefect_events_follow_the_api() -> Iterator[None]:
    """Prefect keeps one events worker per process and keys it by client type, not by API URL: a
    worker started by an in-process flow against one test's server would carry every later test's
    events (and with them its task runs, which the server builds from events) to that server, gone
    by then. Each test's worker is drained and stopped when the test ends, so the next flow starts
    one on its own ``PREFECT_API_URL``. Bounded: a worker whose server has stopped is left to die."""
    import sys

    yield
    worker = sys.modules.get("prefect.events.worker")
    if worker is not None:
        worker.EventsWorker.drain_all(timeout=15.0)


class _CurrentStderr:
    """A stream that writes to whatever ``sys.stderr`` is at the time of the write: the capture of
    the phase under way, or a ``capfd``/``capsys`` fixture's when the test asked for one."""

    closed = False

    def write(self, text: str) -> int:
        import sys

        return sys.stderr.write(text)

    def flush(self) -> None:
        import sys

        sys.stderr.flush()

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        """A handler's close (absl's closes its stream) leaves the real ``sys.stderr`` open."""


_CURRENT_STDERR = _CurrentStderr()


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
