"""Hugging Face model repositories of gradlab checkpoints: build, upload, load back verified.

Repository layout (``gradlab publish``; docs/ARCHITECTURE.md section 12)::

    README.md                    model card; YAML metadata with model-index (mean_reward) and tags
    gradlab.json                 index: format, run, step, checkpoint sha256, the five hashes, the
                                 verdict, and the sha256 of every other file of the repository
    run_spec.json                the run spec (composed goal and recipe, overrides, seed)
    goal.json, recipe.json       the composed goal and recipe (hashes in gradlab.json)
    evaluation.json              the evaluation result with its per-episode rows
    checkpoint/manifest.json     the checkpoint's manifest (sha256 of its files)
    checkpoint/policy.safetensors, checkpoint/policy_spec.json   the weights-only policy
    <algo>-<env>.zip             the SB3 zip (the checkpoint's policy.zip, byte-identical), for every
                                 PPO / A2C checkpoint, under huggingface_sb3's model name
    vec_normalize.pkl            SB3's normalisation statistics (rl-zoo3's name), when the recipe normalises
    replay.mp4                   one manifest episode, an illustration (the evidence is evaluation.json)

and, when rl-zoo3 can play the goal, what rl-zoo3's ``push_to_hub`` writes
(:mod:`gradlab.share.zoo_repo`): ``config.yml``, ``args.yml``, ``env_kwargs.yml``,
``vec_normalize.pkl`` (pass-through when the recipe does not normalise), ``train_eval_metrics.zip``,
``results.json`` and the zip's members under ``<algo>-<env>/``.

:func:`load_repo` reads ``hf://OWNER/NAME`` from the hub (or its local cache when offline,
``HF_HUB_OFFLINE=1`` or no network) and refuses a repository whose files do not match
``gradlab.json``, whose policy files do not match the checkpoint manifest, or whose goal and
recipe do not hash to the recorded hashes, naming the file. Nothing in it is unpickled: playback
and evaluation use the weights-only policy. :func:`resolve_repo` gives the same as a resolved
checkpoint (:mod:`gradlab.checkpoints.resolve`, a floor below, resolves every other reference).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradlab.checkpoints import file_sha256
from gradlab.errors import ConfigError, ContractViolation, IntegrityError, NotFound

if TYPE_CHECKING:
    from gradlab.checkpoints.resolve import ResolvedCheckpoint

INDEX_FILE = "gradlab.json"
REPO_FORMAT = "gradlab.hf-repo/1"
CHECKPOINT_DIR = "checkpoint"
WEIGHTS_ONLY = ("manifest.json", "policy.safetensors", "policy_spec.json")


def parse_hf_ref(ref: str) -> str:
    """``hf://OWNER/NAME`` -> ``OWNER/NAME``.

    Raises:
        ConfigError: not of that form.
    """
    repo = ref.removeprefix("hf://")
    parts = repo.split("/")
    if not ref.startswith("hf://") or len(parts) != 2 or not all(parts):
        raise ConfigError(f"{ref}: expected hf://OWNER/NAME")
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as e:
        raise ConfigError(f"{ref}: expected hf://OWNER/NAME ({str(e).splitlines()[0]})") from None
    return repo


def hf_token(settings: Any | None = None) -> str | None:
    """The Hugging Face token: ``HF_TOKEN``, else the config file's ``[hub] token_ref`` secret
    reference (``env:NAME`` or ``keyring:SERVICE/USER``; docs/ARCHITECTURE.md section 13), else the
    one ``hf auth login`` stored; None without one.

    Raises:
        ConfigError: ``[hub] token_ref`` names an unset variable or keyring entry (never its value).
    """
    token = os.environ.get("HF_TOKEN")
    if token:
        return token
    if settings is None:
        from gradlab.settings import load_settings

        settings = load_settings()
    token = settings.secret("hub.token_ref")
    if token:
        return token
    from huggingface_hub import get_token

    return get_token()


def _model_card(spec: Any, result: Any, *, accepted: bool, algo: str, repo_id: str | None, sb3: bool,
                zoo_problem: str | None) -> str:
    from huggingface_hub import EvalResult as HfEvalResult
    from huggingface_hub import ModelCardData

    from gradlab.share.zoo_repo import model_name

    env_id = spec.environment.env_id
    agg = result.aggregates
    mean, std = agg["eval/episode/return/mean"], agg["eval/episode/return/std"]
    name = model_name(algo, env_id)
    tags = ["reinforcement-learning", *(["stable-baselines3"] if sb3 else []), "gradlab", env_id,
            "deep-reinforcement-learning"]
    data = ModelCardData(
        library_name="stable-baselines3" if sb3 else None, tags=tags, model_name=name,
        eval_results=[HfEvalResult(task_type="reinforcement-learning", task_name="reinforcement-learning",
                                   dataset_type=env_id, dataset_name=env_id, metric_type="mean_reward",
                                   metric_name="mean_reward", metric_value=f"{mean:.2f} +/- {std:.2f}")],
    )
    verdict = ("Accepted under the goal's acceptance rule (the run's promoted checkpoint)." if accepted else
               "**Not accepted**: this checkpoint did not pass the goal's acceptance rule (or is not the run's "
               "promoted checkpoint); it was published with `--allow-unaccepted`.")
    rules = "; ".join(f"`{r.metric} {r.operator} {r.threshold:g}`" for r in spec.goal.eval.acceptance) or "none"
    repo = repo_id or "OWNER/NAME"
    owner, _, repo_name = repo.partition("/")
    zoo = (f"rl-zoo3 cannot play it: {zoo_problem}." if zoo_problem else
           f"""With rl-zoo3 (this repository holds the files its `push_to_hub` writes):

