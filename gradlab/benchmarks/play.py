"""``gradlab benchmark play``: the web player in headless chromium, CartPole and Breakout.

Per case, a checkpoint of an untrained policy with the recipe's network (the speed of playback
does not depend on what the weights learned) is written into a temporary run directory, and
``gradlab play RUN_ID --no-open`` is started in a process of its own. Measured:

* page open → first frame: from ``page.goto`` of the playback URL until the first frame is shown.
  The first open after start-up waits for the reserve worker's imports ("cold"); the second open,
  ``settle_s`` seconds later, finds a warm reserve ("warm", the issue's goal: <= 2 s);
* sustained steps/s at fps 0 with every panel on: steps whose telemetry and frame reached the page,
  over ``seconds`` seconds after a warm-up, and the frames the page drew (requestAnimationFrame);
* CPU share at fps 30 over ``seconds`` seconds: user + system CPU time of the server process and
  of its playback worker (``/proc/<pid>/stat``) divided by wall time (1.0 = one core).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CASES = {"cartpole": "CartPole-v1/ppo", "breakout": "Breakout-Atari2600-v0/ppo"}
RUN_IDS = {"cartpole": "gradlab-20260101T000000-00be0c01", "breakout": "gradlab-20260101T000000-00be0c02"}


def write_untrained_run(root: Path, recipe: str, run_id: str, *, step: int = 64) -> tuple[Path, Path]:
    """``root/<run_id>/spec.json`` and one checkpoint of an untrained SB3 policy with the recipe's network.

    The policy is built on the goal's own spaces (the vector env's observation and action spaces),
    written by the learner's checkpoint writer and exporter, so it loads like a trained one.

    Returns:
        (run directory, checkpoint folder).
    """
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import PPO

    from gradlab.checkpoints import write_checkpoint
    from gradlab.checkpoints.bundle import versions
    from gradlab.checkpoints.policy import export_policy, save_policy_files
    from gradlab.contracts import Experiments
    from gradlab.contracts.run_spec import RunSpec
    from gradlab.envs import make_vector_env

    spec = RunSpec.from_resolved(Experiments().resolve(recipe), seed=0, run_id=run_id)
    venv = make_vector_env(spec.eval_environment.model_copy(update={"n_envs": 1}), seed=0)
    obs_space, act_space = venv.single_observation_space, venv.single_action_space
    venv.close()

    class Spaces(gym.Env):
        observation_space, action_space = obs_space, act_space

        def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
            return np.zeros(obs_space.shape, obs_space.dtype), {}

        def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
            return np.zeros(obs_space.shape, obs_space.dtype), 0.0, True, False, {}

    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(spec.to_json()))
    torch.set_num_threads(1)
    pm = spec.recipe.train.policy_model
    image = len(obs_space.shape) == 3
    kwargs: dict[str, Any] = {"net_arch": pm.net_arch,
                              "activation_fn": {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[pm.activation]}
    model = PPO("CnnPolicy" if image else "MlpPolicy", Spaces(), seed=0, device="cpu", n_steps=64, batch_size=64,
                policy_kwargs=kwargs)

    def write(folder: Path) -> None:
        model.save(folder / "policy.zip")
        tensors, pspec = export_policy(model, backend_id="sb3.ppo", algorithm="ppo", policy_model=pm,
                                       env_observation_space=obs_space, transpose_image=False)
        save_policy_files(folder, tensors, pspec)

    path, _ = write_checkpoint(run_dir / "checkpoints", step=step, write_files=write, manifest_fields={
        "run_id": run_id, "purpose": "periodic", "goal_contract_sha256": spec.goal_contract_sha256,
        "recipe_sha256": spec.recipe_sha256, "environment_sha256": spec.environment_sha256,
        "backend_id": "sb3.ppo", "backend_config_sha256": "0" * 64, "versions": versions("gradlab"),
    })
    return run_dir, path


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (``/proc/<pid>/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _state(page: Any) -> dict[str, Any]:
    return page.evaluate("() => ({...window.gradlab.state, "
                         "drawn: Number(document.querySelector('#panel-game')?.dataset.frames || 0)})")


def _open(browser: Any, url: str) -> tuple[Any, float]:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    started = time.perf_counter()
    page.goto(url)
    page.wait_for_function("() => Number(document.querySelector('#panel-game')?.dataset.frames || 0) >= 1",
                           timeout=300_000)
    return page, time.perf_counter() - started


def _row(case: str, *, seconds: float, settle_s: float, home: Path, chromium: str, args: list[str]) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    run_id = RUN_IDS[case]
    write_untrained_run(home / "runs", CASES[case], run_id)
    env = {**os.environ, "GRADLAB_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-m", "gradlab.cli.app", "play", run_id, "--no-open", "--fps", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = proc.stdout.readline().strip()
        if not url.startswith("http://"):
            raise RuntimeError(f"gradlab play did not print its URL: {proc.stderr.read()[-2000:]}")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=args, headless=True)
            try:
                page, cold_s = _open(browser, url)
                page.close()
                time.sleep(settle_s)  # the reserve worker that replaced the one taken finishes its imports
                page, warm_s = _open(browser, url)
                time.sleep(1.0)  # warm-up at fps 0
                a = _state(page)
                t0 = time.perf_counter()
                time.sleep(seconds)
                b = _state(page)
                wall = time.perf_counter() - t0
                steps_per_s = (b["lastSeq"] - a["lastSeq"]) / wall
                drawn_per_s = (b["drawn"] - a["drawn"]) / wall
                worker = int(b["workerPid"])
                page.fill("#fps", "30")
                page.dispatch_event("#fps", "change")
                time.sleep(1.0)
                c0 = (_cpu_s(proc.pid), _cpu_s(worker), time.perf_counter(), _state(page)["lastSeq"])
                time.sleep(seconds)
                c1 = (_cpu_s(proc.pid), _cpu_s(worker), time.perf_counter(), _state(page)["lastSeq"])
                wall30 = c1[2] - c0[2]
                page.close()
            finally:
                browser.close()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"case": case, "recipe": CASES[case], "first_frame_cold_s": round(cold_s, 2),
            "first_frame_warm_s": round(warm_s, 2), "steps_per_s_fps0": round(steps_per_s, 1),
            "frames_drawn_per_s_fps0": round(drawn_per_s, 1),
            "steps_per_s_fps30": round((c1[3] - c0[3]) / wall30, 1),
            "server_cpu_frac_fps30": round((c1[0] - c0[0]) / wall30, 3),
            "worker_cpu_frac_fps30": round((c1[1] - c0[1]) / wall30, 3)}


def main(*, cases: tuple[str, ...], seconds: float, settle_s: float, as_json: bool) -> None:
    """Run the cases and print a table (or one JSON document)."""
    from rich.table import Table

    from gradlab.benchmarks.envs import machine
    from gradlab.console import console, err_console, print_json

    chromium = os.environ.get("GRADLAB_CHROMIUM", "/usr/bin/chromium")
    args = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="gradlab-bench-play-") as tmp:
        for case in cases:
            err_console.print(f"benchmark play: {case}", highlight=False)
            rows.append(_row(case, seconds=seconds, settle_s=settle_s, home=Path(tmp) / case, chromium=chromium,
                             args=args))
    if as_json:
        print_json({"machine": machine(), "rows": rows})
        return
    table = Table("case", "first frame cold (s)", "first frame warm (s)", "steps/s fps 0", "drawn/s fps 0",
                  "steps/s fps 30", "server CPU fps 30", "worker CPU fps 30")
    for r in rows:
        table.add_row(r["recipe"], f"{r['first_frame_cold_s']:.2f}", f"{r['first_frame_warm_s']:.2f}",
                      f"{r['steps_per_s_fps0']:.1f}", f"{r['frames_drawn_per_s_fps0']:.1f}",
                      f"{r['steps_per_s_fps30']:.1f}", f"{r['server_cpu_frac_fps30']:.1%}",
                      f"{r['worker_cpu_frac_fps30']:.1%}")
    console.print(table)
    console.print(machine())
