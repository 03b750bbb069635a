"""The gradlab error hierarchy.

One root, :class:`GradlabError`, mixed with the matching builtin so callers that catch builtins keep
working. Errors are split into permanent (bad input, a broken contract: retrying cannot help) and
transient (a store or service that is down: a retry may succeed). Prefect tasks retry only
:class:`TransientError` subclasses.
"""

from __future__ import annotations

from dataclasses import dataclass


class GradlabError(Exception):
    """Root of every error gradlab raises on purpose."""


class PermanentError(GradlabError):
    """Retrying cannot help: the input or the state is wrong."""


class TransientError(GradlabError):
    """A retry may succeed: a service or store is temporarily unavailable."""


class ConfigError(PermanentError, ValueError):
    """A goal, recipe, override or setting is invalid.

    ``problems`` lists every problem found, each naming file, key path, expectation and finding.
    """

    def __init__(self, problems: list[ConfigProblem] | str):
        if isinstance(problems, str):
            problems = [ConfigProblem(file="", key_path="", message=problems)]
        self.problems = list(problems)
        super().__init__("\n".join(p.render() for p in self.problems))


class ContractViolation(PermanentError, ValueError):
    """Data crossing a boundary does not satisfy its contract (shape, hash, schema)."""


class IntegrityError(PermanentError, ValueError):
    """Stored bytes do not match the sha256 recorded for them."""


class TrustError(PermanentError, PermissionError):
    """Loading a pickle-based file from an untrusted source was refused."""


class NotFound(PermanentError, LookupError):
    """A goal, recipe, run, checkpoint or stored object does not exist."""


class Conflict(PermanentError):
    """A create-only write met different bytes, or a compare-and-swap lost its race."""


class StoreUnavailable(TransientError, OSError):
    """An object store could not be reached or answered with a server error."""


@dataclass(frozen=True)
class ConfigProblem:
    """One problem in a configuration file.

    ``file`` is the path as the user knows it (relative to the experiments root when possible),
    ``key_path`` the dotted path inside the document (empty for whole-file problems), ``line`` and
    ``column`` are 1-based when known.
    """

    file: str
    key_path: str
    message: str
    line: int | None = None
    column: int | None = None

    def render(self) -> str:
        where = self.file
        if not where:
            return f"{self.key_path}: {self.message}" if self.key_path else self.message
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        if self.key_path:
            return f"{where}: {self.key_path}: {self.message}"
        return f"{where}: {self.message}"

    def as_json(self) -> dict:
        out: dict = {"file": self.file, "key_path": self.key_path, "message": self.message}
        if self.line is not None:
            out["line"] = self.line
            out["column"] = self.column
        return out


def describe_failure(error: BaseException) -> str:
    """One line naming an error's first cause, for a terminal receipt's reason.

    The first cause is the innermost exception of ``error``'s chain (``__cause__``, else an
    unsuppressed ``__context__``), so a secondary error raised while handling the first (a failed
    rollback, a cleanup that failed too) never hides it. An ``OSError`` with an errno and a path
    reads ``"<strerror, lower case>: <path>"`` (``"no space left on device: /runs/x/journal.jsonl"``);
    any other error reads ``"<type>: <message>"``.
    """
    import os

    first, seen = error, {id(error)}
    while True:
        nxt = first.__cause__ or (None if first.__suppress_context__ else first.__context__)
        if nxt is None or id(nxt) in seen:
            break
        seen.add(id(nxt))
        first = nxt
    if isinstance(first, OSError) and first.errno:
        what = os.strerror(first.errno).lower()
        if first.filename is not None:
            target = f" -> {first.filename2}" if first.filename2 is not None else ""
            return f"{what}: {first.filename}{target}"
        return f"{what}: {first.strerror or first}"
    return f"{type(first).__name__}: {first}"