```
python -m rl_zoo3.load_from_hub --algo {algo} --env {env_id} -orga {owner} -name {repo_name} -f logs/
python -m rl_zoo3.enjoy --algo {algo} --env {env_id} -f logs/
```""")
    body = f"""# {name}: gradlab goal `{spec.goal_id}`, recipe `{spec.recipe_id}`, seed {spec.seed}

A {algo.upper()} policy for `{env_id}` trained by gradlab (run `{spec.run_id}`,
checkpoint at step {result.checkpoint_step}, policy sha256 `{result.checkpoint_sha256}`).

{verdict}

## Evaluation (the evidence: `evaluation.json`, one row per episode)

| | |
|---|---|
| episodes | {result.completed} of {result.planned}, {result.policy} actions, the goal's fixed manifest |
| return | {mean:.2f} ± {std:.2f} (median {agg['eval/episode/return/median']:.2f}) |
| success rate | {agg['eval/outcome/success/rate']:.3f} |
| acceptance rule | {rules} |
| episode manifest sha256 | `{result.hashes['episode_manifest_sha256']}` |

`replay.mp4` shows one manifest episode as an **illustration, not evidence**.

## Use it

```python
from huggingface_hub import hf_hub_download
from stable_baselines3 import {algo.upper()}

path = hf_hub_download("{repo}", "{name}.zip")
model = {algo.upper()}.load(path)  # plain SB3: nothing of gradlab is pickled in it
```

