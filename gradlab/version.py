"""gradlab's version: the one place it is written in the package (``pyproject.toml`` repeats it).

On the bottom floor with :mod:`gradlab.errors`: it imports nothing, so any module may read the
version without importing the package root (``gradlab/__init__.py``, which reaches up into
``gradlab.envs`` for ``make_env``).
"""

__version__ = "0.1.0"
