"""Work-pool definitions (``deployments/work-pools/pools.yaml``) and the worker command each expects.

``pools.yaml`` lists each pool (name, worker type, base job template file, concurrency limit,
description) and the task-tag concurrency limits (``gpu``). ``gradlab pools create`` applies it
through the Prefect API; the dstack worker task starts :func:`worker_command` for ``gradlab-gpu``.
A base job template is a JSON document with ``job_configuration`` and ``variables`` (a JSON
schema with ``properties``), the shape ``prefect work-pool get-default-base-job-template`` prints.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gradlab.errors import ConfigError, ConfigProblem

POOLS_DIR = Path("deployments") / "work-pools"
POOLS_FILE = POOLS_DIR / "pools.yaml"
#: Keys every process base job template must template (Prefect 3's process worker reads them).
PROCESS_JOB_KEYS = ("command", "env", "labels", "name", "stream_output", "working_dir")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PoolSpec(_Model):
    """One work pool."""

    name: str = Field(description="Work pool name, e.g. gradlab-local.", pattern=r"^[a-z0-9][a-z0-9-]*$")
    type: str = Field(description="Worker type; gradlab ships process pools only.", pattern=r"^process$")
    description: str = Field(description="Shown in the Prefect UI.")
    base_job_template: str = Field(description="JSON file next to pools.yaml.")
    concurrency_limit: int = Field(description="Most flow runs running at once in the pool.", ge=1)
    worker_limit: int = Field(description="Most flow runs one worker of this pool runs at once (--limit).", ge=1)


class TagLimitSpec(_Model):
    """A task-run tag concurrency limit (``prefect concurrency-limit create TAG N``)."""

    tag: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    limit: int = Field(ge=0, description="Most task runs carrying the tag that run at once.")


class PoolsConfig(_Model):
    """``deployments/work-pools/pools.yaml``."""

    pools: tuple[PoolSpec, ...]
    tag_concurrency_limits: tuple[TagLimitSpec, ...] = ()

    def pool(self, name: str) -> PoolSpec:
        """The pool called ``name``.

        Raises:
            ConfigError: no such pool.
        """
        for spec in self.pools:
            if spec.name == name:
                return spec
        raise ConfigError(f"{POOLS_FILE}: no pool {name!r} (found: {', '.join(p.name for p in self.pools)})")


def load_pools(root: Path) -> PoolsConfig:
    """Read and validate ``root/deployments/work-pools/pools.yaml`` and every template it names.

    Raises:
        ConfigError: every problem found (file, key path, expectation, finding), including a
            template that is not valid JSON or lacks ``job_configuration`` / ``variables.properties``
            or a process key of :data:`PROCESS_JOB_KEYS`.
    """
    import yaml

    path = root / POOLS_FILE
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError([ConfigProblem(str(POOLS_FILE), "", f"cannot read: {e}")]) from None
    except yaml.YAMLError as e:
        raise ConfigError([ConfigProblem(str(POOLS_FILE), "", f"invalid YAML: {e}")]) from None
    try:
        config = PoolsConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError([ConfigProblem(str(POOLS_FILE), ".".join(str(x) for x in err["loc"]), err["msg"])
                           for err in e.errors(include_url=False)]) from None
    problems: list[ConfigProblem] = []
    names = [p.name for p in config.pools]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(ConfigProblem(str(POOLS_FILE), "pools", f"duplicate pool {dup!r}"))
    for i, pool in enumerate(config.pools):
        try:
            base_job_template(root, pool)
        except ConfigError as e:
            problems += [ConfigProblem(str(POOLS_FILE), f"pools.{i}.base_job_template", p.render()) for p in e.problems]
    if problems:
        raise ConfigError(problems)
    return config


def base_job_template(root: Path, pool: PoolSpec) -> dict[str, Any]:
    """The pool's base job template as a dict, checked for the fields a process worker needs.

    Raises:
        ConfigError: missing file, invalid JSON, or a required field missing.
    """
    path = root / POOLS_DIR / pool.base_job_template
    shown = str(POOLS_DIR / pool.base_job_template)
    try:
        template = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError([ConfigProblem(shown, "", f"cannot read: {e}")]) from None
    except json.JSONDecodeError as e:
        raise ConfigError([ConfigProblem(shown, "", f"invalid JSON: {e.msg}", line=e.lineno, column=e.colno)]) from None
    problems = []
    job = template.get("job_configuration") if isinstance(template, dict) else None
    props = (template.get("variables") or {}).get("properties") if isinstance(template, dict) else None
    if not isinstance(job, dict):
        problems.append(ConfigProblem(shown, "job_configuration", "expected a mapping"))
    if not isinstance(props, dict):
        problems.append(ConfigProblem(shown, "variables.properties", "expected a JSON-schema properties mapping"))
    if isinstance(job, dict) and isinstance(props, dict) and pool.type == "process":
        for key in PROCESS_JOB_KEYS:
            if key not in job:
                problems.append(ConfigProblem(shown, f"job_configuration.{key}", "expected a template for this process-worker key"))
            if key not in props:
                problems.append(ConfigProblem(shown, f"variables.properties.{key}", "expected a variable definition"))
    if problems:
        raise ConfigError(problems)
    return template


def worker_command(pool: PoolSpec, *, name: str | None = None) -> list[str]:
    """The argv that starts a worker of ``pool``: ``prefect worker start --pool P --type T --limit N``.

    ``--no-create-pool-if-not-found``: a worker must not create a missing pool with Prefect's
    default template (no concurrency limit); ``gradlab pools create`` owns the pools.

    Args:
        pool: the pool (its ``type`` and ``worker_limit`` are used).
        name: worker name (``--name``); Prefect picks one when None.
    """
    argv = ["prefect", "worker", "start", "--pool", pool.name, "--type", pool.type, "--limit", str(pool.worker_limit),
            "--no-create-pool-if-not-found"]
    if name:
        argv += ["--name", name]
    return argv


def parse_worker_command(command: str) -> dict[str, str] | None:
    """Options of a ``prefect worker start`` shell command, or None if ``command`` is not one.

    Tolerates a launcher in front (``uv run --locked prefect worker start ...``, ``exec ...``).
    Returns ``{"pool": ..., "type": ..., "limit": ..., "name": ..., "no_create_pool": "true"}`` with
    the options present, long or short (``-p``, ``-t``, ``-n``, ``-l``) forms alike.
    """
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    for i in range(len(argv) - 2):
        if argv[i:i + 3] == ["prefect", "worker", "start"]:
            rest = argv[i + 3:]
            break
    else:
        return None
    aliases = {"--pool": "pool", "-p": "pool", "--type": "type", "-t": "type", "--limit": "limit", "-l": "limit",
               "--name": "name", "-n": "name", "--work-queue": "work_queue", "-q": "work_queue",
               "--no-create-pool-if-not-found": "no_create_pool"}
    found: dict[str, str] = {}
    j = 0
    while j < len(rest):
        token = rest[j]
        key, _, inline = token.partition("=")
        if key == "--no-create-pool-if-not-found":
            found["no_create_pool"] = "true"
        elif key in aliases:
            if inline:
                found[aliases[key]] = inline
            elif j + 1 < len(rest):
                found[aliases[key]] = rest[j + 1]
                j += 1
        j += 1
    return found
