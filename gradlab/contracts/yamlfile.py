"""YAML loading that keeps line and column numbers for every key path.

Errors carry the file and the 1-based line/column from PyYAML's marks, so a broken file is
reported where it breaks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gradlab.errors import ConfigProblem

KeyPath = tuple[str, ...]

# libyaml's parser when PyYAML was built with it (it is in the manylinux wheels).
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class YamlDocument:
    """A parsed YAML mapping with the position of every key (1-based line, column)."""

    file: str
    data: dict[str, Any]
    positions: dict[KeyPath, tuple[int, int]] = field(default_factory=dict)

    def position(self, path: KeyPath) -> tuple[int, int] | None:
        """Position of the longest prefix of ``path`` present in this document."""
        for n in range(len(path), 0, -1):
            if path[:n] in self.positions:
                return self.positions[path[:n]]
        return None

    def has_prefix(self, path: KeyPath) -> int:
        """Length of the longest prefix of ``path`` that this document defines (0 if none)."""
        for n in range(len(path), 0, -1):
            if path[:n] in self.positions:
                return n
        return 0


def _positions(node: yaml.Node, prefix: KeyPath, out: dict[KeyPath, tuple[int, int]]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value)
            path = (*prefix, key)
            out[path] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _positions(value_node, path, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = (*prefix, str(i))
            out[path] = (item.start_mark.line + 1, item.start_mark.column + 1)
            _positions(item, path, out)


def parse_yaml(text: str, file: str) -> YamlDocument:
    """Parse one YAML mapping.

    Raises:
        ConfigError: the text is not valid YAML (with line and column) or not a mapping.
    """
    from gradlab.errors import ConfigError

    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        reason = getattr(e, "problem", None) or str(e)
        raise ConfigError(
            [
                ConfigProblem(
                    file=file,
                    key_path="",
                    message=f"invalid YAML: {reason}",
                    line=mark.line + 1 if mark else None,
                    column=mark.column + 1 if mark else None,
                )
            ]
        ) from None
    finally:
        loader.dispose()
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            [ConfigProblem(file=file, key_path="", message=f"expected a mapping at the top level, found {type(data).__name__}")]
        )
    positions: dict[KeyPath, tuple[int, int]] = {}
    if node is not None:
        _positions(node, (), positions)
    return YamlDocument(file=file, data=data, positions=positions)


def load_yaml(path: Path, display: str | None = None) -> YamlDocument:
    """Read and parse ``path``; ``display`` is the name used in error messages.

    Raises:
        ConfigError: unreadable file, invalid YAML, or not a mapping.
    """
    from gradlab.errors import ConfigError

    name = display or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([ConfigProblem(file=name, key_path="", message="file not found")]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([ConfigProblem(file=name, key_path="", message=f"cannot read: {e}")]) from None
    return parse_yaml(text, name)
