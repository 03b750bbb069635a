"""Trust rules for pickle-based files (SB3 zips, pickled environment state).

An SB3 zip holds cloudpickled objects: unpickling runs code. gradlab unpickles such a file only
when it is trusted:

* it lies inside one of the run's own directories (``own_roots``: the run directory) or inside
  the machine's own file stores / runs folder (``$GRADLAB_HOME``), or
* the caller passes ``trust_model=True`` (the ``--trust-model`` flag), or
* its resolved path or URL matches a pattern of ``GRADLAB_TRUSTED_MODEL_SOURCES``
  (``fnmatch`` patterns separated by ``,`` or ``:``-free whitespace, e.g. ``/data/models/*``).

The weights-only path (:func:`gradlab.checkpoints.load_policy`) needs no trust.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gradlab.errors import TrustError

logger = logging.getLogger(__name__)

TRUST_ENV = "GRADLAB_TRUSTED_MODEL_SOURCES"


def trusted_patterns() -> list[str]:
    """Patterns from ``GRADLAB_TRUSTED_MODEL_SOURCES`` (comma or whitespace separated)."""
    raw = os.environ.get(TRUST_ENV, "")
    return [p for p in re.split(r"[,\s]+", raw) if p]


def _own_roots(extra: Iterable[Path]) -> list[Path]:
    roots = [Path(p).resolve() for p in extra]
    try:
        from gradlab.settings import load_settings

        settings = load_settings()
        roots.append(settings.runs_dir.resolve())
        for url in (settings.model_store_url,):
            if url.startswith("file://"):
                from urllib.parse import unquote, urlparse

                roots.append(Path(unquote(urlparse(url).path)).resolve())
    except Exception as e:  # settings problems must not make a file trusted or crash the check
        logger.debug("no settings for trust roots: %s", e)
    return roots


def is_trusted(path: Path, *, own_roots: Iterable[Path] = (), trust_model: bool = False) -> bool:
    """Whether a pickle-based file at ``path`` may be unpickled (see the module docstring)."""
    if trust_model:
        return True
    resolved = Path(path).resolve()
    for root in _own_roots(own_roots):
        if resolved == root or root in resolved.parents:
            return True
    candidates = {str(resolved), resolved.as_uri()}
    return any(fnmatch.fnmatch(c, pat) for pat in trusted_patterns() for c in candidates)


def require_trust(path: Path, *, own_roots: Iterable[Path] = (), trust_model: bool = False) -> None:
    """Raise unless :func:`is_trusted`.

    Raises:
        TrustError: names the file and the two ways to trust it.
    """
    if not is_trusted(path, own_roots=own_roots, trust_model=trust_model):
        raise TrustError(
            f"{path}: refusing to unpickle a model from outside this run's directories and stores; "
            f"pass --trust-model or add a matching pattern to {TRUST_ENV} "
            "(the weights-only policy.safetensors needs no trust)"
        )


def load_sb3_model(checkpoint: Path, *, algorithm: str, own_roots: Iterable[Path] = (), trust_model: bool = False,
                   verify: bool = True, device: str = "cpu", **load_kwargs: Any) -> Any:
    """Load a checkpoint's SB3 zip (``policy.zip``) after the trust and integrity checks.

    Args:
        checkpoint: the checkpoint folder (or a bare ``.zip`` file, which is not hash-verified).
        algorithm: ``ppo`` or ``a2c``.

    Raises:
        TrustError: the file is not trusted. IntegrityError: a file does not match the manifest.
    """
    from gradlab.checkpoints.bundle import verify_checkpoint
    from gradlab.checkpoints.manifest import POLICY_FILE

    checkpoint = Path(checkpoint)
    zip_path = checkpoint if checkpoint.suffix == ".zip" else checkpoint / POLICY_FILE
    require_trust(zip_path, own_roots=own_roots, trust_model=trust_model)
    if verify and checkpoint.is_dir():
        verify_checkpoint(checkpoint)
    from stable_baselines3 import A2C, PPO

    cls = {"ppo": PPO, "a2c": A2C}[algorithm]
    return cls.load(str(zip_path), device=device, **load_kwargs)
