"""Queued runs: the project's ``prefect.yaml``, work-pool definitions, worker commands, preflight.

Domain-free helpers for docs/ARCHITECTURE.md section 11. Nothing here imports prefect (an import-linter
contract keeps it so): files are read with PyYAML/JSON, the flow's parameters are read from its
source with :mod:`ast`, and the Prefect API is probed over plain HTTP. Code that talks to Prefect's
Python client lives in ``gradlab/cli/pools_cmds.py``.

Public names:
    find_project_root() -> Path | None: the checkout that holds ``prefect.yaml``.
    load_prefect_yaml(root) -> PrefectProject: deployments of ``prefect.yaml`` (anchors resolved).
    flow_signature(path, function) -> FlowSignature: a flow's name and parameter names, via ast.
    validate_deployments(root, experiments=None) -> list[ConfigProblem]: ``gradlab validate``'s check.
    load_pools(root) -> PoolsConfig: the pools, their base job templates and concurrency limits.
    worker_command(pool, ...) -> list[str]: the ``prefect worker start`` argv a pool expects.
    run_preflight(settings, ...) -> PreflightReport: read-only checks of every configured service.
    steps.set_checkout_directory: the deployments' pull step (imported by Prefect by name).

Shipped defaults: ``prefect.yaml`` at the repository root; pools in
``deployments/work-pools/pools.yaml`` (``gradlab-local`` and ``gradlab-gpu``, both ``process``);
dstack configurations under ``deployments/dstack/``.
"""

from gradlab.deploy.pools import PoolsConfig, PoolSpec, TagLimitSpec, load_pools, worker_command
from gradlab.deploy.preflight import CheckResult, PreflightReport, run_preflight
from gradlab.deploy.project import (
    DeploymentSpec,
    FlowSignature,
    PrefectProject,
    find_project_root,
    flow_signature,
    load_prefect_yaml,
    validate_deployments,
)

__all__ = [
    "CheckResult", "DeploymentSpec", "FlowSignature", "PoolSpec", "PoolsConfig", "PrefectProject",
    "PreflightReport", "TagLimitSpec", "find_project_root", "flow_signature", "load_pools",
    "load_prefect_yaml", "run_preflight", "validate_deployments", "worker_command",
]
