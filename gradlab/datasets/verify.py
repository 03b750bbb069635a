"""``gradlab dataset verify``: the files against the manifest, then re-simulation from seed + actions.

Re-simulation replays each episode alone on a one-lane copy of the recorded environment contract,
reset with the episode's seed (and start), stepping the recorded actions, and requires every step's
shaped and raw reward (float32, bit for bit), terminated, truncated, events and next observation
(bitwise: ``np.array_equal`` on the stored dtype), and with an action profile the native action the
profile made of the recorded action, to equal the recording, and the episode to end at
its recorded length. The first step that differs is reported. For a ``sticky`` or ``stochastic``
dataset a divergence is not an error: the provider draws randomness the actions do not record, so
the report says what was and was not checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gradlab.contracts.dataset import DatasetEpisode, DatasetManifest


@dataclass
class VerifyReport:
    """What ``verify`` found. ``ok`` is False on any bad file or, for deterministic datasets, any divergence."""

    name: str
    files_checked: int = 0
    file_problems: list[str] = field(default_factory=list)
    episodes_replayed: int = 0
    divergences: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    determinism: str = "deterministic"

    @property
    def ok(self) -> bool:
        return not self.file_problems and (self.determinism != "deterministic" or not self.divergences)


def replay_episode(environment: Any, episode: DatasetEpisode, steps: dict[str, np.ndarray]) -> str | None:
    """Re-simulate one episode; None when it matches, else a line naming the first diverging step."""
    from gradlab.envs import make_vector_env

    where = f"episode {episode.index} (seed {episode.seed})"
    venv = make_vector_env(environment.model_copy(update={"n_envs": 1}), seed=0, lane_seeds=[episode.seed])
    try:
        if episode.start is not None:
            venv.set_next_start(0, episode.start)
        obs = venv.reset()
        recorded_obs = steps["observations"]
        if not np.array_equal(obs[0], recorded_obs[0]):
            return f"{where}: the reset observation differs from the recorded one"
        names = [str(n) for n in steps["event_names"]]
        length = len(steps["actions"])
        for t in range(length):
            action = np.asarray(steps["actions"][t:t + 1])
            res = venv.step(action)
            checks = {
                "reward": np.float32(res.reward[0]).tobytes() == np.float32(steps["rewards"][t]).tobytes(),
                "raw reward": np.float32(res.raw_reward[0]).tobytes() == np.float32(steps["raw_rewards"][t]).tobytes(),
                "terminated": bool(res.terminated[0]) == bool(steps["terminated"][t]),
                "truncated": bool(res.truncated[0]) == bool(steps["truncated"][t]),
                "events": [bool(res.events[n][0]) if n in res.events else False for n in names]
                == [bool(v) for v in steps["events"][t]],
            }
            if "native_actions" in steps:  # what the profile action became, as recorded
                checks["native action"] = np.array_equal(venv.backend.native(action)[0], steps["native_actions"][t])
            nxt = res.final_obs[0] if 0 in res.final_obs else res.obs[0]
            checks["observation"] = np.array_equal(nxt, recorded_obs[t + 1])
            bad = [k for k, good in checks.items() if not good]
            if bad:
                detail = ""
                if "reward" in bad:
                    detail = f" (recorded {float(steps['rewards'][t])!r}, re-simulated {float(res.reward[0])!r})"
                return f"{where}: first diverging step {t}: {', '.join(bad)} differ{detail}"
            if res.episodes and t < length - 1:
                return f"{where}: first diverging step {t}: the episode ended at step {t}, recorded length {length}"
        if not steps["terminated"][-1] and not steps["truncated"][-1]:
            return f"{where}: the recording does not end its last step"
        if res.episodes:  # the manifest's row must be what the re-simulated episode says
            rec = res.episodes[0]
            for name, said, found in (("return", episode.return_, rec.return_),
                                      ("raw_return", episode.raw_return, rec.raw_return),
                                      ("length", episode.length, rec.length), ("outcome", episode.outcome, rec.outcome),
                                      ("reason", episode.reason, rec.reason)):
                if said != found:
                    return f"{where}: the manifest says {name} {said!r}, the re-simulated episode {found!r}"
    finally:
        venv.close()
    return None


def row_mismatch(episode: DatasetEpisode, steps: dict[str, np.ndarray]) -> str | None:
    """Whether the manifest's row of an episode agrees with its (hash-checked) steps file: the
    length, and the returns as the sums of the recorded rewards (float32 steps summed in float64,
    so compared to 1e-6 relative). None when it does, else a line naming the key path."""
    where = f"episodes[{episode.index}]"
    if episode.length != len(steps["actions"]):
        return f"{where}.length: {episode.length}, the steps file holds {len(steps['actions'])} steps"
    for name, said, rewards in (("return", episode.return_, steps["rewards"]),
                                ("raw_return", episode.raw_return, steps["raw_rewards"])):
        total = float(np.sum(np.asarray(rewards, dtype=np.float64)))
        if not np.isclose(said, total, rtol=1e-6, atol=1e-6):
            return f"{where}.{name}: {said!r}, the steps file's rewards sum to {total!r}"
    return None


def verify_dataset(store: Any, name: str, *, cache: Path, replay: bool = True,
                   progress: Any = None) -> VerifyReport:
    """Check every file, then (``replay``) re-simulate every episode (see the module docstring).

    Args:
        store: the dataset store. cache: where the verified local copy is kept.
        progress: called with ``(done, total)`` after each replayed episode.

    Raises:
        NotFound: no such dataset. ContractViolation: a malformed manifest.
    """
    from gradlab.contracts.environment import EnvironmentSpec
    from gradlab.datasets.store import check_files, fetch_dataset, load_steps, read_dataset
    from gradlab.stores import keys

    manifest: DatasetManifest = read_dataset(store, name)
    report = VerifyReport(name=name, files_checked=len(manifest.files), determinism=manifest.determinism)
    report.file_problems = check_files(store, manifest)
    if report.file_problems or not replay:
        if report.file_problems:
            report.unchecked.append("re-simulation: skipped, the files do not match the manifest")
        return report
    folder = fetch_dataset(store, manifest, cache)
    environment = EnvironmentSpec.model_validate(manifest.environment)
    for i, episode in enumerate(manifest.episodes):
        steps = load_steps(folder, episode)
        if (mismatch := row_mismatch(episode, steps)) is not None:  # whatever the determinism
            report.file_problems.append(f"{store.url(keys.dataset_manifest(name))}: {mismatch}")
        problem = replay_episode(environment, episode, steps)
        report.episodes_replayed += 1
        if problem:
            report.divergences.append(problem)
        if progress is not None:
            progress(i + 1, len(manifest.episodes))
    if manifest.determinism != "deterministic":
        why = ("the provider repeats actions at random (sticky actions)" if manifest.determinism == "sticky"
               else "the provider draws randomness the actions do not record")
        report.unchecked.append(f"bit-exact replay is not required: {why}; "
                                f"{len(report.divergences)} of {report.episodes_replayed} episodes diverged")
    if manifest.frames:
        report.unchecked.append("frames: checked against their sha256 only (MP4 is lossy; not re-rendered)")
    return report