{zoo}
`gradlab eval hf://{repo}` re-runs the evaluation after checking every file against `gradlab.json`.
The goal's environment (task program, preprocessing) is in `goal.json`; with gradlab installed,
`gradlab.make_env("{spec.goal_id}")` builds it as a gymnasium env.
"""
    return f"---\n{data.to_yaml()}\n---\n\n{body}"


def build_repo_folder(checkpoint: Path, spec: Any, result: Any, out: Path, *, accepted: bool,
                      repo_id: str | None = None, video: bool = True) -> dict[str, Any]:
    """Assemble the repository folder of a verified checkpoint (see the module docstring).

    Args:
        checkpoint: the checkpoint folder (verified here).
        spec: the run's :class:`~gradlab.contracts.run_spec.RunSpec`.
        result: its :class:`~gradlab.evaluation.result.EvalResult` (validated by the caller).
        out: the folder to write (created; must be empty or absent).
        accepted: whether the checkpoint is the run's accepted promotion (the card says so).

    Returns:
        The index written to ``gradlab.json``.

    Raises:
        IntegrityError: the checkpoint fails verification. ContractViolation: ``out`` is not empty.
    """
    from gradlab.checkpoints import verify_checkpoint
    from gradlab.contracts.experiments import goal_contract_sha256, recipe_sha256

    manifest = verify_checkpoint(checkpoint)
    if result.checkpoint_sha256 != manifest.sha256:
        raise ContractViolation(f"{checkpoint}: the evaluation result is for {result.checkpoint_sha256[:16]}, "
                                f"the checkpoint is {manifest.sha256[:16]}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ContractViolation(f"{out}: expected a new or empty folder, found a file; choose a new --out folder")
    if out.exists() and any(out.iterdir()):
        raise ContractViolation(f"{out}: not empty; choose a new --out folder")
    (out / CHECKPOINT_DIR).mkdir(parents=True, exist_ok=True)
    from gradlab.share.export import SB3_ALGORITHMS, write_vecnormalize
    from gradlab.share.zoo_repo import VEC_NORMALIZE, model_name, write_zoo_repo_files

    algo = SB3_ALGORITHMS.get(manifest.backend_id)
    sb3 = algo is not None  # every PPO / A2C checkpoint has an SB3 zip (gradlab.ppo's too)
    algo = algo or manifest.backend_id.split(".", 1)[-1]
    for name in WEIGHTS_ONLY:
        shutil.copyfile(Path(checkpoint) / name, out / CHECKPOINT_DIR / name)
    zoo_problem: str | None = "it has no stable-baselines3 zip"
    sb3_zip = None
    if sb3:
        sb3_zip = f"{model_name(algo, spec.environment.env_id)}.zip"
        shutil.copyfile(Path(checkpoint) / "policy.zip", out / sb3_zip)
        stats_file = Path(checkpoint) / "resume" / "vecnormalize.json"
        stats = json.loads(stats_file.read_text()) if stats_file.is_file() else None
        zoo_problem = write_zoo_repo_files(out, checkpoint=Path(checkpoint), spec=spec, result=result, algo=algo,
                                           created_at=manifest.created_at, stats=stats)
        if stats is not None and zoo_problem is not None:
            write_vecnormalize(spec.environment, stats, out / VEC_NORMALIZE)
    (out / "run_spec.json").write_text(json.dumps(spec.to_json(), indent=1, sort_keys=True) + "\n")
    (out / "goal.json").write_text(json.dumps(spec.goal.model_dump(mode="json"), indent=1, sort_keys=True) + "\n")
    (out / "recipe.json").write_text(json.dumps(spec.recipe.model_dump(mode="json"), indent=1, sort_keys=True) + "\n")
    (out / "evaluation.json").write_text(json.dumps(result.as_json(), indent=1, sort_keys=True) + "\n")
    if video:
        from gradlab.checkpoints import load_policy
        from gradlab.evaluation.manifest import build_manifest
        from gradlab.evaluation.recording import record_episode
        from gradlab.evaluation.runner import policy_rng

        episodes = build_manifest(spec.goal, episodes=result.planned)
        record_episode(load_policy(checkpoint, verify=False), environment=spec.eval_environment,
                       episode=episodes.episodes[0], deterministic=result.policy == "deterministic",
                       rng=policy_rng(episodes), path=out / "replay.mp4", row=result.episodes[0],
                       metadata={"checkpoint_sha256": manifest.sha256, "goal_id": spec.goal_id, "run_id": spec.run_id,
                                 "checkpoint_step": manifest.step, "label": "illustration_not_evidence"})
    (out / "README.md").write_text(_model_card(spec, result, accepted=accepted, algo=algo, repo_id=repo_id, sb3=sb3,
                                               zoo_problem=zoo_problem))
    files = {p.relative_to(out).as_posix(): file_sha256(p) for p in sorted(out.rglob("*")) if p.is_file()}
    index = {
        "format": REPO_FORMAT, "run_id": spec.run_id, "goal_id": spec.goal_id, "recipe_id": spec.recipe_id,
        "seed": spec.seed, "step": manifest.step, "checkpoint_sha256": manifest.sha256, "backend_id": manifest.backend_id,
        "goal_contract_sha256": goal_contract_sha256(spec.goal), "recipe_sha256": recipe_sha256(spec.recipe),
        "environment_sha256": spec.environment_sha256,
        "episode_manifest_sha256": result.hashes["episode_manifest_sha256"], "accepted": accepted,
        "verdict": result.verdict, "init_from_sha256": manifest.init_from_sha256, "sb3_zip": sb3_zip,
        "rl_zoo3": zoo_problem is None, "files": files,
    }
    (out / INDEX_FILE).write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return index


def commit_message(index: dict[str, Any]) -> str:
    """The upload's commit message: run, step and checkpoint sha256 prefix."""
    return f"gradlab publish {index['goal_id']} run {index['run_id']} step {index['step']} ({index['checkpoint_sha256'][:16]})"


