"""The ``gradlab`` command (typer). Sub-command modules import heavy libraries lazily."""
