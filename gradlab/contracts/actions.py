"""Action profiles: a small discrete action set named over a provider's native actions.

A goal family declares profiles in a fragment under ``action_profiles:`` (a mapping of profile
name to ``{actions: [{name, buttons}, ...]}``); a goal picks one with
``train.environment.action_profile: NAME``. Composition (:func:`resolve_action_profile`) replaces
the name by the profile itself, so the profile's content is part of the environment contract and
of ``environment_sha256`` (docs/ARCHITECTURE.md section 3). The policy then sees
``Discrete(len(actions))``; action ``i`` presses ``actions[i].buttons`` together, in the
provider's own terms:

- ``retro``: the console's buttons (Genesis: ``B A MODE START UP DOWN LEFT RIGHT C Y X Z``), sent
  as stable-retro's MultiBinary button vector.
- ``ale``: joystick directions and ``FIRE`` (``UP DOWN LEFT RIGHT FIRE``), naming one action of
  ALE's full action set (``[UP, FIRE]`` is ``UPFIRE``; :func:`ale_action`).
- ``vizdoom``: the scenario's available buttons (``MOVE_LEFT``, ``ATTACK``...), sent as ViZDoom's
  button vector.

``buttons: []`` is the no-op. Which names a provider accepts is the provider's to say
(:meth:`gradlab.envs.backend.Provider.action_buttons`); the checks here are the ones that need no
provider: a profile has at least one action, names and button sets are unique.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError, model_validator

from gradlab.contracts.base import Contract

#: ALE's full action set, in ale-py's ``Action`` order (index = native action).
ALE_FULL_ACTIONS = ("NOOP", "FIRE", "UP", "RIGHT", "LEFT", "DOWN", "UPRIGHT", "UPLEFT", "DOWNRIGHT", "DOWNLEFT",
                    "UPFIRE", "RIGHTFIRE", "LEFTFIRE", "DOWNFIRE", "UPRIGHTFIRE", "UPLEFTFIRE", "DOWNRIGHTFIRE",
                    "DOWNLEFTFIRE")
#: The buttons an ALE profile action may press (a joystick and its fire button).
ALE_BUTTONS = ("UP", "DOWN", "LEFT", "RIGHT", "FIRE")


class ProfileAction(Contract):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_+\-]*$", description="The action's meaning, shown to people.")
    buttons: list[str] = Field(default_factory=list,
                               description="Provider-native buttons pressed together; [] = no button.")

    @model_validator(mode="after")
    def _unique_buttons(self) -> ProfileAction:
        twice = sorted({b for b in self.buttons if self.buttons.count(b) > 1})
        if twice:
            raise ValueError(f"action '{self.name}' names button(s) {twice} more than once")
        return self


class ActionProfile(Contract):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", description="The profile's name in its family.")
    actions: list[ProfileAction] = Field(description="Policy action i presses actions[i].buttons.")

    @model_validator(mode="after")
    def _check(self) -> ActionProfile:
        if not self.actions:
            raise ValueError(f"action profile '{self.name}' is empty: expected at least one action")
        names = [a.name for a in self.actions]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"action profile '{self.name}': action name(s) {twice} appear more than once")
        seen: dict[frozenset[str], str] = {}
        for a in self.actions:
            key = frozenset(a.buttons)
            if key in seen:
                raise ValueError(f"action profile '{self.name}': actions '{seen[key]}' and '{a.name}' press the same "
                                 f"buttons {sorted(key)} (duplicate action)")
            seen[key] = a.name
        return self

    @property
    def meanings(self) -> list[str]:
        """One label per policy action (``actions[i].name``)."""
        return [a.name for a in self.actions]


def ale_action(buttons: list[str]) -> int:
    """The index in :data:`ALE_FULL_ACTIONS` of the action pressing ``buttons`` together.

    Raises:
        ValueError: a name outside :data:`ALE_BUTTONS`, or opposite directions (UP with DOWN,
            LEFT with RIGHT), which ALE has no action for.
    """
    unknown = [b for b in buttons if b not in ALE_BUTTONS]
    if unknown:
        raise ValueError(f"unknown ALE button(s) {unknown}; expected names from {list(ALE_BUTTONS)}")
    pressed = set(buttons)
    for a, b in (("UP", "DOWN"), ("LEFT", "RIGHT")):
        if {a, b} <= pressed:
            raise ValueError(f"ALE has no action pressing {a} and {b} together")
    name = "".join(b for b in ("UP", "DOWN", "RIGHT", "LEFT", "FIRE") if b in pressed) or "NOOP"
    return ALE_FULL_ACTIONS.index(name)


def resolve_action_profile(data: dict[str, Any], profiles: Any, problem: Any) -> list[Any]:
    """Replace ``train.environment.action_profile: NAME`` in a composed goal by the named profile.

    Args:
        data: the composed goal (a mutable dict; ``action_profiles`` already removed from it).
        profiles: the composed ``action_profiles`` value (a mapping of name to ``{actions: [...]}``), or None.
        problem: ``problem(key_path_tuple, message) -> ConfigProblem`` (blames the file that set the key).

    Returns:
        The problems found (each declared profile is validated at ``action_profiles.<name>``; an
        unknown name is a problem at ``train.environment.action_profile``); empty when fine.
    """
    problems: list[Any] = []
    valid: dict[str, dict[str, Any]] = {}
    if profiles is not None and not isinstance(profiles, dict):
        return [problem(("action_profiles",), f"expected a mapping of profile names to {{actions: [...]}}; "
                                              f"found {type(profiles).__name__}")]
    for name, body in (profiles or {}).items():
        where = ("action_profiles", str(name))
        if not isinstance(body, dict):
            problems.append(problem(where, f"expected a mapping with 'actions'; found {type(body).__name__}"))
            continue
        try:
            valid[str(name)] = ActionProfile.model_validate({"name": str(name), **body}).model_dump(mode="json")
        except ValidationError as e:
            for err in e.errors(include_url=False):
                loc = tuple(str(p) for p in err["loc"])
                msg = err["msg"].removeprefix("Value error, ")
                if err["type"] == "extra_forbidden":
                    msg = "unknown key (expected actions, or name and buttons in an action)"
                elif err["type"] == "missing":
                    msg = "missing required key"
                problems.append(problem((*where, *loc), f"{msg}; found {err.get('input')!r}"
                                        if err["type"] not in ("value_error", "missing") else msg))
    env = (data.get("train") or {}).get("environment") if isinstance(data.get("train"), dict) else None
    ref = env.get("action_profile") if isinstance(env, dict) else None
    if isinstance(ref, str):
        where = ("train", "environment", "action_profile")
        # Copies on the way down: the composition's own mappings stay as read. A name that does not
        # resolve leaves no key behind, so its problem is reported once, here.
        rest = {k: v for k, v in env.items() if k != "action_profile"}
        data["train"] = {**data["train"], "environment": {**rest, **({"action_profile": valid[ref]}
                                                                      if ref in valid else {})}}
        if ref not in valid and ref not in (profiles or {}):
            known = sorted(valid)
            problems.append(problem(where, f"unknown action profile '{ref}'; expected one of {known} (declared under "
                                           "action_profiles in the goal or its family fragments)" if known else
                                           f"unknown action profile '{ref}': the goal and its fragments declare "
                                           "no action_profiles"))
    return problems
