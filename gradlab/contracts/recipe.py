"""The recipe contract: backend, model, hyperparameters and budget.

Backend configs use stable-baselines3's argument names (``n_steps``, ``batch_size``, ``gamma``,
``gae_lambda``, ``clip_range``, ``ent_coef``...) so a recipe reads like the library it runs on.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_serializer, model_validator

from gradlab.contracts.base import Contract, validate_nested


class LinearSchedule(Contract):
    """Linear from ``initial`` at step 0 to ``final`` at the end of the budget (SB3's progress)."""

    kind: Literal["linear"] = "linear"
    initial: float
    final: float = 0.0


Schedule = float | LinearSchedule


def check_schedule(value: Schedule) -> Schedule:
    """A learning rate, clip range or entropy coefficient is never negative, constant or at either
    end of its schedule (Adam refuses a negative learning rate only once training has started; a
    negative clip range or entropy coefficient turns PPO's objective around without a word).

    Raises:
        ValueError: a negative value (pydantic locates it at the field's key path).
    """
    ends = [value] if isinstance(value, (int, float)) else [value.initial, value.final]
    if any(not v >= 0 for v in ends):  # also NaN
        raise ValueError("a value >= 0, or a linear schedule between values >= 0")
    return value


#: Bounds of a network's hidden layers (``net_arch``): layers per MLP and units per layer. A recipe
#: and a policy spec read back from a store (gradlab.checkpoints.policy) are held to the same ones.
MAX_NET_LAYERS = 16
MAX_NET_WIDTH = 1 << 14


def check_net_arch(arch: list[int] | dict[str, list[int]]) -> list[int] | dict[str, list[int]]:
    """``net_arch`` as given, when every MLP has at most :data:`MAX_NET_LAYERS` layers of
    1..:data:`MAX_NET_WIDTH` units.

    Raises:
        ValueError: a layer out of bounds (a zero-width layer trained until its first checkpoint
            before the policy spec refused it; a negative one failed in the learner).
    """
    for layers in (arch.values() if isinstance(arch, dict) else [arch]):
        if len(layers) > MAX_NET_LAYERS or any(not 1 <= w <= MAX_NET_WIDTH for w in layers):
            raise ValueError(f"at most {MAX_NET_LAYERS} layers of 1..{MAX_NET_WIDTH} units")
    return arch


class PolicyModel(Contract):
    """The policy network. ``extractor: auto`` picks the Nature CNN (Mnih et al. 2015) for image
    observations and a flat MLP otherwise."""

    extractor: Literal["auto", "mlp", "nature_cnn"] = "auto"
    net_arch: list[int] | dict[Literal["pi", "vf"], list[int]] = Field(default_factory=lambda: [64, 64])
    activation: Literal["tanh", "relu"] = "tanh"
    ortho_init: bool = True
    features_dim: int = Field(default=512, ge=1, description="Nature CNN output width.")
    share_features_extractor: bool = True

    _check_net_arch = field_validator("net_arch")(check_net_arch)


#: stable-baselines3 constructor arguments (PPO's and A2C's) that are not backend config keys, each
#: with where gradlab takes that setting or why it does not: a recipe that names one is refused
#: with this reason instead of "unknown key" (``gradlab.contracts.compose``).
SB3_ARGUMENTS_ELSEWHERE: dict[str, str] = {
    "policy": "the policy follows from train.policy_model and the observation space (MlpPolicy or CnnPolicy)",
    "env": "the environment is the goal's (env:), changed by train.environment",
    "policy_kwargs": "set train.policy_model (extractor, net_arch, activation, ortho_init, features_dim, "
                     "share_features_extractor)",
    "seed": "the run's seed: gradlab train --seed (a cohort's seeds: gradlab sweep --seeds)",
    "device": "set train.device (auto, cpu or cuda)",
    "verbose": "gradlab shows a run's progress itself; its log is the run's learner.log",
    "tensorboard_log": "metrics go to the run's outbox and journal (gradlab curves; W&B with --wandb)",
    "stats_window_size": "episode statistics are over the last 100 finished episodes on both backends "
                         "(train/episode/return/raw/mean), SB3's default",
    "use_sde": "gSDE is not offered: Box actions are sampled from a state-independent diagonal Gaussian on both "
               "backends (gradlab.ppo has no gSDE), so a recipe means the same on either",
    "sde_sample_freq": "gSDE is not offered (see use_sde)",
    "rollout_buffer_class": "the rollout buffer is the backend's own (it bootstraps the value on truncation, never on "
                            "termination) and is not swapped",
    "rollout_buffer_kwargs": "the rollout buffer is the backend's own and takes no arguments",
    "_init_setup_model": "SB3's internal construction flag",
}


class PPOConfig(Contract):
    """stable-baselines3 PPO arguments (Schulman et al. 2017); defaults are SB3's."""

    #: SB3 arguments refused with a reason (:data:`SB3_ARGUMENTS_ELSEWHERE`).
    refused_keys: ClassVar[dict[str, str]] = SB3_ARGUMENTS_ELSEWHERE

    learning_rate: Schedule = 3e-4
    n_steps: int = Field(default=2048, ge=1)
    batch_size: int = Field(default=64, ge=1)
    n_epochs: int = Field(default=10, ge=1)
    gamma: float = Field(default=0.99, ge=0.0, le=1.0)
    gae_lambda: float = Field(default=0.95, ge=0.0, le=1.0)
    clip_range: Schedule = 0.2
    clip_range_vf: float | None = Field(default=None, gt=0.0)
    normalize_advantage: bool = True
    ent_coef: Schedule = 0.0
    vf_coef: float = Field(default=0.5, ge=0.0)
    max_grad_norm: float = Field(default=0.5, gt=0.0)
    target_kl: float | None = Field(default=None, gt=0.0)

    _check_schedules = field_validator("learning_rate", "clip_range", "ent_coef")(check_schedule)


#: Most torch threads a recipe may ask for (``train.backend.config.threads``); at run time the
#: learner uses at most the CPUs it may run on (``gradlab.learn.ppo``).
MAX_TORCH_THREADS = 256


class GradlabPPOConfig(PPOConfig):
    """``gradlab.ppo``: sb3.ppo's hyperparameters (same names, defaults and meaning) plus how to compute."""

    precision: Literal["fp32", "bf16", "fp16-amp"] = Field(
        default="fp32", description="Autocast dtype of the forward passes (fp16-amp: CUDA only, with a gradient scaler).")
    compile: bool = Field(default=False, description="torch.compile the policy network.")
    threads: int | Literal["auto"] = Field(
        default="auto", description="torch threads on CPU; auto: train.torch_threads when the recipe sets it, else the usable "
                    "CPUs less one (room for evaluation), at most 8.")

    @field_validator("threads")
    @classmethod
    def _check_threads(cls, threads: int | str) -> int | str:
        # Located at ``train.backend.config.threads`` (a field validator, not the whole config).
        if isinstance(threads, int) and not 1 <= threads <= MAX_TORCH_THREADS:
            raise ValueError(f"auto or an integer from 1 to {MAX_TORCH_THREADS}")
        return threads


class A2CConfig(Contract):
    """stable-baselines3 A2C arguments (Mnih et al. 2016); defaults are SB3's."""

    refused_keys: ClassVar[dict[str, str]] = SB3_ARGUMENTS_ELSEWHERE

    learning_rate: Schedule = 7e-4
    n_steps: int = Field(default=5, ge=1)
    gamma: float = Field(default=0.99, ge=0.0, le=1.0)
    gae_lambda: float = Field(default=1.0, ge=0.0, le=1.0)
    ent_coef: Schedule = 0.0
    vf_coef: float = Field(default=0.5, ge=0.0)
    max_grad_norm: float = Field(default=0.5, gt=0.0)
    rms_prop_eps: float = Field(default=1e-5, gt=0.0)

    _check_schedules = field_validator("learning_rate", "ent_coef")(check_schedule)
    use_rms_prop: bool = True
    normalize_advantage: bool = False


class CellConfig(Contract):
    """What makes two states one archive cell (``gradlab.explore.cells``)."""

    kind: Literal["signals", "frame"] = "signals"
    signals: list[str] = Field(default_factory=list, description="kind signals: task-program signals, in key order.")
    bins: dict[str, float] = Field(default_factory=dict, description="kind signals: bin width per signal (default 1).")
    width: int = Field(default=11, ge=1, le=160, description="kind frame: downscaled width in pixels.")
    height: int = Field(default=8, ge=1, le=210, description="kind frame: downscaled height in pixels.")
    levels: int = Field(default=8, ge=2, le=256, description="kind frame: grey levels kept.")


class GoExploreConfig(Contract):
    """``gradlab.go_explore``: Go-Explore's exploration phase (Ecoffet et al. 2019) on provider state snapshots."""

    n_steps: int = Field(default=128, ge=1, description="Env steps per lane per iteration.")
    explore_steps: int = Field(default=50, ge=1, description="Steps explored from a selected cell before returning.")
    repeat_action_probability: float = Field(default=0.95, ge=0.0, lt=1.0,
                                             description="Chance to repeat the previous exploration action.")
    max_cells: int = Field(default=10_000, ge=1, description="Archive bound; past it the weakest cell is evicted.")
    success_guidance: float = Field(default=0.0, ge=0.0, le=1.0,
                                    description="Share of selections drawn from the best successful lineage.")
    cell: CellConfig = Field(default_factory=CellConfig)


class JerkConfig(Contract):
    """``gradlab.jerk``: Just Enough Retained Knowledge (Nichol et al. 2018, "Gotta Learn Fast", section 4.1)."""

    n_steps: int = Field(default=128, ge=1, description="Env steps per lane per iteration.")
    run_length: tuple[int, int] = Field(default=(4, 32), description="Steps one exploration action is held, (min, max).")
    jump_probability: float = Field(default=0.1, ge=0.0, le=1.0,
                                    description="Chance per step of one random other action inside a run.")
    exploit_bias: float = Field(default=0.25, ge=0.0, le=1.0,
                                description="Exploit probability = exploit_bias + (1 - exploit_bias) * steps / timesteps.")
    max_retained: int = Field(default=64, ge=1, description="Retained sequences (the best by mean return are kept).")


BACKEND_CONFIGS: dict[str, type[Contract]] = {"sb3.ppo": PPOConfig, "sb3.a2c": A2CConfig,
                                              "gradlab.ppo": GradlabPPOConfig, "gradlab.go_explore": GoExploreConfig,
                                              "gradlab.jerk": JerkConfig}


class Backend(Contract):
    id: Literal["sb3.ppo", "sb3.a2c", "gradlab.ppo", "gradlab.go_explore", "gradlab.jerk"]
    config: dict[str, Any] = Field(default_factory=dict, description="Validated by the backend's own model.")

    @model_validator(mode="after")
    def _check_config(self) -> Backend:
        normalised = validate_nested(BACKEND_CONFIGS[self.id], self.config, ("config",))
        object.__setattr__(self, "config", normalised)
        return self

    def typed_config(self) -> Any:
        return BACKEND_CONFIGS[self.id].model_validate(self.config)  # type: ignore[return-value]


class ArchiveCurriculum(Contract):
    """``train.curriculum.archive``: a share of training episodes starts from archived states.

    The archive is filled from the run's own target-origin episodes (a provider state captured
    where a new cell is first seen, at most ``reservoir_size`` cells); an episode starts from an
    archived cell with probability ``share``, chosen by ``priority_metric``. ``value_error`` is the
    mean |A_t| (raw GAE, Schulman et al. 2016, before minibatch normalisation) over a completed
    archive-origin trajectory, kept per cell as an EMA with rate ``ema_rate`` (docs/ARCHITECTURE.md
    section 12a). ``gradlab.ppo`` only; the provider must capture its lanes' state.
    """

    share: float = Field(ge=0.0, lt=1.0, description="Probability that an episode starts from an archived cell.")
    cell: CellConfig = Field(default_factory=CellConfig, description="The cell function (as gradlab.go_explore's).")
    reservoir_size: int = Field(default=1000, ge=1, description="Most cells kept; past it the weakest is evicted.")
    priority_metric: Literal["value_error", "uniform"] = Field(
        default="value_error", description="value_error: cells weighted by the EMA of mean |A_t|; uniform: equal weights.")
    ema_rate: float = Field(default=0.1, gt=0.0, le=1.0,
                            description="Weight of a new trajectory's mean |A_t| in the cell's priority EMA.")


class Curriculum(Contract):
    """``train.curriculum``: where training episodes start besides the goal's own reset."""

    archive: ArchiveCurriculum | None = None

    @model_serializer(mode="wrap")
    def _omit_absent_archive(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if data.get("archive") is None:
            data.pop("archive", None)
        return data


#: Backends that run ``train.curriculum`` (the rollout restores archived states into its lanes).
CURRICULUM_BACKENDS = ("gradlab.ppo",)


class EnvironmentOverrides(Contract):
    """Changes a recipe makes to the goal's training environment (mirrored into evaluation)."""

    n_envs: int | None = Field(default=None, ge=1, le=1024)
    vectorization: Literal["auto", "sync", "async", "native"] | None = None
    num_threads: int | None = Field(default=None, ge=1)
    provider_args: dict[str, Any] | None = None
    preprocessing: dict[str, Any] | None = None


#: The largest finite float32: normalised observations are float32, so a clip beyond it is no clip.
FLOAT32_MAX = 3.4028234663852886e38


class Normalize(Contract):
    """Running mean/std normalisation (SB3's VecNormalize); its statistics are saved with checkpoints."""

    observation: bool = False
    reward: bool = False
    clip_observation: float = Field(default=10.0, gt=0.0, le=FLOAT32_MAX,
                                    description="Normalised observations are clipped to [-clip, clip] (float32).")


class RecipeTrain(Contract):
    timesteps: Annotated[int, Field(ge=1, description="Env steps in the training budget.")]
    policy_model: PolicyModel = Field(default_factory=PolicyModel)
    backend: Backend
    environment: EnvironmentOverrides = Field(default_factory=EnvironmentOverrides)
    normalize: Normalize = Field(default_factory=Normalize)
    checkpoint_freq: int | None = Field(default=None, ge=1, description="Overrides the goal's checkpoint_freq.")
    torch_threads: int = Field(default=1, ge=1, description="torch intra-op threads in the learner.")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    starts: dict[str, float] | None = Field(
        default=None, description="Weight of each of the goal's starts (eval.starts) when training draws one per "
                                  "episode; null = uniform. Names must be the goal's starts.")
    curriculum: Curriculum | None = Field(
        default=None, description="Where training episodes start besides a reset (gradlab.ppo only); null = none.")

    @field_validator("starts", mode="before")
    @classmethod
    def _no_boolean_weights(cls, weights: Any) -> Any:
        if isinstance(weights, dict):
            flags = sorted(str(k) for k, w in weights.items() if isinstance(w, bool))
            if flags:
                raise ValueError(f"numeric start weights, found true/false for {flags}")
        return weights

    @field_validator("starts")
    @classmethod
    def _check_starts(cls, weights: dict[str, float] | None) -> dict[str, float] | None:
        if weights is None:
            return None
        negative = sorted(k for k, w in weights.items() if w < 0)
        if negative:
            raise ValueError(f"start weights must be >= 0, found negative weights for {negative}")
        if not weights or sum(weights.values()) <= 0:
            raise ValueError("at least one start with a positive weight")
        if not math.isfinite(sum(weights.values())):
            raise ValueError(f"finite weights with a finite sum, found {weights}")
        return {k: float(w) for k, w in weights.items()}

    @field_validator("curriculum", mode="after")
    @classmethod
    def _curriculum_backend(cls, curriculum: Curriculum | None, info: ValidationInfo) -> Curriculum | None:
        backend = info.data.get("backend")
        if curriculum is not None and curriculum.archive is not None and backend is not None \
                and backend.id not in CURRICULUM_BACKENDS:
            raise ValueError(f"no archive curriculum with backend {backend.id}: it runs on "
                             f"{', '.join(CURRICULUM_BACKENDS)} only (the {backend.id} rollout cannot restore "
                             "archived states)")
        return curriculum

    @model_serializer(mode="wrap")
    def _omit_absent_starts(self, handler: Any) -> dict[str, Any]:
        # A recipe without start weights or a curriculum keeps the recipe_sha256 it had before the keys existed.
        data = handler(self)
        for key in ("starts", "curriculum"):
            if data.get(key) is None:
                data.pop(key, None)
        return data

    @property
    def archive_curriculum(self) -> ArchiveCurriculum | None:
        """``curriculum.archive`` when the recipe sets it, else None."""
        return self.curriculum.archive if self.curriculum is not None else None

    def start_weights(self, goal_starts: list[str]) -> dict[str, float] | None:
        """Probability of each of the goal's starts for a training episode, summing to 1, in the
        goal's order; None when the goal has no starts (every episode uses the default start)."""
        if not goal_starts:
            return None
        raw = self.starts if self.starts is not None else {s: 1.0 for s in goal_starts}
        total = sum(raw.get(s, 0.0) for s in goal_starts)
        return {s: raw.get(s, 0.0) / total for s in goal_starts}


class Logging(Contract):
    wandb_mode: Literal["disabled", "offline", "online"] = "offline"
    wandb_project: str = "gradlab"


class Recipe(Contract):
    recipe_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    description: str = ""
    train: RecipeTrain
    logging: Logging = Field(default_factory=Logging)


COSMETIC_RECIPE_FIELDS = {"description"}
