"""Human play from the keyboard: a key map from the action meanings, and a session that records.

:func:`key_map` derives the keys of a Discrete goal's actions from the provider's action meanings
(``gradlab env inspect``): the words LEFT / RIGHT / UP / DOWN in a meaning are the arrow keys and
FIRE is Space, so a combined meaning (ALE's ``UPRIGHTFIRE``) is a chord of keys held together;
every action ``i < 10`` is also the number key ``i``. A goal with a ``NOOP`` action plays in real
time (the server steps at a fixed rate with the keys held at that moment, ``NOOP`` when none
acting); any other plays turn by turn (one step per key press).

:class:`HumanSession` is what the playback worker runs for a person instead of a
:class:`gradlab.play.session.PlaybackSession`: one lane of the goal's evaluation environment, reset
with the recording plan's episode seeds (the goal's evaluation manifest, as ``gradlab dataset
record`` plans it), each step observed by the dataset recorder policies are recorded with
(:class:`gradlab.datasets.record.EpisodeRecorder`), so the per-step arrays are the same and
``gradlab dataset verify`` re-simulates them; when the plan's last episode ends the dataset is
published create-only (:func:`gradlab.datasets.store.publish_dataset`). docs/ARCHITECTURE.md section 12.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gradlab.errors import ContractViolation

#: Words of an action meaning and the ``KeyboardEvent.key`` each stands for, in chord order.
KEY_OF_WORD = {"UP": "ArrowUp", "DOWN": "ArrowDown", "LEFT": "ArrowLeft", "RIGHT": "ArrowRight", "FIRE": " "}
#: How the page names a key.
KEY_LABELS = {"ArrowUp": "↑", "ArrowDown": "↓", "ArrowLeft": "←", "ArrowRight": "→", " ": "Space"}
#: Keys held at once that a session considers (the page sends at most this many).
MAX_HELD = 16


@dataclass(frozen=True)
class KeyMap:
    """Keys → actions of one Discrete goal.

    Attributes:
        meanings: (n_actions,) the provider's action meanings.
        chords: (n_actions,) the keys each action's meaning names (empty: number key only); an
            action whose chord an earlier action already has gets the number key only.
        noop: the index of ``NOOP``, the action when no key is held; None when the goal has none.
    """

    meanings: tuple[str, ...]
    chords: tuple[frozenset[str], ...]
    noop: int | None

    @property
    def mode(self) -> str:
        """``realtime`` (fixed-rate steps, ``NOOP`` when idle) or ``turn`` (one step per key press)."""
        return "realtime" if self.noop is not None else "turn"

    def action(self, held: Iterable[str]) -> int | None:
        """The action for the keys held, in press order.

        The last number key held wins; else the action whose chord is exactly the held map keys;
        else the one with the largest chord inside them (lowest index on a tie); else ``noop``
        (None for a turn-based goal: no step).
        """
        held = list(held)[:MAX_HELD]
        for key in reversed(held):
            if len(key) == 1 and key.isdigit() and int(key) < len(self.meanings):
                return int(key)
        pressed = frozenset(held)
        best, size = None, 0
        for i, chord in enumerate(self.chords):
            if chord and chord == pressed & chord and len(chord) > size:
                best, size = i, len(chord)
                if chord == pressed:
                    break
        return best if best is not None else self.noop

    def as_json(self) -> list[dict[str, Any]]:
        """One row per action for the page: ``{action, meaning, keys, labels}`` (keys in chord order,
        then the number key)."""
        order = list(KEY_OF_WORD.values())
        rows = []
        for i, (meaning, chord) in enumerate(zip(self.meanings, self.chords, strict=True)):
            keys = sorted(chord, key=order.index)
            labels = ["+".join(KEY_LABELS[k] for k in keys)] if keys else []
            if i < 10:
                labels.append(str(i))
            rows.append({"action": i, "meaning": meaning, "keys": keys, "labels": labels,
                         "noop": i == self.noop})
        return rows


def key_map(meanings: Iterable[str]) -> KeyMap:
    """The key map of a Discrete goal from its action meanings (see the module docstring).

    Args:
        meanings: (n_actions,) strings, e.g. ``["PUSH_LEFT", "PUSH_RIGHT"]`` or ALE's ``["NOOP",
            "FIRE", "RIGHT", "LEFT"]``.
    """
    meanings = tuple(str(m) for m in meanings)
    chords: list[frozenset[str]] = []
    noop = None
    for i, meaning in enumerate(meanings):
        word = meaning.upper()
        if word == "NOOP" and noop is None:
            noop = i
        chord = frozenset(key for w, key in KEY_OF_WORD.items() if w in word)
        chords.append(chord if chord not in chords else frozenset())
    return KeyMap(meanings=meanings, chords=tuple(chords), noop=noop)


class HumanSession:
    """One lane of a goal's evaluation environment stepped with a person's actions.

    Args:
        environment: the environment contract JSON (the goal's evaluation environment).
        plan: a :class:`gradlab.datasets.plan.RecordingPlan` JSON (agent ``human``) to record
            into, or None to play without recording (episode ``k`` then resets with ``seed + k``).
        seed: the first episode's seed when not recording.
        store: the dataset store the plan publishes to (default: the configured one).

    Raises:
        ContractViolation: the action space is not Discrete.
    """

    def __init__(self, environment: dict[str, Any], *, plan: dict[str, Any] | None = None, seed: int = 0,
                 store: Any = None):
        from gradlab.contracts.environment import EnvironmentSpec
        from gradlab.datasets.plan import RecordingPlan
        from gradlab.envs import make_vector_env
        from gradlab.play.session import action_meanings

        self.env_spec = EnvironmentSpec.model_validate(environment).model_copy(update={"n_envs": 1})
        self.plan = RecordingPlan.model_validate(plan) if plan is not None else None
        self.seed = int(seed)
        self._store = store
        self.index = 0  # the plan's episode being played
        first, _ = self._identity(0)
        base_seed = self.plan.base_seed if self.plan is not None else self.seed  # as record_chunk
        self.venv = make_vector_env(self.env_spec, seed=base_seed, lane_seeds=[first], render_mode="rgb_array")
        space = self.venv.single_action_space
        if type(space).__name__ != "Discrete":
            self.venv.close()
            raise ContractViolation(f"goal environment {self.env_spec.env_id}: human play needs a Discrete action "
                                    f"space, found {type(space).__name__}")
        self.n_actions = int(space.n)
        self.action_meanings = action_meanings(self.env_spec, self.n_actions)  # number keys play without them
        self.keys = key_map(self.action_meanings)
        enable_screen = getattr(self.venv.backend, "enable_screen", None)
        if callable(enable_screen):
            enable_screen()
        self.screen = "colour screen" if callable(enable_screen) else "render"
        self.recorder = None
        self.claim: Any = None
        self.rows: list[Any] = []
        self.published: dict[str, Any] | None = None
        self._has_starts = self.plan is not None and any(e.start is not None for e in self.plan.episodes)
        self._obs: np.ndarray | None = None

    # -- the plan ----------------------------------------------------------------------
    @property
    def episodes(self) -> int | None:
        return len(self.plan.episodes) if self.plan is not None else None

    def _identity(self, k: int) -> tuple[int, str | None]:
        if self.plan is None:
            return (self.seed + k) % 2**32, None
        e = self.plan.episodes[k]
        return e.seed, e.start

    def _stage(self, k: int) -> None:
        """Make the lane's next reset (the same-step autoreset included) start planned episode ``k``."""
        if self.plan is not None and k >= len(self.plan.episodes):
            return
        seed, start = self._identity(k)
        self.venv.set_next_seed(0, seed)
        if self._has_starts:
            self.venv.set_next_start(0, start)

    @property
    def recording(self) -> dict[str, Any] | None:
        """``{dataset, episodes, landed, published}`` when recording (``published``: the manifest's sha256)."""
        if self.plan is None:
            return None
        return {"dataset": self.plan.name, "episodes": len(self.plan.episodes), "landed": len(self.rows),
                "published": self.published["sha256"] if self.published else None}

    # -- stepping ----------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> Any:
        """Start the plan's first episode (``seed`` is used only when not recording); the t = 0 report."""
        from gradlab.datasets.record import EpisodeRecorder

        if self._obs is not None:
            raise ContractViolation("HumanSession.reset: the session has begun (an episode is never restarted)")
        if seed is not None and self.plan is None:
            self.seed = int(seed)
        self._stage(0)
        self._obs = self.venv.reset()
        self._stage(1)
        if self.plan is not None:
            from pathlib import Path

            from gradlab.datasets.staging import claim_staging

            # Held while this session records; staging of ended recordings of the name is removed.
            self.claim = claim_staging(Path(self.plan.staging_dir), name=self.plan.name,
                                       recording_id=self.plan.recording_id)
            self.recorder = EpisodeRecorder(self.venv, Path(self.plan.staging_dir) / "chunk-00000",
                                            frames=self.plan.frames, event_names=list(self.env_spec.task.events))
            self.recorder.started(self._obs)
        self._return = self._raw_return = 0.0
        self.t = 0
        return self._report(None, 0.0, 0.0, None, {}, [], {})

    def act(self, action: int) -> Any:
        """One step with ``action``; the step's report (at an episode's end, ``episode`` says how it
        ended and ``episode["recording"]`` what has landed).

        Raises:
            ContractViolation: no :meth:`reset` yet, an action outside ``0..n_actions-1``, or
                every planned episode has been recorded already.
        """
        from gradlab.evaluation.result import EpisodeRow
        from gradlab.play.session import json_number

        if self._obs is None:
            raise ContractViolation("HumanSession.act before reset")
        if not 0 <= int(action) < self.n_actions:
            raise ContractViolation(f"action {action}: expected 0..{self.n_actions - 1}")
        if self.published is not None:
            raise ContractViolation(f"dataset {self.plan.name}: every planned episode is recorded")  # type: ignore[union-attr]
        obs = self._obs
        actions = np.asarray([int(action)], dtype=np.int64)
        res = self.venv.step(actions)
        if self.recorder is not None:
            self.recorder.step(obs, actions, res)
        self._obs = res.obs
        raw, shaped = float(res.raw_reward[0]), float(res.reward[0])
        self._return += shaped
        self._raw_return += raw
        self.t += 1
        signals = {name: json_number(values[0]) for name, values in res.signals.items()}
        events = [name for name, hit in res.events.items() if bool(hit[0])]
        components = {name: float(values[0]) for name, values in res.components.items()}
        episode = None
        if res.episodes:
            rec = res.episodes[0]
            seed, start = self._identity(self.index)
            if rec.seed != seed or rec.start != start:
                raise ContractViolation(f"episode {self.index}: the environment reset with seed {rec.seed}, "
                                        f"the plan says {seed}")
            episode = {"outcome": rec.outcome, "reason": rec.reason, "length": rec.length, "return": rec.return_,
                       "raw_return": rec.raw_return, "seed": rec.seed, "terminated": bool(res.terminated[0]),
                       "truncated": bool(res.truncated[0]), "index": self.index}
            if self.recorder is not None:
                row = EpisodeRow(index=self.plan.episodes[self.index].index, lane=0, seed=rec.seed,  # type: ignore[union-attr]
                                 start=rec.start, return_=rec.return_, raw_return=rec.raw_return, length=rec.length,
                                 outcome=rec.outcome, reason=rec.reason, progress=dict(rec.progress))
                self.recorder.ended(0, row)
                self.rows.append(row)
                if len(self.rows) == len(self.plan.episodes):  # type: ignore[union-attr]
                    self._publish()
            self.index += 1
            self._stage(self.index + 1)
            episode["recording"] = self.recording
        report = self._report(int(action), raw, shaped, episode, signals, events, components)
        if episode is not None:
            self._return = self._raw_return = 0.0
            self.t = 0
        return report

    def _report(self, action: int | None, raw: float, shaped: float, episode: dict[str, Any] | None,
                signals: dict[str, Any], events: list[str], components: dict[str, float]) -> Any:
        from gradlab.play.session import StepReport, observation_view

        screen = getattr(self.venv.backend, "screen", None)
        frames = screen() if callable(screen) else None
        frame = frames[0] if frames else self.venv.render()[0]
        image, numbers = observation_view(self._obs[0])  # type: ignore[index]
        return StepReport(t=self.t, frame=frame, probs=None, action=action, value=0.0, value_acted=None,
                          reward_raw=raw, reward_shaped=shaped, episode_return=self._return,
                          episode_raw_return=self._raw_return, signals=signals, events=events, episode=episode,
                          observation=image, obs=numbers, reward_components=components)

    def _publish(self) -> None:
        """Store the recording: its files, then its manifest, create-only (every planned episode ended)."""
        from gradlab.datasets.plan import space_json
        from gradlab.datasets.store import publish_dataset

        plan, recorder = self.plan, self.recorder
        if plan is None or recorder is None:
            raise ContractViolation("HumanSession._publish: the session does not record")
        result = recorder.result(0, self.rows, {"observation": space_json(self.venv.single_observation_space),
                                                "action": space_json(self.venv.single_action_space)})
        if self._store is None:
            from gradlab.stores import open_dataset_store

            self._store = open_dataset_store()
        manifest = publish_dataset(self._store, plan, [result],
                                   created_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
        self.published = {"sha256": manifest.sha256, "name": manifest.name}

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()
        if self.claim is not None:
            self.claim.release()
        self.venv.close()
