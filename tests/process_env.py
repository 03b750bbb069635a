"""The environment for commands a test starts as subprocesses.

Libraries a test imports in this process change ``os.environ`` for it: OpenCV prepends its own
folder to ``LD_LIBRARY_PATH``, torch sets ``TORCHINDUCTOR_CACHE_DIR``. A child started with them
is not what a user's shell starts, and the warm learner (``gradlab.learn.zygote``, started with the
environment of the session's start) rightly declines to fork for it. Imported by ``tests/conftest.py``
before any test runs, so :data:`SESSION_ENV` is the environment pytest was started with.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

#: ``os.environ`` when the test session started, before any test imported anything.
SESSION_ENV = dict(os.environ)


def subprocess_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child command, with every import-sensitive variable
    (``gradlab.learn.zygote.IMPORT_ENV_PREFIXES``) as the session started with it, then ``extra``."""
    from gradlab.learn.zygote import import_env

    env = {k: v for k, v in os.environ.items() if k not in import_env(os.environ)}
    env.update(import_env(SESSION_ENV))
    env.update(extra)
    return env


@contextlib.contextmanager
def session_environ() -> Iterator[None]:
    """``os.environ`` as :func:`subprocess_env` gives it while the block runs (a server a fixture
    starts in this process passes it to its daemon and warm learner), then as it was."""
    before = dict(os.environ)
    os.environ.clear()
    os.environ.update(subprocess_env())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)
