"""``gradlab benchmark`` implementations: each module measures one part against its bare library.

Every benchmark prints a rich table with absolute figures and ratios, and can write the same rows
as JSON. Results are recorded, with the machine, in ``docs/BENCHMARKS.md``.
"""

from pathlib import Path


def make_out(out: Path) -> Path:
    """Create ``out/runs`` (the folder a benchmark writes its runs' records in); returns ``out``.

    Raises:
        ConfigError: naming ``--out``: a file is in the way, or the folder cannot be created.
    """
    from gradlab.errors import ConfigError

    try:
        (out / "runs").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out}: expected a folder that can be created, found {e.strerror or e}") from None
    return out
