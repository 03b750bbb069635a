"""The task program contract: signals → events → termination → reward.

The behaviour lives in :mod:`gradlab.envs.task`; these models only describe it. Semantics:

* a **signal** is a named scalar read each step from the provider's ``info`` dict, from RAM where
  the provider exposes it (one byte, or several bytes read as one number), or from a provider flag (``terminated``/``truncated``/``lives``...);
* an **event** is a boolean computed from one signal each step: ``equals`` (signal == value),
  ``equals_for`` (signal == value for ``steps`` consecutive steps), ``increase``/``decrease``
  (signal changed against the previous step), ``unchanged_for`` (same value for ``steps`` steps);
* **termination**: any ``success`` or ``failure`` event terminates the episode; any ``timeout``
  event, or reaching ``max_episode_steps``, truncates it. Reaching a time limit is recorded as the
  outcome ``timeout_is`` names (``timeout`` unless a survival goal says ``success``); the episode
  is still truncated, so the value is bootstrapped there. When several fire in one step,
  ``outcome_precedence`` decides the outcome; a step that is both terminal and truncated is
  terminal. A provider's own termination maps to ``native_terminated`` and its own time limit is
  a truncation with reason ``native_time_limit``;
* **reward**: ``native``, ``events``, ``native_plus_events`` or ``terms`` (named reward shapes,
  :class:`RewardTerm`, each clipped by its own ``clip``); their sum is the task reward, which is
  divided by ``reward_scale`` (a positive divisor) and then clipped by ``reward_clip`` (``true`` =
  [-1, 1]). Each named part of the task reward (a term; or ``native`` and each rewarded event) is a
  reward component, logged as ``train/reward/component/{name}/...`` in task-reward units.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, model_serializer, model_validator

from gradlab.contracts.base import Contract

Outcome = Literal["success", "failure", "timeout", "ended"]

#: Most RAM bytes one signal reads (a 64-bit number).
MAX_SIGNAL_BYTES = 8


class Signal(Contract):
    source: Literal["info", "ram", "flag"] = Field(
        description="Where the value is read: the step's info dict, a RAM byte, or a provider flag."
    )
    key: str | None = Field(default=None, description="info key (source: info) or flag name (source: flag).")
    address: int | list[int] | None = Field(
        default=None, description="source: ram: a RAM byte's address, or the addresses of several bytes, most "
        "significant first, read as one unsigned number (Σ byte_i · 256^(n-1-i); e.g. a page byte and a "
        "position byte).")

    @model_validator(mode="after")
    def _check_source(self) -> Signal:
        if self.source in ("info", "flag") and not self.key:
            raise ValueError(f"source '{self.source}' needs 'key'")
        if self.source == "ram" and self.address is None:
            raise ValueError("source 'ram' needs 'address'")
        if isinstance(self.address, list) and not 1 <= len(self.address) <= MAX_SIGNAL_BYTES:
            raise ValueError(f"address: expected 1 to {MAX_SIGNAL_BYTES} byte addresses, found {len(self.address)}")
        if any(a < 0 for a in self.byte_addresses()):
            raise ValueError(f"address: expected byte addresses >= 0, found {self.address}")
        return self

    def byte_addresses(self) -> tuple[int, ...]:
        """The RAM addresses read, most significant first (one for a single byte); () off RAM."""
        if self.address is None:
            return ()
        return tuple(self.address) if isinstance(self.address, list) else (self.address,)


class Event(Contract):
    signal: str = Field(description="Name of the signal the event reads.")
    op: Literal["equals", "equals_for", "increase", "decrease", "unchanged_for"]
    value: float | int | bool | str | None = Field(default=None, description="Value for equals/equals_for.")
    steps: int | None = Field(default=None, ge=1, description="Consecutive steps for equals_for/unchanged_for.")

    @model_validator(mode="after")
    def _check_op(self) -> Event:
        if self.op in ("equals", "equals_for") and self.value is None:
            raise ValueError(f"op '{self.op}' needs 'value'")
        if self.op in ("equals_for", "unchanged_for") and self.steps is None:
            raise ValueError(f"op '{self.op}' needs 'steps'")
        return self


class Termination(Contract):
    success: list[str] = Field(default_factory=list, description="Events that end the episode as a success.")
    failure: list[str] = Field(default_factory=list, description="Events that end the episode as a failure.")
    timeout: list[str] = Field(default_factory=list, description="Events that truncate the episode.")
    max_episode_steps: int | None = Field(default=None, ge=1, description="Truncate after this many steps.")
    native_terminated: Outcome = Field(
        default="ended", description="Outcome recorded when the provider itself terminates the episode."
    )
    outcome_precedence: list[Literal["success", "failure", "timeout"]] = Field(
        default_factory=lambda: ["failure", "success", "timeout"],
        description="Which outcome wins when several fire in the same step.",
    )
    timeout_is: Literal["timeout", "success", "failure"] = Field(
        default="timeout",
        description="Outcome recorded when the episode reaches its time limit (max_episode_steps or the "
                    "provider's own): 'success' for survival goals (CartPole). Truncation stays truncation.",
    )

    @model_validator(mode="after")
    def _check_precedence(self) -> Termination:
        if sorted(self.outcome_precedence) != ["failure", "success", "timeout"]:
            raise ValueError("outcome_precedence must list success, failure and timeout once each")
        return self

    @model_serializer(mode="wrap")
    def _omit_default_timeout_is(self, handler: Any) -> dict[str, Any]:
        # A goal that does not set timeout_is keeps the contract hash it had before the key existed.
        data = handler(self)
        if data.get("timeout_is") == "timeout":
            del data["timeout_is"]
        return data


class RewardTerm(Contract):
    """One named reward shape; its value each step, in task-reward units, is clipped by ``clip``.

    * ``native``: ``weight`` × the provider's reward;
    * ``progress``: ``weight`` × how far ``signal`` went past its largest value so far in the
      episode (the value at reset is the start; only new progress pays, going back costs nothing);
    * ``time``: ``weight`` every step (a per-step time cost when negative);
    * ``event``: ``weight`` on each step ``event`` fires (a death penalty, a completion bonus).
    """

    kind: Literal["native", "progress", "time", "event"]
    weight: float = Field(default=1.0, description="Multiplier of the term's base value.")
    signal: str | None = Field(default=None, description="progress: the signal whose new maximum pays.")
    event: str | None = Field(default=None, description="event: the event that pays when it fires.")
    clip: tuple[float, float] | None = Field(default=None, description="[low, high] of this term per step, or null.")

    @model_validator(mode="after")
    def _check_kind(self) -> RewardTerm:
        if self.kind == "progress" and not self.signal:
            raise ValueError("a progress term needs 'signal'")
        if self.kind == "event" and not self.event:
            raise ValueError("an event term needs 'event'")
        if self.clip is not None and self.clip[0] > self.clip[1]:
            raise ValueError(f"clip low {self.clip[0]} is above high {self.clip[1]}")
        return self


class Reward(Contract):
    source: Literal["native", "events", "native_plus_events", "terms"] = "native"
    events: dict[str, float] = Field(default_factory=dict, description="Reward added when an event fires.")
    terms: dict[Annotated[str, StringConstraints(pattern=r"^[a-z0-9_]+$")], RewardTerm] = Field(
        default_factory=dict, description="source: terms: the named reward shapes summed into the task reward.")
    reward_scale: float = Field(default=1.0, gt=0.0, description="Positive divisor of the task reward, applied "
                                "before clipping (below 1 amplifies it).")
    reward_clip: bool | tuple[float, float] = Field(
        default=False, description="false, true for [-1, 1], or [low, high]."
    )

    @model_validator(mode="after")
    def _check_clip(self) -> Reward:
        if isinstance(self.reward_clip, tuple) and self.reward_clip[0] > self.reward_clip[1]:
            raise ValueError(f"reward_clip low {self.reward_clip[0]} is above high {self.reward_clip[1]}")
        if self.source in ("native", "terms") and self.events:
            raise ValueError(f"reward.events given but reward.source is '{self.source}' (use an event term)")
        if (self.source == "terms") != bool(self.terms):
            raise ValueError("reward.terms needs reward.source 'terms' and source 'terms' needs at least one term")
        return self

    @model_serializer(mode="wrap")
    def _omit_empty_terms(self, handler: Any) -> dict[str, Any]:
        # A reward without terms keeps the contract hash it had before the key existed.
        data = handler(self)
        if not data.get("terms"):
            data.pop("terms", None)
        return data


class TaskProgram(Contract):
    signals: dict[str, Signal] = Field(default_factory=dict)
    events: dict[str, Event] = Field(default_factory=dict)
    termination: Termination = Field(default_factory=Termination)
    reward: Reward = Field(default_factory=Reward)
    progress: list[str] = Field(
        default_factory=list, description="Signals whose last value is recorded with every finished episode."
    )

    @model_validator(mode="after")
    def _check_names(self) -> TaskProgram:
        problems = []
        for name, event in self.events.items():
            if event.signal not in self.signals:
                problems.append(f"event '{name}' reads unknown signal '{event.signal}'")
        for kind in ("success", "failure", "timeout"):
            for name in getattr(self.termination, kind):
                if name not in self.events:
                    problems.append(f"termination.{kind} names unknown event '{name}'")
        for name in self.reward.events:
            if name not in self.events:
                problems.append(f"reward.events names unknown event '{name}'")
        for name, term in self.reward.terms.items():
            if term.signal is not None and term.signal not in self.signals:
                problems.append(f"reward.terms.{name} reads unknown signal '{term.signal}'")
            if term.event is not None and term.event not in self.events:
                problems.append(f"reward.terms.{name} names unknown event '{term.event}'")
        for name in self.progress:
            if name not in self.signals:
                problems.append(f"progress names unknown signal '{name}'")
        if problems:
            raise ValueError("; ".join(problems))
        return self