def upload_folder(folder: Path, repo_id: str, *, token: str, private: bool, message: str,
                  repo_type: str = "model") -> str:
    """Create the repository (if needed) and upload the folder as one commit; returns the commit URL.

    ``repo_type``: ``model`` (``gradlab publish``) or ``dataset`` (``gradlab dataset upload``).

    The endpoint is huggingface_hub's own setting (``HF_ENDPOINT``).

    Raises:
        ConfigError: the hub refused (authentication, permissions), with its message.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True)
        info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type=repo_type, commit_message=message)
    except HfHubHTTPError as e:
        raise ConfigError(f"hf://{repo_id}: the hub refused the upload: {e}") from None
    return str(info)


@dataclass(frozen=True)
class HubModel:
    """A verified published repository on this machine.

    Attributes:
        folder: the repository snapshot (hub cache). checkpoint: its ``checkpoint/`` folder (weights only).
        index: ``gradlab.json``. spec: the run spec JSON. result: the published evaluation result JSON.
    """

    folder: Path
    checkpoint: Path
    index: dict[str, Any]
    spec: dict[str, Any]
    result: dict[str, Any]


def verify_repo_folder(folder: Path) -> HubModel:
    """Check a repository folder against its ``gradlab.json`` before anything in it is used.

    Untrusted input throughout (:mod:`gradlab.share.repo_files`): a name in the index that is
    absolute, has ``..`` or resolves outside the snapshot is refused by name before anything is
    read or hashed; malformed JSON or a missing key is one error naming the file and key path; the
    policy spec is held to its limits and the tensor shapes checked against it from the
    safetensors header before any network is built (:func:`gradlab.checkpoints.policy.check_policy_files`).

    Raises:
        NotFound: no ``gradlab.json``. IntegrityError: a file missing or with another sha256 than
        the index, an unlisted policy file, the policy files or zip not the checkpoint manifest's,
        or the goal / recipe not hashing to the recorded hashes (each naming the file); a refused
        name; malformed JSON or a missing key; a broken safetensors header. ContractViolation: the
        policy spec over its limits or a tensor of another shape.
    """
    from gradlab.checkpoints.manifest import CheckpointManifest
    from gradlab.checkpoints.policy import check_policy_files
    from gradlab.contracts.experiments import goal_contract_sha256, recipe_sha256
    from gradlab.contracts.goal import Goal
    from gradlab.contracts.recipe import Recipe
    from gradlab.share.repo_files import confined, read_index, read_json, validated

    folder = Path(folder)
    index_path = folder / INDEX_FILE
    if not index_path.is_file():
        raise NotFound(f"{folder}: not a gradlab repository (no {INDEX_FILE})")
    # Every name is confined to the snapshot and every file read below is listed (so hashed) first.
    index = read_index(folder, INDEX_FILE, required=("run_spec.json", "evaluation.json",
                                                     *(f"{CHECKPOINT_DIR}/{name}" for name in WEIGHTS_ONLY)))
    if index.get("format") != REPO_FORMAT:
        raise IntegrityError(f"{index_path}: format expected {REPO_FORMAT!r}, found {index.get('format')!r}")
    for rel, digest in sorted(index["files"].items()):
        path = confined(folder, rel, listed_in=INDEX_FILE)
        if not path.is_file():
            raise IntegrityError(f"{path}: listed in {INDEX_FILE} but missing")
        found = file_sha256(path)
        if found != digest:
            raise IntegrityError(f"{path}: sha256 expected {digest} ({INDEX_FILE}), found {found}")
    manifest_path = folder / CHECKPOINT_DIR / "manifest.json"
    manifest = validated(CheckpointManifest, read_json(folder, f"{CHECKPOINT_DIR}/manifest.json", listed_in=INDEX_FILE),
                         manifest_path).model_dump(mode="json")
    for name in WEIGHTS_ONLY[1:]:
        if name not in manifest["files"]:
            raise IntegrityError(f"{manifest_path}: files: {name} is not listed")
        if manifest["files"][name]["sha256"] != index["files"][f"{CHECKPOINT_DIR}/{name}"]:
            raise IntegrityError(f"{folder / CHECKPOINT_DIR / name}: not the file the checkpoint manifest lists")
    if manifest["sha256"] != index["checkpoint_sha256"]:
        raise IntegrityError(f"{folder / CHECKPOINT_DIR / 'manifest.json'}: policy sha256 {manifest['sha256']} is not "
                             f"the published checkpoint {index['checkpoint_sha256']}")
    if "sb3_zip" in index:  # the repository names its SB3 zip (train_eval_metrics.zip is rl-zoo3's, not a model)
        zips = [index["sb3_zip"]] if index["sb3_zip"] else []
    else:  # published before gradlab.json named it: every top-level zip is the model
        zips = [rel for rel in index["files"] if rel.endswith(".zip") and "/" not in rel]
    for rel in zips:
        if index["files"][rel] != index["checkpoint_sha256"]:
            raise IntegrityError(f"{folder / rel}: not the checkpoint's policy.zip (sha256 differs from the manifest)")
    spec = read_json(folder, "run_spec.json", listed_in=INDEX_FILE)
    spec_path = folder / "run_spec.json"
    if not isinstance(spec, dict):
        raise IntegrityError(f"{spec_path}: expected a JSON object, found {type(spec).__name__}")
    goal = validated(Goal, spec.get("goal"), spec_path)
    recipe = validated(Recipe, spec.get("recipe"), spec_path)
    for what, found, key in (("goal", goal_contract_sha256(goal), "goal_contract_sha256"),
                             ("recipe", recipe_sha256(recipe), "recipe_sha256")):
        if found != index[key] or found != manifest[key]:
            raise IntegrityError(f"{folder / 'run_spec.json'}: the {what} hashes to {found}, {INDEX_FILE} records "
                                 f"{index[key]} and the checkpoint {manifest[key]}")
    result = read_json(folder, "evaluation.json", listed_in=INDEX_FILE)
    check_policy_files(folder / CHECKPOINT_DIR)  # spec limits and tensor shapes, before any network exists
    return HubModel(folder=folder, checkpoint=folder / CHECKPOINT_DIR, index=index, spec=spec, result=result)


def load_repo(ref: str) -> HubModel:
    """Download (or find in the hub cache) ``hf://OWNER/NAME`` and verify it (:func:`verify_repo_folder`).

    Offline (``HF_HUB_OFFLINE=1``, or the hub unreachable) the local cache is used.

    Raises:
        ConfigError: a malformed reference. NotFound: not on the hub and not in the cache.
        IntegrityError: a file does not match (named).
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    repo = parse_hf_ref(ref)
    try:
        folder = snapshot_download(repo_id=repo, repo_type="model")
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as first:
        try:
            folder = snapshot_download(repo_id=repo, repo_type="model", local_files_only=True)
        except LocalEntryNotFoundError:
            raise NotFound(f"{ref}: not reachable on the hub ({type(first).__name__}) and not in the local hub cache") from None
    return verify_repo_folder(Path(folder))


def resolve_repo(ref: str) -> ResolvedCheckpoint:
    """``hf://OWNER/NAME`` as the commands take a checkpoint: :func:`load_repo`'s verified
    weights-only folder and run spec, with origin ``hub``.

    Returns:
        :class:`gradlab.checkpoints.resolve.ResolvedCheckpoint` (``spec_source``:
        ``"<ref> run_spec.json"``); the folder holds no resume files, so it is used weights-only.

    Raises:
        As :func:`load_repo`.
    """
    from gradlab.checkpoints.resolve import ResolvedCheckpoint

    hub = load_repo(ref)
    return ResolvedCheckpoint(path=hub.checkpoint, spec=hub.spec, spec_source=f"{ref} run_spec.json", origin="hub")
