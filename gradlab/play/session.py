"""Playback of one checkpoint on its goal's evaluation environment, one step at a time.

:class:`PlaybackSession` is the in-process core the playback worker (:mod:`gradlab.play.worker`)
runs: it loads the checkpoint's weights-only policy (``policy.safetensors`` + ``policy_spec.json``,
every file's sha256 checked against the manifest first, nothing unpickled), builds the goal's
evaluation environment with one lane and the same task program as training and evaluation
(``gradlab.envs.make_vector_env``; docs/ARCHITECTURE.md section 4), and steps it, reporting for each
step the frame, the action distribution and chosen action, V(s), the raw and shaped rewards, the
episode return, the task program's signals and fired events, and at episode end the outcome,
reason, length, return and the realized discounted return-to-go of every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: Vector observations up to this many numbers travel with each step (the page shows them).
MAX_OBS_SHOWN = 64


def observation_view(obs: np.ndarray) -> tuple[np.ndarray | None, list[float] | None]:
    """One lane's observation as the page shows it: (image, None) for an image observation (the newest
    frame of a channel-first stack, or a channel-last image, as (h, w, 3) uint8), (None, numbers)
    for a small vector, (None, None) otherwise."""
    obs = np.asarray(obs)
    if obs.ndim == 3 and obs.dtype == np.uint8:
        if obs.shape[-1] in (1, 3):  # channel-last
            return np.ascontiguousarray(np.broadcast_to(obs[..., -1:] if obs.shape[-1] == 1 else obs,
                                                        (*obs.shape[:2], 3))), None
        return np.ascontiguousarray(np.repeat(obs[-1][:, :, None], 3, axis=2)), None
    if obs.size <= MAX_OBS_SHOWN:
        return None, [json_number(float(x)) if np.isfinite(x) else None for x in obs.astype(np.float64).ravel()]
    return None, None


def action_meanings(env_spec: Any, n_actions: int) -> list[str]:
    """The provider's action meanings, as ``gradlab env inspect`` prints them
    (:func:`gradlab.envs.describe`), when they name every one of ``n_actions`` actions; else
    ``action i``. Playback, human play and dataset replays show these names."""
    from gradlab.envs import describe

    try:
        names = [str(x) for x in describe(env_spec).action_meanings]
    except Exception:  # noqa: BLE001 - meanings are a nicety; a session plays without them
        names = []
    return names if names and len(names) == n_actions else [f"action {i}" for i in range(n_actions)]


def returns_to_go(rewards: np.ndarray, *, gamma: float, bootstrap: float = 0.0) -> np.ndarray:
    """Realized discounted return from every step of one episode.

    Args:
        rewards: (T,) float, shaped reward after step t.
        gamma: discount per step, in [0, 1] (the recipe's).
        bootstrap: V(s_T) of the true final observation when the episode was truncated, 0.0 when it
            terminated (a time limit does not end the task; a termination does).

    Returns:
        (T,) float64 with G_t = r_t + gamma * G_{t+1} and G_T = ``bootstrap``.

    Source: Sutton & Barto 2018, "Reinforcement Learning: An Introduction", eq. 3.9.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    out = np.empty_like(rewards)
    g = float(bootstrap)
    for t in range(rewards.shape[0] - 1, -1, -1):
        g = float(rewards[t]) + gamma * g
        out[t] = g
    return out


def json_number(x: Any) -> float | str | None:
    """A signal value as JSON: finite floats as floats, NaN/inf as None, strings as they are."""
    if isinstance(x, str):
        return x
    if x is None:
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return str(x)
    return f if math.isfinite(f) else None


@dataclass
class StepReport:
    """One playback step (or the reset that starts an episode, ``t == 0`` with no action).

    Attributes:
        t: steps taken in the current episode (0 at reset).
        frame: (H, W, 3) uint8 RGB screen after the step (for an episode's last step: the first
            frame of the next episode, since lanes reset in the same step): the provider's colour
            screen where it keeps one apart from the observation (ALE: 210x160), else its render.
        observation / obs: what the policy sees after the step: for image observations the newest
            frame of the stack as (h, w, 3) uint8 (``obs`` None); for vectors of at most
            :data:`MAX_OBS_SHOWN` numbers, ``obs`` (``observation`` None).
        probs: (n_actions,) action probabilities at the observation the step acted on, or None
            for non-Discrete action spaces and for the reset.
        action: the action taken (int for Discrete; a list otherwise), None at reset.
        value: V(s) of the observation shown (the next observation after the step); None for an
            action program.
        value_acted: V(s) of the observation the step acted on (what return-to-go is compared to).
        reward_raw, reward_shaped: the provider's reward and the task program's (0 at reset).
        episode_return, episode_raw_return: sums over the episode so far (shaped, raw).
        signals: signal name -> value read after the step. events: names of events that fired.
        reward_components: reward component name -> its part of this step's task reward (before
            ``reward_scale`` and clipping); empty when the reward is the native reward alone.
        episode: at the last step of an episode, ``{"outcome","reason","length","return",
            "raw_return","seed","terminated","truncated","returns_to_go","values"}``; else None.
    """

    t: int
    frame: np.ndarray
    probs: list[float] | None
    action: Any
    value: float | None
    value_acted: float | None
    reward_raw: float
    reward_shaped: float
    episode_return: float
    episode_raw_return: float
    signals: dict[str, Any] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    episode: dict[str, Any] | None = None
    observation: np.ndarray | None = None
    obs: list[float] | None = None
    reward_components: dict[str, float] = field(default_factory=dict)

    def telemetry(self) -> dict[str, Any]:
        """Everything but the frame and the observation image, as JSON-ready values."""
        return {"obs": self.obs,
            "t": self.t, "probs": self.probs, "action": self.action, "value": self.value,
            "value_acted": self.value_acted, "reward_raw": self.reward_raw, "reward_shaped": self.reward_shaped,
            "episode_return": self.episode_return, "episode_raw_return": self.episode_raw_return,
            "signals": self.signals, "events": self.events, "episode": self.episode,
            "reward_components": self.reward_components,
        }


def verify_mode(resolved: Any) -> str:
    """How a resolved checkpoint is verified before playback: ``weights_only`` for a published
    repository (``origin == "hub"``: its policy files were checked against ``gradlab.json`` when it
    was loaded, and it ships no resume files), ``full`` for everything else."""
    return "weights_only" if getattr(resolved, "origin", None) == "hub" else "full"


class PlaybackSession:
    """A checkpoint's policy acting on one lane of its goal's evaluation environment.

    Args:
        checkpoint_dir: the checkpoint folder (verified: every file's sha256 against its manifest).
        spec: the run spec JSON (``gradlab.contracts.run_spec.RunSpec``) the checkpoint belongs to.
        deterministic: greedy actions (True) or sampled ones.
        seed: the seed of the first episode.
        cell: replay the action program that reached this cell of the checkpoint's archive
            (``gradlab.go_explore`` checkpoints, :func:`gradlab.play.archive.cell_program`) instead
            of the checkpoint's own program.

    An action program (a search backend's checkpoint) is replayed open loop from each reset:
    step ``t`` takes ``actions[t]``, action 0 past its end (as evaluation replays it); its action
    distribution is all on that action and it has no value, so ``value`` is None.

    Raises:
        IntegrityError: a checkpoint file does not match its manifest (named). NotFound: not a
            checkpoint. ContractViolation: the run spec does not validate (key paths named), or the
            checkpoint's goal/environment hashes differ from the spec's, or ``cell`` was given for a
            checkpoint without an archive. NotFound: no such cell in the archive.
    """

    def __init__(self, checkpoint_dir: Path, spec: dict[str, Any], *, deterministic: bool = True, seed: int = 0,
                 verify: str = "full", cell: str | None = None):
        from gradlab.checkpoints import load_policy, verify_checkpoint
        from gradlab.envs import make_vector_env
        from gradlab.errors import ContractViolation
        from gradlab.evaluation.runner import parse_spec

        self.run_spec = parse_spec(spec, source=f"run spec of {checkpoint_dir}")
        if verify == "weights_only":  # a published repository ships the policy files only, each
            from gradlab.evaluation.runner import verify_weights_only  # checked against gradlab.json

            manifest = verify_weights_only(Path(checkpoint_dir))
        else:
            manifest = verify_checkpoint(Path(checkpoint_dir))
        for key in ("goal_contract_sha256", "environment_sha256"):
            if getattr(manifest, key) != getattr(self.run_spec, key):
                raise ContractViolation(f"{checkpoint_dir}: {key} is {getattr(manifest, key)}, "
                                        f"the run spec says {getattr(self.run_spec, key)}")
        self.manifest = manifest
        self.policy = load_policy(Path(checkpoint_dir), verify=False)  # verified just above
        from gradlab.checkpoints.program import ProgramPolicy

        #: The action program replayed open loop (None for a network policy), and the cell it reaches.
        self.program: np.ndarray | None = None
        self.cell = cell
        if isinstance(self.policy, ProgramPolicy):
            self.program = self.policy.actions
        if cell is not None:
            from gradlab.play.archive import cell_program

            if self.program is None:
                raise ContractViolation(f"{checkpoint_dir}: cell {cell!r}: only a search checkpoint's archive has "
                                        "cells to replay")
            program = cell_program(Path(checkpoint_dir), cell)
            n = int(self.policy.spec.n_actions)
            if any(a >= n for a in program):
                from gradlab.errors import IntegrityError

                raise IntegrityError(f"{checkpoint_dir}: cell {cell!r}: action {max(program)} in its program, "
                                     f"the goal has {n} actions")
            self.program = np.asarray(program, dtype=np.int64)
        env_spec = self.run_spec.eval_environment.model_copy(update={"n_envs": 1})
        self.env_spec = env_spec
        self.venv = make_vector_env(env_spec, seed=seed, lane_seeds=[seed], render_mode="rgb_array")
        enable_screen = getattr(self.venv.backend, "enable_screen", None)
        if callable(enable_screen):  # a provider whose render is the observation keeps its colour screen apart
            enable_screen()
        self.screen = "colour screen" if callable(enable_screen) else "render"
        # A search backend has no discount: its returns-to-go are undiscounted sums.
        self.gamma = float(getattr(self.run_spec.recipe.train.backend.typed_config(), "gamma", 1.0))
        self.deterministic = deterministic
        self.discrete = self.program is not None or self.policy.spec.action_space.type == "Discrete"
        self.action_meanings = self._action_meanings()
        self.seed = seed
        self._obs: np.ndarray | None = None
        self._value_obs: float | None = 0.0
        self._rewards: list[float] = []
        self._values: list[float | None] = []
        self._return = 0.0
        self._raw_return = 0.0
        self.t = 0
        self._rng = np.random.default_rng(seed)

    def _action_meanings(self) -> list[str]:
        if self.program is not None:
            n = int(self.policy.spec.n_actions)
        else:
            n = int(self.policy.spec.action_space.n or 0) if self.discrete else 0
        return action_meanings(self.env_spec, n)

    @property
    def n_actions(self) -> int:
        return len(self.action_meanings)

    def _value(self, obs: np.ndarray) -> float | None:
        """V(s) of one observation batch's lane 0; None for an action program."""
        return None if self.program is not None else float(self.policy.value(obs)[0])

    def _program_action(self) -> int:
        """The program's action at episode step ``t`` (0 past its end)."""
        assert self.program is not None
        return int(self.program[self.t]) if self.t < len(self.program) else 0

    # -- stepping ------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> StepReport:
        """Start a new episode; the same seed gives the same first frames (and, deterministic, the same episode).

        Args:
            seed: the episode's reset seed and the sampling generator's seed; None keeps the
                session's current seed.
        """
        if seed is not None:
            self.seed = int(seed)
        self.venv.set_next_seed(0, self.seed)
        self._rng = np.random.default_rng(self.seed)
        self._obs = self.venv.reset()
        return self._begin(self._obs, frame=self._frame())

    def _frame(self) -> np.ndarray:
        screen = getattr(self.venv.backend, "screen", None)
        frames = screen() if callable(screen) else None
        return frames[0] if frames else self.venv.render()[0]

    def _begin(self, obs: np.ndarray, *, frame: np.ndarray) -> StepReport:
        self._rewards, self._values = [], []
        self._return = self._raw_return = 0.0
        self.t = 0
        self._value_obs = self._value(obs)
        image, numbers = observation_view(obs[0])
        return StepReport(t=0, frame=frame, probs=self._probs(obs), action=None, value=self._value_obs,
                          value_acted=None, reward_raw=0.0, reward_shaped=0.0, episode_return=0.0,
                          episode_raw_return=0.0, observation=image, obs=numbers)

    def _probs(self, obs: np.ndarray) -> list[float] | None:
        if not self.discrete:
            return None
        if self.program is not None:  # open loop: all of its probability on the program's next action
            probs = [0.0] * self.n_actions
            probs[self._program_action()] = 1.0
            return probs
        return [float(p) for p in self.policy.action_probs(obs)[0]]

    def step(self) -> StepReport:
        """One policy step. An episode's last step carries its report (``episode``) and the lane
        has already begun the next episode (continuing its RNG stream).

        Raises:
            ContractViolation: :meth:`reset` was never called.
        """
        if self._obs is None:
            from gradlab.errors import ContractViolation

            raise ContractViolation("PlaybackSession.step before reset")
        obs = self._obs
        probs = self._probs(obs)
        value_acted = self._value_obs
        if self.program is not None:
            action = np.array([self._program_action()], dtype=np.int64)
        else:
            action = self.policy.act(obs, deterministic=self.deterministic, rng=self._rng)
        res = self.venv.step(action)
        self._obs = res.obs
        raw, shaped = float(res.raw_reward[0]), float(res.reward[0])
        self._return += shaped
        self._raw_return += raw
        self._rewards.append(shaped)
        self._values.append(value_acted)
        self.t += 1
        signals = {name: json_number(values[0]) for name, values in res.signals.items()}
        events = [name for name, hit in res.events.items() if bool(hit[0])]
        components = {name: float(values[0]) for name, values in res.components.items()}
        frame = self._frame()
        image, numbers = observation_view(res.obs[0])
        act_json: Any = int(action[0]) if self.discrete else np.asarray(action[0]).tolist()
        episode = None
        if res.episodes:
            rec = res.episodes[0]
            truncated = bool(res.truncated[0])
            bootstrap = (self._value(res.final_obs[0][None]) or 0.0) if truncated else 0.0
            rtg = returns_to_go(np.asarray(self._rewards), gamma=self.gamma, bootstrap=bootstrap)
            episode = {"outcome": rec.outcome, "reason": rec.reason, "length": rec.length, "return": rec.return_,
                       "raw_return": rec.raw_return, "seed": rec.seed, "terminated": bool(res.terminated[0]),
                       "truncated": truncated, "bootstrap": bootstrap, "gamma": self.gamma,
                       "returns_to_go": [float(g) for g in rtg], "values": list(self._values)}
            report = StepReport(t=self.t, frame=frame, probs=probs, action=act_json, value=value_acted,
                                value_acted=value_acted, reward_raw=raw, reward_shaped=shaped,
                                episode_return=self._return, episode_raw_return=self._raw_return,
                                signals=signals, events=events, episode=episode, observation=image, obs=numbers,
                                reward_components=components)
            self._begin(self._obs, frame=frame)
            return report
        self._value_obs = self._value(self._obs)
        return StepReport(t=self.t, frame=frame, probs=probs, action=act_json, value=self._value_obs,
                          value_acted=value_acted, reward_raw=raw, reward_shaped=shaped,
                          episode_return=self._return, episode_raw_return=self._raw_return,
                          signals=signals, events=events, observation=image, obs=numbers,
                          reward_components=components)

    def close(self) -> None:
        self.venv.close()
