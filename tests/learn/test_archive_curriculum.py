"""train.curriculum.archive on gradlab.ppo: the contract, episodes by origin, value-error priorities,
exact resume, corrupted blobs and evaluation, on the built-in key-door maze (real envs throughout)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from gradlab.checkpoints import load_policy
from gradlab.checkpoints.manifest import RESUME_DIR
from gradlab.contracts.experiments import Experiments, recipe_sha256
from gradlab.contracts.recipe import Recipe
from gradlab.contracts.run_spec import RunSpec
from gradlab.envs.preflight import training_problems
from gradlab.envs.vector import VectorEnv
from gradlab.errors import ConfigError, IntegrityError
from gradlab.evaluation.runner import evaluate_policy
from gradlab.explore.blobs import blob_sha256
from gradlab.learn.ppo import PPOBackend
from gradlab.learn.ppo_curriculum import CURRICULUM_FILE, STATES_DIR

GOAL = "gradlab__keydoor"
N_STEPS = 32
ROLLOUTS = 12
CURRICULUM = ["train.curriculum.archive.share=0.5", "train.curriculum.archive.cell.signals=[x,y,has_key]"]


def _spec(overrides: list[str] = (), goal: str = GOAL) -> RunSpec:
    resolved = Experiments().resolve(f"{goal}/ppo", [f"train.backend.config.n_steps={N_STEPS}",
                                                     "train.backend.config.batch_size=128",
                                                     f"train.timesteps={8 * N_STEPS * ROLLOUTS * 2}", *overrides])
    return RunSpec.from_resolved(resolved, seed=0)


def _backend(spec: RunSpec) -> PPOBackend:
    b = PPOBackend()
    b.setup(spec, b.make_env(spec), device="cpu")
    return b


def _recipe(train: dict) -> Recipe:
    return Recipe.model_validate({"recipe_id": "r", "train": {"timesteps": 10, "backend": {"id": "gradlab.ppo"}, **train}})


# -- the contract ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("archive", "key"), [
    ({"share": 1.0}, "train.curriculum.archive.share"),
    ({"share": -0.1}, "train.curriculum.archive.share"),
    ({"share": 0.5, "priority_metric": "td_error"}, "train.curriculum.archive.priority_metric"),
    ({"share": 0.5, "ema_rate": 0.0}, "train.curriculum.archive.ema_rate"),
    ({"share": 0.5, "reservoir_size": 0}, "train.curriculum.archive.reservoir_size"),
    ({"share": 0.5, "reservoir": 10}, "train.curriculum.archive.reservoir"),
])
def test_the_contract_refuses_bad_values_naming_the_key(archive, key):
    with pytest.raises(ValidationError) as e:
        _recipe({"curriculum": {"archive": archive}})
    assert key in str(e.value)


def test_a_recipe_without_a_curriculum_keeps_its_hash_and_sb3_is_refused():
    plain = _recipe({})
    assert "curriculum" not in plain.model_dump(mode="json")["train"]
    assert recipe_sha256(plain) == recipe_sha256(_recipe({"curriculum": None}))
    assert recipe_sha256(plain) != recipe_sha256(_recipe({"curriculum": {"archive": {"share": 0.25}}}))
    with pytest.raises(ValidationError, match=r"curriculum\n.*no archive curriculum with backend sb3\.ppo: it runs on "
                                              r"gradlab\.ppo only"):
        Recipe.model_validate({"recipe_id": "r", "train": {"timesteps": 10, "backend": {"id": "sb3.ppo"},
                                                           "curriculum": {"archive": {"share": 0.25}}}})


def test_cell_signals_the_goal_lacks_are_refused_at_resolve():
    with pytest.raises(ConfigError, match=r"train\.curriculum\.archive\.cell\.signals.*found lives, which it lacks"):
        _spec(["train.curriculum.archive.share=0.5", "train.curriculum.archive.cell.signals=[x,lives]"])
    with pytest.raises(ConfigError, match=r"cell\.signals: expected the signals the cells are made of, some of the "
                                          r"goal's \(x, y, has_key, room\), or cell\.kind: frame; found none"):
        _spec(["train.curriculum.archive.share=0.5"])


def test_frame_cells_on_vector_observations_are_refused_before_a_run_is_created():
    resolved = Experiments().resolve(f"{GOAL}/ppo", ["train.curriculum.archive.share=0.5",
                                                     "train.curriculum.archive.cell.kind=frame"])
    assert training_problems(resolved) == [("train.curriculum.archive.cell.kind",
                                            "frame cells need image observations, and gradlab:KeyDoor-v0 gives "
                                            "vectors; use cell.kind: signals")]


def test_a_provider_without_state_capture_is_refused_naming_the_key_and_the_provider():
    resolved = Experiments().resolve("VizdoomBasic-v1/ppo", ["train.curriculum.archive.share=0.5",
                                                              "train.curriculum.archive.cell.kind=frame",
                                                              "train.environment.n_envs=2",
                                                              "train.backend.config.batch_size=64"])
    (problem,) = training_problems(resolved)  # what `gradlab train` reports before a run is created
    assert problem[0] == "train.curriculum.archive" and "vizdoom:basic" in problem[1]
    spec = RunSpec.from_resolved(resolved, seed=0)
    b = PPOBackend()
    venv = b.make_env(spec)
    try:
        with pytest.raises(ConfigError, match=r"train\.curriculum\.archive: restores provider states, which vizdoom:basic"):
            b.setup(spec, venv, device="cpu")
    finally:
        venv.close()


# -- a short training with share 0.5 ---------------------------------------------------------------
class Trace:
    """Spies on the run's own vector env (it still steps and restores for real): every episode end
    and every restore, in order, with the rollout step (global across rollouts) it happened at."""

    def __init__(self, venv: VectorEnv):
        self.events: list[tuple] = []
        self.t = -1
        step, restore = venv.step, venv.restore_lane

        def traced_step(actions):
            self.t += 1
            res = step(actions)
            for ep in res.episodes:
                self.events.append(("end", self.t, ep.lane, ep.return_))
            return res

        def traced_restore(lane, state):
            self.events.append(("restore", self.t, lane, blob_sha256(state)))
            return restore(lane, state)

        venv.step, venv.restore_lane = traced_step, traced_restore


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """12 rollouts of 8 lanes x 32 steps with share 0.5, the raw advantages of each, a checkpoint
    after 10 of them and the curriculum state then, and the backend after all 12."""
    spec = _spec(CURRICULUM)
    b = _backend(spec)
    assert isinstance(b.venv, VectorEnv)  # the maze steps in one vector env: global lane = lane
    trace = Trace(b.venv)
    b.begin(resumed=False)
    advantages, folder, saved = [], tmp_path_factory.mktemp("curriculum") / "ckpt", None
    for i in range(ROLLOUTS):
        b.collect()
        advantages.append(b.advantages.clone().numpy())
        b.update()
        if i == ROLLOUTS - 3:
            folder.mkdir()
            b.save(folder)
            saved = json.loads(json.dumps(b.curriculum.state.to_json()))
    yield {"spec": spec, "b": b, "trace": trace, "adv": np.concatenate(advantages), "folder": folder, "saved": saved}
    b.close()


def _episodes_by_origin(events: list[tuple]) -> tuple[list[float], list[float]]:
    """Returns of finished (target-origin, archive-origin) episodes: an episode is of archive origin
    when its lane was restored after its previous episode ended."""
    restored: set[int] = set()
    target, archive = [], []
    for kind, _t, lane, value in events:
        if kind == "restore":
            restored.add(lane)
        else:
            (archive if lane in restored else target).append(value)
            restored.discard(lane)
    return target, archive


def test_archive_origin_episodes_count_only_in_the_from_archive_metrics(trained):
    b, trace = trained["b"], trained["trace"]
    target, archive = _episodes_by_origin(trace.events)
    assert len(archive) >= 3 and len(target) >= 8
    cur = b.curriculum
    assert cur.state.archive_starts == sum(1 for e in trace.events if e[0] == "restore")
    assert list(b.episodes.returns) == pytest.approx(target[-100:])
    assert list(cur.episodes.returns) == pytest.approx(archive[-100:])
    m = b.rollout_metrics()
    assert m["train/episode/count"] == len(target)
    assert m["train/curriculum/archive/episode_count"] == len(archive)
    assert m["train/episode/return/shaped/from/target/mean"] == pytest.approx(np.mean(target[-100:]))
    assert m["train/episode/return/shaped/mean"] == m["train/episode/return/shaped/from/target/mean"]
    assert m["train/episode/return/shaped/from/archive/mean"] == pytest.approx(np.mean(archive[-100:]))
    assert 0 < m["train/curriculum/archive/cell_count"] <= 1000
    assert m["train/curriculum/archive/start_count"] == len([e for e in trace.events if e[0] == "restore"])
    from gradlab.metrics import registry

    registry.check_names(m)


def test_the_value_error_priority_is_the_ema_of_mean_abs_raw_advantage(trained):
    b, trace, adv = trained["b"], trained["trace"], trained["adv"]
    st = b.curriculum.state
    key_of = {c.state: c.key for c in st.archive.cells.values()}
    rate = st.ema_rate
    expected: dict[str, float] = {}
    started: dict[int, tuple[int, str]] = {}
    for kind, t, lane, value in sorted(trace.events, key=lambda e: (e[1], e[0] == "restore", e[2])):
        if kind == "restore":  # the restored episode's first step in the rollout tensors is t + 1
            started[lane] = (t + 1, key_of.get(value))
        elif lane in started:
            t0, key = started.pop(lane)
            if key is None:
                continue  # its cell was evicted since
            x = float(np.mean(np.abs(adv[t0:t + 1, lane]).astype(np.float64)))
            expected[key] = x if key not in expected else (1 - rate) * expected[key] + rate * x
    assert expected, "no archive-origin trajectory completed"
    assert st.priority == pytest.approx(expected, rel=1e-6)
    assert st.priority_updates >= len(expected)
    assert any(v > 0 for v in st.priority.values())


def test_resume_restores_the_archive_and_priorities_bit_exactly(trained):
    folder, saved = trained["folder"], trained["saved"]
    b = _backend(trained["spec"])
    try:
        assert b.restore(folder) is True  # the lanes continue mid-episode
        assert b.curriculum.state.to_json() == saved
        for sha, data in b.curriculum.state.archive.blobs.items():
            assert (folder / RESUME_DIR / STATES_DIR / f"{sha}.bin").read_bytes() == data
        assert blob_sha256(data) == sha
        # The resumed run continues as the uninterrupted one did: same archive and priorities after two more rollouts.
        b.begin(resumed=True)
        for _ in range(2):
            b.collect()
            b.update()
        assert b.curriculum.state.to_json() == trained["b"].curriculum.state.to_json()
    finally:
        b.close()


def test_a_corrupted_state_blob_is_refused_naming_it(trained, tmp_path):
    import shutil

    folder = tmp_path / "ckpt"
    shutil.copytree(trained["folder"], folder)
    blob = sorted((folder / RESUME_DIR / STATES_DIR).glob("*.bin"))[0]
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    b = _backend(trained["spec"])
    try:
        with pytest.raises(IntegrityError, match=rf"{blob.name}: provider state blob is corrupted"):
            b.restore(folder)
    finally:
        b.close()
    assert (trained["folder"] / RESUME_DIR / CURRICULUM_FILE).is_file()


def test_evaluation_of_a_curriculum_checkpoint_uses_only_normal_resets(trained, monkeypatch):
    spec, folder = trained["spec"], trained["folder"]
    restores: list[int] = []
    original = VectorEnv.restore_lane

    def spy(self, lane, state):
        restores.append(lane)
        return original(self, lane, state)

    monkeypatch.setattr(VectorEnv, "restore_lane", spy)
    result = evaluate_policy(load_policy(folder, verify=False), goal=spec.goal, environment=spec.eval_environment,
                             hashes=spec.hashes, checkpoint_sha256="0" * 64, checkpoint_step=1, run_id=spec.run_id,
                             max_steps=10_000)
    assert restores == []
    assert result.completed == len(result.episodes) >= 1  # the goal's protocol stops at the first failure
    assert all(ep.start is None and ep.length <= 150 for ep in result.episodes)
