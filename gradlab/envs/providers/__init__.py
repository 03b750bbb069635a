"""gradlab's shipped providers, one module each: builtin (``gradlab``), gym (``gymnasium``), ale,
vizdoom, retro. Each module exposes ``provider``, the entry point named in ``pyproject.toml``.
Heavy libraries are imported inside functions, so importing a provider module is cheap.
"""
