"""The dataset card and ``gradlab dataset upload`` (a Hugging Face dataset repository).

The card (``README.md``) carries YAML metadata (``huggingface_hub.DatasetCardData``: licence
unknown, tags ``gradlab``, ``reinforcement-learning``, the goal and env id, ``configs`` pointing at
the parquet shard) and the provenance: goal and environment hashes, the agent (checkpoint sha256,
step, run, where it was read), episode and step counts, return statistics with their intervals,
and the dataset's sha256. Upload goes through :func:`gradlab.share.hub.upload_folder` with
``repo_type="dataset"``, as ``gradlab publish`` uploads models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradlab.contracts.dataset import DatasetManifest


def dataset_card(manifest: DatasetManifest, summary: dict[str, Any]) -> str:
    """The dataset card's text (see the module docstring); ``summary`` is the CLI's ``dataset show --json``."""
    from huggingface_hub import DatasetCard, DatasetCardData

    env_id = str(manifest.environment.get("env_id", ""))
    data = DatasetCardData(
        tags=list(dict.fromkeys(["gradlab", "reinforcement-learning", manifest.goal_id, env_id])),  # a goal named as its env once
        task_categories=["reinforcement-learning"],
        configs=[{"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*.parquet"}]}],
    )
    r = summary["return"]
    interval = (f"[{r['mean_low']:.3f}, {r['mean_high']:.3f}]" if r.get("mean_low") is not None
                else "undefined (one episode)")
    agent = manifest.agent
    who = {"checkpoint": f"checkpoint `{agent.checkpoint_sha256}` (step {agent.checkpoint_step}, run `{agent.run_id}`, "
                         f"read from `{agent.publication}`, {agent.policy_mode} actions)",
           "random": "the uniform random policy", "noop": "the no-op policy",
           "human": f"a person ({agent.input_device or 'keyboard'})"}[agent.kind]
    lines = [
        f"# {manifest.name}",
        "",
        f"Gameplay of the gradlab goal `{manifest.goal_id}` (`{manifest.environment.get('provider')}:{env_id}`) "
        f"recorded by {who}.",
        "",
        f"- episodes: {summary['episodes']} ({summary['steps']} steps)",
        f"- return mean: {r['mean']:.3f}, 95% bootstrap interval {interval}; min {r['min']:.3f}, max {r['max']:.3f}",
        f"- outcomes: {', '.join(f'{k} {v}' for k, v in summary['outcomes'].items())}",
        f"- replay: {manifest.determinism} (`gradlab dataset verify` re-simulates from seed and actions)",
        f"- goal contract sha256: `{manifest.goal_contract_sha256}`",
        f"- environment sha256: `{manifest.environment_sha256}`",
        f"- dataset sha256: `{manifest.sha256}` (gradlab_manifest.json lists every file's sha256)",
        f"- versions: {', '.join(f'{k} {v}' for k, v in sorted(manifest.versions.items()))}",
        "",
        "One row per step: `episode_id`, `episode_index`, `seed`, `step`, `observations`, `actions`, `rewards` "
        "(the task program's), `raw_rewards` (the provider's), `terminations`, `truncations`, `infos` (the events "
        "that fired), `collector`.",
        "",
    ]
    return str(DatasetCard.from_template(data, template_str="---\n{{ card_data }}\n---\n\n" + "\n".join(lines)))


def upload_dataset(folder: Path, repo_id: str, *, token: str, manifest: DatasetManifest, private: bool = False) -> str:
    """Upload an exported Hugging Face dataset folder as one commit; returns the commit URL.

    Raises:
        ConfigError: the hub refused (authentication, permissions).
    """
    from gradlab.share.hub import upload_folder

    message = f"gradlab dataset {manifest.name} of {manifest.goal_id} ({manifest.sha256[:16]})"
    return upload_folder(folder, repo_id, token=token, private=private, message=message, repo_type="dataset")
