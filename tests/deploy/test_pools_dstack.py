"""Work-pool templates and the dstack configurations: valid, and agreeing on the worker command."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from gradlab.deploy.pools import PROCESS_JOB_KEYS, load_pools, parse_worker_command, worker_command
from gradlab.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
DSTACK = REPO / "deployments" / "dstack"


def test_pool_templates_are_valid_json_with_every_process_field() -> None:
    config = load_pools(REPO)
    assert [(p.name, p.type, p.concurrency_limit, p.worker_limit) for p in config.pools] == [
        ("gradlab-local", "process", 2, 1), ("gradlab-gpu", "process", 4, 1)]
    assert [(t.tag, t.limit) for t in config.tag_concurrency_limits] == [("gpu", 4)]
    for pool in config.pools:
        template = json.loads((REPO / "deployments" / "work-pools" / pool.base_job_template).read_text())
        assert set(template["job_configuration"]) == set(PROCESS_JOB_KEYS)
        assert template["job_configuration"]["env"] == "{{ env }}"
        props = template["variables"]["properties"]
        assert set(props) == set(PROCESS_JOB_KEYS)
        # The worker generates the command; the pull step picks the directory: both left blank.
        assert props["command"]["default"] is None and props["working_dir"]["default"] is None
        assert props["env"]["default"]["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
        assert props["labels"]["default"] == {"gradlab.pool": pool.name}
        assert not any(k for k in props["env"]["default"] if "KEY" in k or "SECRET" in k)


def test_broken_pool_files_are_refused_naming_file_and_key(tmp_path: Path) -> None:
    root = tmp_path
    shutil.copytree(REPO / "deployments" / "work-pools", root / "deployments" / "work-pools")
    pools_dir = root / "deployments" / "work-pools"
    (pools_dir / "gradlab-gpu.json").write_text('{"job_configuration": {"command": "{{ command }}"}, "variables": {"properties": {}}')
    template = json.loads((pools_dir / "gradlab-local.json").read_text())
    del template["job_configuration"]["working_dir"]
    (pools_dir / "gradlab-local.json").write_text(json.dumps(template))
    with pytest.raises(ConfigError) as err:
        load_pools(root)
    rendered = [p.render() for p in err.value.problems]
    assert rendered == [
        "deployments/work-pools/pools.yaml: pools.0.base_job_template: deployments/work-pools/gradlab-local.json: "
        "job_configuration.working_dir: expected a template for this process-worker key",
        "deployments/work-pools/pools.yaml: pools.1.base_job_template: deployments/work-pools/gradlab-gpu.json:1:84: "
        "invalid JSON: Expecting ',' delimiter",
    ]
    (pools_dir / "pools.yaml").write_text("pools:\n  - {name: gradlab-local, type: kubernetes, description: x, "
                                          "base_job_template: gradlab-local.json, concurrency_limit: 0, worker_limit: 1}\n")
    with pytest.raises(ConfigError) as err:
        load_pools(root)
    assert sorted(p.key_path for p in err.value.problems) == ["pools.0.concurrency_limit", "pools.0.type"]


def test_worker_command_and_its_parser_agree() -> None:
    gpu = load_pools(REPO).pool("gradlab-gpu")
    argv = worker_command(gpu, name="w1")
    assert argv == ["prefect", "worker", "start", "--pool", "gradlab-gpu", "--type", "process", "--limit", "1",
                    "--no-create-pool-if-not-found", "--name", "w1"]
    assert parse_worker_command("exec uv run " + shlex.join(argv)) == {
        "pool": "gradlab-gpu", "type": "process", "limit": "1", "no_create_pool": "true", "name": "w1"}
    assert parse_worker_command("prefect worker start -p a -t process -l=3") == {"pool": "a", "type": "process", "limit": "3"}
    assert parse_worker_command("prefect server start") is None
    with pytest.raises(ConfigError, match="no pool 'gradlab-tpu'"):
        load_pools(REPO).pool("gradlab-tpu")


def _load(name: str) -> dict:
    return yaml.safe_load((DSTACK / name).read_text())


def test_dstack_configurations_parse_with_dstacks_own_models() -> None:
    from dstack._internal.core.models.configurations import (
        TaskConfiguration,
        parse_apply_configuration,
        parse_run_configuration,
    )
    from dstack._internal.core.models.envs import EnvSentinel
    from dstack._internal.core.models.fleets import FleetConfiguration

    task = parse_run_configuration(_load("gpu-worker.dstack.yml"))
    assert isinstance(task, TaskConfiguration) and task.name == "gradlab-gpu-worker"
    fleet = parse_apply_configuration(_load("fleet.dstack.yml"))
    assert isinstance(fleet, FleetConfiguration) and fleet.name == "gradlab-gpu"
    assert (fleet.nodes.min, fleet.nodes.max) == (0, 4)
    # The task runs on that fleet, on one NVIDIA GPU, from the checkout, with the locked environment.
    assert [f.name for f in task.fleets] == ["gradlab-gpu"]
    assert (task.resources.gpu.count.min, task.resources.gpu.count.max) == (1, 1)
    assert task.repos[0].local_path == "../.." and task.working_dir == task.repos[0].path == "/gradlab"
    assert task.commands[:2] == ["uv sync --locked --no-dev", "uv run --locked --no-sync gradlab experiment preflight"]
    assert ([e.value for e in task.retry.on_events], task.retry.duration) == (["no-capacity", "interruption"], 86400)
    assert task.max_duration == "off"
    # The fleet's host count bounds the GPU pool's concurrency limit.
    assert load_pools(REPO).pool("gradlab-gpu").concurrency_limit == fleet.nodes.max
    # Secrets and the API URL come from the environment or dstack secrets, never literal values.
    env = dict(task.env.root)
    assert isinstance(env["PREFECT_API_URL"], EnvSentinel)
    with pytest.raises(ValueError, match="not all variables are resolved: GRADLAB_CONTROL_STORE_URL, GRADLAB_EVAL_STORE_URL, "
                       "GRADLAB_MODEL_STORE_URL, GRADLAB_S3_ENDPOINT_URL, PREFECT_API_URL"):
        task.env.as_dict()  # dstack fills these from the environment of `dstack apply`, or refuses
    for key in ("GRADLAB_CONTROL_STORE_URL", "GRADLAB_EVAL_STORE_URL", "GRADLAB_MODEL_STORE_URL", "GRADLAB_S3_ENDPOINT_URL"):
        assert isinstance(env[key], EnvSentinel), key
    secret_like = [k for k in env if any(w in k for w in ("SECRET", "KEY", "AUTH", "TOKEN"))]
    assert sorted(secret_like) == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "PREFECT_API_AUTH_STRING", "WANDB_API_KEY"]
    for key in secret_like:
        assert isinstance(env[key], str) and env[key].startswith("${{ secrets.gradlab_"), key
    assert env["GRADLAB_CHECKOUT"] == "/gradlab" and env["GRADLAB_DEFAULT_POOL"] == "gradlab-gpu"


def test_dstack_worker_command_is_the_one_the_gpu_pool_expects() -> None:
    from dstack._internal.core.models.configurations import parse_run_configuration

    task = parse_run_configuration(_load("gpu-worker.dstack.yml"))
    workers = [c for c in task.commands if parse_worker_command(c) is not None]
    assert len(workers) == 1
    argv = shlex.split(workers[0])
    start = argv.index("prefect")
    assert argv[:start] == ["uv", "run", "--locked", "--no-sync"]
    expected = worker_command(load_pools(REPO).pool("gradlab-gpu"))
    assert argv[start:start + len(expected)] == expected
    assert argv[start + len(expected):] == ["--name", "gradlab-gpu-${DSTACK_RUN_NAME}"]
    # And the pool is the one the gpu deployment in prefect.yaml targets.
    from gradlab.deploy.project import load_prefect_yaml

    assert load_prefect_yaml(REPO).deployment("gpu").work_pool == parse_worker_command(workers[0])["pool"]


def test_dstack_refuses_a_misspelled_key() -> None:
    from dstack._internal.core.errors import ConfigurationError
    from dstack._internal.core.models.configurations import parse_run_configuration

    data = _load("gpu-worker.dstack.yml")
    data["comands"] = data.pop("commands")
    with pytest.raises(ConfigurationError, match="comands"):
        parse_run_configuration(data)
