"""The pull step of gradlab's deployments: change into the checkout (or the installed package).

Prefect runs a deployment's ``pull:`` steps in the flow-run process a worker starts, in a fresh
temporary directory, then loads the entrypoint ``flows/training_run.py:training_run`` relative to
the directory the steps leave it in. ``prefect.yaml`` names this step by its import path; it imports
nothing from prefect, so it works on any worker whose Python environment has gradlab installed.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

from gradlab.errors import ConfigError

logger = logging.getLogger(__name__)

#: The file every candidate directory must contain (the training-run flow's entrypoint).
ENTRYPOINT_FILE = Path("flows") / "training_run.py"


def _package_root() -> Path | None:
    """The directory holding the importable ``flows`` package (the checkout, or site-packages)."""
    try:
        spec = importlib.util.find_spec("flows")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).resolve().parent.parent


def checkout_directory(directory: str | None = None) -> Path:
    """The directory a worker's flow run should run in.

    In order: ``directory`` when not empty; ``$GRADLAB_CHECKOUT``; the directory that holds the
    importable ``flows`` package (the checkout for an editable install, site-packages for a wheel).

    Raises:
        ConfigError: the chosen directory has no ``flows/training_run.py``.
    """
    tried = []
    for source, value in (("directory", directory), ("GRADLAB_CHECKOUT", os.environ.get("GRADLAB_CHECKOUT"))):
        if value:
            path = Path(value).expanduser().resolve()
            if (path / ENTRYPOINT_FILE).is_file():
                return path
            raise ConfigError(f"{source}={value}: expected a gradlab checkout containing {ENTRYPOINT_FILE}, found none")
    root = _package_root()
    if root is not None and (root / ENTRYPOINT_FILE).is_file():
        return root
    tried.append(str(root) if root else "no importable 'flows' package")
    raise ConfigError(f"no gradlab checkout found for the flow run: set GRADLAB_CHECKOUT on the worker "
                      f"(tried {', '.join(tried)})")


def set_checkout_directory(directory: str | None = None) -> dict[str, str]:
    """Prefect pull step: ``os.chdir`` into :func:`checkout_directory` and report it.

    Returns:
        ``{"directory": <absolute path>}`` (Prefect uses ``directory`` as the flow run's working
        directory, as it does for its own ``set_working_directory`` step).

    Raises:
        ConfigError: no checkout could be found (the flow run crashes with this message).
    """
    path = checkout_directory(directory)
    os.chdir(path)
    logger.info("flow run working directory: %s", path)
    return {"directory": str(path)}
