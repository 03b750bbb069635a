"""prefect.yaml: its deployments parse, reference the training-run flow, and validate without Prefect."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gradlab.deploy.project import find_project_root, flow_signature, load_prefect_yaml, validate_deployments
from gradlab.deploy.steps import checkout_directory, set_checkout_directory
from gradlab.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

FAKE_FLOW = '''
from prefect import flow

@flow(name="training-run")
def training_run(recipe: str | None = None, seed: int = 0, overrides: list[str] | None = None,
                 wandb_mode: str | None = None, eval_backend: str = "local", evaluate: bool = True,
                 run_id: str | None = None) -> dict:
    return {}
'''


def make_project(tmp_path: Path, edit=None) -> Path:
    """A copy of the checkout's prefect.yaml and pools with a stand-in flow; ``edit`` changes the YAML."""
    root = tmp_path / "project"
    (root / "flows").mkdir(parents=True)
    (root / "flows" / "training_run.py").write_text(FAKE_FLOW)
    shutil.copy(REPO / "flows" / "reports_sync.py", root / "flows" / "reports_sync.py")  # read with ast only
    (root / "pyproject.toml").write_text("[project]\nname = 'gradlab'\n")
    shutil.copytree(REPO / "deployments" / "work-pools", root / "deployments" / "work-pools")
    data = yaml.safe_load((REPO / "prefect.yaml").read_text())
    if edit is not None:
        edit(data)
    (root / "prefect.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return root


def test_prefect_yaml_declares_local_and_gpu_deployments_of_training_run() -> None:
    project = load_prefect_yaml(REPO)
    assert project.name == "gradlab"
    training = [d for d in project.deployments if d.entrypoint.startswith("flows/training_run.py")]
    assert [(d.name, d.work_pool) for d in training] == [("local", "gradlab-local"), ("gpu", "gradlab-gpu")]
    for spec in training:
        assert spec.entrypoint == "flows/training_run.py:training_run"
        # References only: seed, overrides, W&B mode (recipe comes with each run) -- no hyperparameters.
        assert spec.parameters == {"seed": 0, "overrides": [], "wandb_mode": None}
        assert spec.raw["work_pool"]["work_queue_name"] == "default"
    assert project.deployment("training-run/gpu").tags == ("gradlab", "gpu")
    assert project.pull == [{"gradlab.deploy.steps.set_checkout_directory": {}}]
    # The anchors live under definitions: and are shared, not copied.
    raw = (REPO / "prefect.yaml").read_text()
    assert raw.count("*training_run") == 2 and raw.count("*default_parameters") == 2


def test_reports_sync_deployment_is_scheduled_and_validates() -> None:
    project = load_prefect_yaml(REPO)
    spec = project.deployment("reports-sync/reports-sync")
    assert spec.entrypoint == "flows/reports_sync.py:reports_sync" and spec.work_pool == "gradlab-local"
    assert spec.raw["schedules"] == [{"cron": "0 3 * * *", "timezone": "UTC"}]
    signature = flow_signature(REPO / "flows" / "reports_sync.py", "reports_sync")
    assert signature.flow_name == "reports-sync" and set(spec.parameters) <= set(signature.parameters)
    assert validate_deployments(REPO) == []


def test_checkout_deployments_validate_against_the_real_flow_signature(tmp_path: Path) -> None:
    assert find_project_root(REPO / "experiments" / "goals") == REPO
    other = tmp_path / "other"  # someone else's Prefect project: not ours, so the package's checkout is used
    other.mkdir()
    (other / "prefect.yaml").write_text("deployments: []\n")
    (other / "pyproject.toml").write_text("[project]\nname = 'other'\n")
    assert find_project_root(other) == REPO
    assert find_project_root(make_project(tmp_path)) == tmp_path / "project"
    assert validate_deployments(REPO) == []
    signature = flow_signature(REPO / "flows" / "training_run.py", "training_run")
    assert signature.flow_name == "training-run" and signature.is_flow
    assert signature.parameters[:7] == ("recipe", "seed", "overrides", "wandb_mode", "eval_backend", "evaluate", "run_id")


def test_flow_signature_reads_names_kwonly_and_kwargs_from_source(tmp_path: Path) -> None:
    src = tmp_path / "f.py"
    src.write_text("import prefect\n\n@prefect.flow(name='my-flow', log_prints=True)\n"
                   "async def go(a, b=1, *args, c, d=2, **extra):\n    pass\n\ndef plain(x):\n    pass\n")
    sig = flow_signature(src, "go")
    assert (sig.flow_name, sig.parameters, sig.accepts_any, sig.is_flow) == ("my-flow", ("a", "b", "c", "d"), True, True)
    plain = flow_signature(src, "plain")
    assert (plain.flow_name, plain.parameters, plain.is_flow) == ("plain", ("x",), False)
    with pytest.raises(ConfigError, match="no top-level function 'missing'"):
        flow_signature(src, "missing")


def test_validate_names_every_bad_deployment_field(tmp_path: Path) -> None:
    def edit(data):
        local, gpu = data["deployments"][:2]
        del data["deployments"][2:]  # reports-sync: checked on its own
        local["parameters"] = {"seed": -1, "learning_rate": 0.1, "wandb_mode": "loud", "overrides": ["n_steps"],
                               "recipe": "CartPole-v1/nope"}
        gpu["work_pool"] = {"name": "gradlab-tpu"}
        data["deployments"].append({"name": "gone", "entrypoint": "flows/missing.py:training_run"})
        data["deployments"].append({"name": "local", "entrypoint": "flows/training_run.py:training_run",
                                    "parameters": {"recipe": "CartPole-v1/ppo", "eval_backend": {"n_envs": 8}},
                                    "work_pool": {"name": "gradlab-local"}})

    from gradlab.contracts import Experiments

    root = make_project(tmp_path, edit)
    problems = {(p.key_path, p.message) for p in validate_deployments(root, Experiments(REPO / "experiments"))}
    keys = sorted(k for k, _ in problems)
    assert keys == [
        "deployments.0.parameters.learning_rate", "deployments.0.parameters.overrides", "deployments.0.parameters.recipe",
        "deployments.0.parameters.seed", "deployments.0.parameters.wandb_mode", "deployments.1.work_pool.name",
        "deployments.2.entrypoint", "deployments.2.work_pool.name", "deployments.3.name",
        "deployments.3.parameters.eval_backend",
    ]
    messages = dict(problems)
    assert messages["deployments.0.parameters.learning_rate"].startswith("unknown parameter of training-run (expected one of recipe, seed")
    assert messages["deployments.0.parameters.seed"] == "expected a non-negative integer, found -1"
    assert messages["deployments.0.parameters.recipe"] == "expected an existing GOAL/RECIPE, found 'CartPole-v1/nope'"
    assert messages["deployments.2.entrypoint"] == "entrypoint file flows/missing.py does not exist"
    assert messages["deployments.3.name"] == "duplicate deployment name 'local'"
    assert "never copy hyperparameters" in messages["deployments.3.parameters.eval_backend"]


def test_gradlab_validate_reports_deployment_problems_and_exits_1(tmp_path: Path) -> None:
    def edit(data):
        data["deployments"][0]["parameters"]["n_steps"] = 64  # the shared anchor: both deployments get it
        data["pull"] = [{"gradlab.deploy.steps.no_such_step": {}}]

    root = make_project(tmp_path, edit)
    env = {**os.environ, "GRADLAB_EXPERIMENTS": str(REPO / "experiments")}
    out = subprocess.run([sys.executable, "-m", "gradlab.cli.app", "validate", "--json"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    experiments = REPO / "experiments" / "goals"  # every checked-in goal and recipe was validated too
    assert (doc["goals"], doc["recipes"]) == (len(list(experiments.rglob("_goal.yaml"))),
                                              len(list(experiments.rglob("recipes/*.yaml"))))
    assert sorted((e["file"], e["key_path"]) for e in doc["errors"]) == [
        ("prefect.yaml", "deployments.0.parameters.n_steps"), ("prefect.yaml", "deployments.1.parameters.n_steps"),
        ("prefect.yaml", "pull.0")]
    pull = next(e for e in doc["errors"] if e["key_path"] == "pull.0")
    assert "has no function 'no_such_step'" in pull["message"]


def test_invalid_prefect_yaml_is_one_problem_with_its_line(tmp_path: Path) -> None:
    root = make_project(tmp_path)
    (root / "prefect.yaml").write_text("deployments:\n  - name: [\n")
    problems = validate_deployments(root)
    assert len(problems) == 1 and problems[0].file == "prefect.yaml" and problems[0].line == 3
    assert problems[0].message.startswith("invalid YAML")


def test_pull_step_changes_into_the_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GRADLAB_CHECKOUT", raising=False)
    # Editable install: the importable `flows` package is the checkout's.
    assert checkout_directory() == REPO
    assert set_checkout_directory() == {"directory": str(REPO)}
    assert Path.cwd() == REPO
    other = make_project(tmp_path)
    monkeypatch.setenv("GRADLAB_CHECKOUT", str(other))
    assert set_checkout_directory() == {"directory": str(other.resolve())}
    assert Path.cwd() == other.resolve()
    monkeypatch.setenv("GRADLAB_CHECKOUT", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"GRADLAB_CHECKOUT=.*nowhere: expected a gradlab checkout containing flows/training_run.py"):
        set_checkout_directory()
    assert set_checkout_directory(str(REPO)) == {"directory": str(REPO)}  # an explicit directory wins
