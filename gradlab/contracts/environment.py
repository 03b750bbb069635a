"""The environment contract: which provider, which id, how preprocessed, which task program.

``n_envs``, ``vectorization`` and ``num_threads`` are runtime choices: they are excluded from
``environment_sha256``. Everything else is semantic.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_serializer, model_validator

from gradlab.contracts.actions import ActionProfile
from gradlab.contracts.base import Contract, validate_nested
from gradlab.contracts.task import TaskProgram


class AtariPreprocessing(Contract):
    """Standard Atari preprocessing (Machado et al. 2018; Mnih et al. 2015), done by ale-py.

    gradlab follows the ALE v5 convention: ``frame_skip`` 4 and sticky actions with probability
    0.25 by default. ``terminal_on_life_loss`` is not a hidden wrapper: use a ``lives`` signal
    with a ``decrease`` event in the task program.
    """

    frame_skip: int = Field(default=4, ge=1)
    max_pool: bool = Field(default=True, description="Max-pool the last two frames of a skip.")
    grayscale: bool = True
    resize: tuple[int, int] | None = Field(default=(84, 84), description="(height, width) in pixels, or null.")
    frame_stack: int = Field(default=4, ge=1)
    repeat_action_probability: float = Field(default=0.25, ge=0.0, le=1.0, description="Sticky actions.")
    noop_max: int = Field(default=30, ge=0, description="Random no-ops at reset, up to this many.")
    full_action_space: bool = False
    episodic_life: bool = Field(default=False, description="Reserved: use a lives signal instead.")

    @model_validator(mode="after")
    def _no_hidden_life_loss(self) -> AtariPreprocessing:
        if self.episodic_life:
            raise ValueError("episodic_life is a task signal in gradlab: add a 'lives' signal and a decrease event")
        return self


class VizdoomPreprocessing(Contract):
    frame_skip: int = Field(default=4, ge=1)
    resolution: Literal["160x120", "320x240", "640x480"] = "160x120"
    screen_format: Literal["GRAY8", "RGB24"] = "GRAY8"
    resize: tuple[int, int] | None = Field(default=(84, 84), description="(height, width) in pixels, or null.")
    frame_stack: int = Field(default=4, ge=1)


class RetroPreprocessing(Contract):
    frame_skip: int = Field(default=4, ge=1)
    grayscale: bool = True
    resize: tuple[int, int] | None = Field(default=(84, 84))
    frame_stack: int = Field(default=4, ge=1)
    state: str | None = Field(default=None, description="Start state; null = the game's default.")
    use_restricted_actions: Literal["discrete", "multi_discrete", "filtered"] = "discrete"


class GymnasiumPreprocessing(Contract):
    frame_stack: int = Field(default=1, ge=1)
    normalize_observation: bool = False


PREPROCESSING_MODELS: dict[str, type[Contract]] = {
    "ale": AtariPreprocessing,
    "vizdoom": VizdoomPreprocessing,
    "retro": RetroPreprocessing,
    "gymnasium": GymnasiumPreprocessing,
    "gradlab": GymnasiumPreprocessing,
}


class EnvironmentSpec(Contract):
    provider: str = Field(description="Provider name from the gradlab.providers registry.")
    env_id: str = Field(description="The provider's environment id.")
    n_envs: int = Field(default=1, ge=1, le=1024, description="Lanes in the vector env (not hashed).")
    vectorization: Literal["auto", "sync", "async", "native"] = Field(
        default="auto", description="How lanes are stepped (not hashed)."
    )
    num_threads: int | None = Field(default=None, ge=1, description="Provider worker threads (not hashed).")
    provider_args: dict[str, Any] = Field(default_factory=dict, description="Semantic provider arguments.")
    preprocessing: dict[str, Any] = Field(
        default_factory=dict, description="Provider-specific preprocessing, validated per provider."
    )
    task: TaskProgram = Field(default_factory=TaskProgram)
    action_profile: ActionProfile | None = Field(
        default=None, description="The policy's discrete actions over the provider's native ones; in YAML the "
                                  "name of a profile the goal's family declares under action_profiles.")

    @model_serializer(mode="wrap")
    def _omit_absent_profile(self, handler: Any) -> dict[str, Any]:
        # An environment without a profile keeps the environment_sha256 it had before the key existed.
        data = handler(self)
        if data.get("action_profile") is None:
            data.pop("action_profile", None)
        return data

    @model_validator(mode="after")
    def _check_preprocessing(self) -> EnvironmentSpec:
        model = PREPROCESSING_MODELS.get(self.provider)
        if model is not None:
            # Validate now so a typo names preprocessing.<key>; the normalised dict (defaults filled)
            # becomes the stored value, so equivalent spellings hash alike.
            normalised = validate_nested(model, self.preprocessing, ("preprocessing",))
            object.__setattr__(self, "preprocessing", normalised)
        return self

    def semantic(self) -> dict[str, Any]:
        """The fields ``environment_sha256`` covers (everything but lanes and threads)."""
        return self.model_dump(mode="json", exclude={"n_envs", "vectorization", "num_threads"})
