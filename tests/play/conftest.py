"""Fixtures of the web player's tests: real checkpoints written by the learner's own writer.

``cartpole_checkpoint``: a run directory (``spec.json`` + one checkpoint) of CartPole-v1/ppo from an
untrained SB3 PPO model with the recipe's network, so its episodes are short (tens of steps) and
every test sees several episode ends. The bandit run comes from ``tests/evaluation/conftest.py``.
Trained runs in real stores (file and S3) come from ``tests/play/trained.py``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.evaluation.conftest import write_bandit_run

CARTPOLE_RUN_ID = "gradlab-20260101T000000-0000cafe"


def write_cartpole_run(root: Path, *, run_id: str = CARTPOLE_RUN_ID) -> tuple[Path, Path]:
    """``root/<run_id>/spec.json`` and one checkpoint (step 64) of an untrained CartPole PPO policy."""
    from gradlab.benchmarks.play import write_untrained_run

    return write_untrained_run(root, "CartPole-v1/ppo", run_id)


@pytest.fixture(scope="session")
def cartpole_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(run directory, checkpoint folder) of an untrained CartPole-v1/ppo policy."""
    return write_cartpole_run(tmp_path_factory.mktemp("play_runs"))


@pytest.fixture(scope="session")
def bandit_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    return write_bandit_run(tmp_path_factory.mktemp("play_bandit"))


# -- real trained runs and a running player ------------------------------------------------------
from tests.runs.conftest import gradlab_env, last_json_line, prefect_api, prefect_server, run_gradlab  # noqa: E402,F401
from tests.s3server import _CREDENTIALS, shared_s3_server  # noqa: E402,F401


@dataclass(frozen=True)
class TrainedRuns:
    """Runs the suite trained once per session: CartPole and the bandit in file stores under
    ``file_home``, a bandit run in S3 stores (``s3_env``: the store URLs, endpoint and credentials)."""

    file_home: Path
    cartpole: dict
    bandit: dict
    s3_env: dict[str, str]
    s3_bandit: dict


def _train(recipe: str, env: dict[str, str]) -> dict:
    out = run_gradlab(["train", recipe, "--json"], env, timeout_s=900)
    assert out.returncode == 0, out.stderr[-3000:]
    receipt = last_json_line(out.stdout)
    assert receipt["outcome"] == "succeeded", receipt["reason"]
    return receipt


@pytest.fixture(scope="session")
def trained_runs(prefect_api: str, shared_s3_server, tmp_path_factory: pytest.TempPathFactory) -> TrainedRuns:  # noqa: F811
    home = tmp_path_factory.mktemp("play_trained_home")
    env = gradlab_env(prefect_api, GRADLAB_HOME=str(home), GRADLAB_CONFIG=str(home / "config.toml"))
    bucket = shared_s3_server.create_bucket()
    s3_env = {**_CREDENTIALS, "GRADLAB_S3_ENDPOINT_URL": shared_s3_server.endpoint_url,
              **{f"GRADLAB_{kind.upper()}_STORE_URL": f"s3://{bucket}/{kind}" for kind in ("control", "eval", "model")}}
    s3_home = tmp_path_factory.mktemp("play_s3_home")
    # The three runs train at once (as a user's sweep would): their imports and Prefect's
    # round trips overlap instead of adding up.
    with ThreadPoolExecutor(max_workers=3) as pool:
        cartpole = pool.submit(_train, "CartPole-v1/ppo", env)
        bandit = pool.submit(_train, "gradlab__bandit/ppo", env)
        s3_bandit = pool.submit(_train, "gradlab__bandit/ppo", {**env, **s3_env, "GRADLAB_HOME": str(s3_home)})
        cartpole, bandit, s3_bandit = cartpole.result(), bandit.result(), s3_bandit.result()
    return TrainedRuns(file_home=home, cartpole=cartpole, bandit=bandit, s3_env=s3_env, s3_bandit=s3_bandit)


@dataclass
class RunningPlayer:
    """A ``gradlab play`` server in this process (a thread), on a free loopback port."""

    config: object
    base: str
    token: str

    def api(self, path: str, token: str | None = "default") -> object:
        import httpx

        headers = {"X-Gradlab-Token": self.token if token == "default" else token} if token is not None else {}
        return httpx.get(f"{self.base}{path}", headers=headers, timeout=120)


@contextmanager
def running_player(**config_kwargs: object) -> Iterator[RunningPlayer]:
    """Serve the stores of the current environment (GRADLAB_* variables) until the block ends."""
    from gradlab.play.catalog import Catalog
    from gradlab.play.server import PlayConfig, bind_loopback, make_server
    from gradlab.settings import load_settings
    from gradlab.stores import open_stores

    settings = load_settings()
    sock = bind_loopback(0)
    port = sock.getsockname()[1]
    config = PlayConfig(catalog=Catalog(stores=open_stores(settings), settings=settings), port=port, **config_kwargs)
    server = make_server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline, "the player did not start"
        time.sleep(0.05)
    try:
        yield RunningPlayer(config=config, base=f"http://127.0.0.1:{port}", token=config.token)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        config.close_workers()
        sock.close()


@pytest.fixture(scope="session")
def file_player(trained_runs: TrainedRuns) -> Iterator[RunningPlayer]:
    """The player over the file stores of ``trained_runs`` (one for the session, a worker in reserve)."""
    saved = {k: os.environ.get(k) for k in ("GRADLAB_HOME", "GRADLAB_CONFIG")}
    os.environ["GRADLAB_HOME"] = str(trained_runs.file_home)
    os.environ["GRADLAB_CONFIG"] = str(trained_runs.file_home / "config.toml")
    try:
        with running_player() as player:
            player.config.prestart()
            yield player
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# -- a recorded dataset --------------------------------------------------------------------------
@dataclass(frozen=True)
class RecordedDataset:
    """A dataset recorded by the datasets' own recorder and published to a file dataset store."""

    store_url: str
    manifest: object


def record_dataset(root: Path, name: str, goal_id: str, *, episodes: int, frames: bool,
                   policy: str = "random") -> RecordedDataset:
    """Record ``episodes`` episodes of ``goal_id`` in this process (one chunk) into ``root/dataset-store``."""
    from gradlab.datasets.plan import plan_recording
    from gradlab.datasets.record import record_chunk
    from gradlab.datasets.store import publish_dataset
    from gradlab.stores import open_store

    store = open_store((root / "dataset-store").as_uri())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADLAB_HOME", str(root / "home"))
        mp.setenv("GRADLAB_CONFIG", str(root / "home" / "config.toml"))
        plan = plan_recording(name, goal_id=goal_id, policy=policy, episodes=episodes, chunk_episodes=episodes,
                              frames=frames)
        results = [record_chunk(plan, i) for i in range(len(plan.chunks))]
    manifest = publish_dataset(store, plan, results, created_at="2026-01-01T00:00:00+00:00")
    return RecordedDataset(store_url=store.base_url, manifest=manifest)


@pytest.fixture(scope="session")
def breakout_dataset(tmp_path_factory: pytest.TempPathFactory) -> RecordedDataset:
    """Two Breakout episodes of the random agent, with frames (a few seconds to record)."""
    return record_dataset(tmp_path_factory.mktemp("breakout_dataset"), "breakout-random", "Breakout-Atari2600-v0",
                          episodes=2, frames=True)
