"""Trust rules for pickle-based files (foreign SB3 zips).

An SB3 zip holds cloudpickled objects: unpickling runs code. Nothing gradlab reads from a store
or a run directory is unpickled (docs/ARCHITECTURE.md section 6; ``docs/SECURITY.md``): resume
reads JSON / npz / safetensors and evaluation the weights-only policy. Being inside the run
directory or a file store is *not* trust: anyone with write access to a store could place a file
there. A foreign SB3 zip is unpickled only when the user explicitly trusts it:

* the caller passes ``trust_model=True`` (it vouches for the file), or names its folder in
  ``own_roots`` (a caller that created the file itself in this process), or
* its resolved path or URL matches a pattern of ``GRADLAB_TRUSTED_MODEL_SOURCES``
  (``fnmatch`` patterns separated by ``,`` or whitespace, e.g. ``/data/models/*``).

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
    return [Path(p).resolve() for p in extra]


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
            f"{path}: refusing to unpickle an SB3 zip that was not explicitly trusted; "
            f"pass trust_model=True (a caller that vouches for it) or add a matching pattern to {TRUST_ENV} "
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
