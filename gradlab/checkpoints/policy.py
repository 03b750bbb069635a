"""Weights-only policies: ``policy.safetensors`` + ``policy_spec.json``, loaded without unpickling.

The spec names the network (extractor, ``net_arch``, activation), the observation and action
spaces, and the observation pipeline the learner applied before the network (VecNormalize's
observation statistics, SB3's channel-last → channel-first transpose). :func:`load_policy`
rebuilds stable-baselines3's ``ActorCriticPolicy`` from the spec (code, not pickle) and loads the
tensors, so its action probabilities equal the training model's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gradlab.checkpoints.manifest import POLICY_SPEC_FILE, WEIGHTS_FILE
from gradlab.contracts.recipe import MAX_NET_LAYERS, MAX_NET_WIDTH, check_net_arch
from gradlab.errors import ContractViolation, IntegrityError

OBS_MEAN_KEY = "gradlab.obs_rms.mean"
OBS_VAR_KEY = "gradlab.obs_rms.var"
#: Limits a ``policy_spec.json`` is held to before any network or space is built from it (a shared
#: repository's spec comes from elsewhere): elements of one observation (raw Atari frames x4 are
#: 403,200), actions, hidden layers and their width, and the network's parameters in all
#: (128 Mi float32 parameters = 512 MiB), counted on torch's meta device, which allocates nothing.
MAX_OBS_ELEMENTS = 1 << 22
MAX_ACTIONS = 1 << 16
MAX_LAYERS = MAX_NET_LAYERS
MAX_WIDTH = MAX_NET_WIDTH
MAX_PARAMETERS = 1 << 27


class SpaceSpec(BaseModel):
    """A gymnasium space as JSON (Box, Discrete, MultiDiscrete, MultiBinary).

    Non-finite bounds (CartPole's velocities are unbounded) are stored as the strings ``"inf"``,
    ``"-inf"`` and ``"nan"``, since JSON numbers cannot hold them; numpy reads them back as floats.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["Box", "Discrete", "MultiDiscrete", "MultiBinary"]
    shape: list[int] = Field(default_factory=list)
    dtype: str = "float32"
    low: float | str | list[Any] | None = None
    high: float | str | list[Any] | None = None
    n: int | None = None
    start: int = 0
    nvec: list[int] | None = None

    @field_validator("shape")
    @classmethod
    def _bounded_shape(cls, shape: list[int]) -> list[int]:
        if len(shape) > 8 or any(d < 1 for d in shape) or int(np.prod(shape, dtype=np.float64)) > MAX_OBS_ELEMENTS:
            raise ValueError(f"expected at most 8 dimensions of at least 1 and {MAX_OBS_ELEMENTS} elements "
                             f"in all, found {shape}")
        return shape

    @field_validator("n")
    @classmethod
    def _bounded_n(cls, n: int | None) -> int | None:
        if n is not None and not 1 <= n <= MAX_ACTIONS:
            raise ValueError(f"expected 1..{MAX_ACTIONS} actions, found {n}")
        return n

    @field_validator("nvec")
    @classmethod
    def _bounded_nvec(cls, nvec: list[int] | None) -> list[int] | None:
        if nvec is not None and (len(nvec) > MAX_ACTIONS or any(not 1 <= v <= MAX_ACTIONS for v in nvec)):
            raise ValueError(f"expected at most {MAX_ACTIONS} entries of 1..{MAX_ACTIONS}, found {len(nvec)} entries")
        return nvec


class ObsNormalization(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    clip: float
    epsilon: float


class PolicySpec(BaseModel):
    """``policy_spec.json``: everything needed to rebuild the policy network from its tensors."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["gradlab.policy/1"] = "gradlab.policy/1"
    backend_id: str
    algorithm: str
    observation_space: SpaceSpec = Field(description="As the vector env returns observations (before transpose).")
    policy_observation_space: SpaceSpec = Field(description="As the network sees them (after transpose).")
    action_space: SpaceSpec
    extractor: Literal["flatten", "nature_cnn"]
    features_dim: int
    net_arch: list[int] | dict[str, list[int]]
    activation: Literal["tanh", "relu"]
    share_features_extractor: bool
    normalize_images: bool
    transpose_image: bool
    obs_normalization: ObsNormalization | None = None

    @field_validator("features_dim")
    @classmethod
    def _bounded_features(cls, dim: int) -> int:
        if not 1 <= dim <= MAX_WIDTH:
            raise ValueError(f"expected 1..{MAX_WIDTH}, found {dim}")
        return dim

    @field_validator("net_arch")
    @classmethod
    def _bounded_arch(cls, arch: list[int] | dict[str, list[int]]) -> list[int] | dict[str, list[int]]:
        try:
            return check_net_arch(arch)
        except ValueError as e:
            raise ValueError(f"expected {e}, found {arch}") from None


def read_policy_spec(path: Path) -> PolicySpec:
    """``<path>/policy_spec.json`` parsed and held to the limits above (nothing is built yet).

    Raises:
        ContractViolation: not JSON, or a key missing, unknown or out of its limit (the file, the key
            path and what was expected).
    """
    file = Path(path) / POLICY_SPEC_FILE
    try:
        return PolicySpec.model_validate_json(file.read_bytes())
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"]) or "<root>"
        raise ContractViolation(f"{file}: {where}: {err['msg']}") from None
    except OSError as e:
        raise ContractViolation(f"{file}: cannot read it ({e.strerror or e})") from None


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Name → shape of every tensor in ``<path>/policy.safetensors``, from its header alone.

    Raises:
        IntegrityError: the header is broken (safetensors' own reason, naming the file).
    """
    from safetensors import SafetensorError, safe_open

    file = Path(path) / WEIGHTS_FILE
    try:
        with safe_open(str(file), framework="numpy") as f:
            return {name: tuple(int(d) for d in f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as e:
        raise IntegrityError(f"{file}: not a readable safetensors file ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def check_policy_files(path: Path) -> PolicySpec:
    """Check a folder's weights against its spec before a network is allocated: the spec within its
    limits, the network it describes (built on torch's meta device: no memory) within
    :data:`MAX_PARAMETERS`, and every tensor of ``policy.safetensors`` present with the shape that
    network has, nothing else (besides the observation statistics the spec declares).

    Returns:
        The spec.

    Raises:
        ContractViolation: the spec is malformed or over a limit, or a tensor is missing, extra or of
            another shape (naming it and both shapes). IntegrityError: the safetensors header is broken.
    """
    import torch

    spec = read_policy_spec(path)
    found = tensor_shapes(path)
    with torch.device("meta"):
        net = _build_net(spec, meta=True)
    parameters = sum(p.numel() for p in net.parameters())
    if parameters > MAX_PARAMETERS:
        raise ContractViolation(f"{Path(path) / POLICY_SPEC_FILE}: describes a network of {parameters:,} parameters, "
                                f"more than the {MAX_PARAMETERS:,} a policy may have")
    expected = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    if spec.obs_normalization is not None:
        expected[OBS_MEAN_KEY] = expected[OBS_VAR_KEY] = tuple(spec.observation_space.shape)
    weights = Path(path) / WEIGHTS_FILE
    for name, shape in expected.items():
        if name not in found:
            raise ContractViolation(f"{weights}: tensor {name} is missing ({POLICY_SPEC_FILE} describes it)")
        if found[name] != shape:
            raise ContractViolation(f"{weights}: tensor {name}: shape expected {shape} ({POLICY_SPEC_FILE}), "
                                    f"found {found[name]}")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise ContractViolation(f"{weights}: tensor {extra[0]} is not part of the network {POLICY_SPEC_FILE} describes")
    return spec


def _build_net(spec: PolicySpec, *, meta: bool = False) -> Any:
    """SB3's ``ActorCriticPolicy`` that ``spec`` describes, with fresh weights; ``meta``: its shapes
    only (call it under ``with torch.device("meta")``; SB3 moves its MLP to the policy's device,
    which is then the meta device too), allocating nothing."""
    import torch
    from stable_baselines3.common.policies import ActorCriticPolicy
    from stable_baselines3.common.torch_layers import FlattenExtractor, NatureCNN

    if meta:
        class ActorCriticPolicy(ActorCriticPolicy):  # type: ignore[no-redef]
            @property
            def device(self) -> Any:
                return torch.device("meta")

    activation = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[spec.activation]
    kwargs: dict[str, Any] = dict(
        net_arch=spec.net_arch, activation_fn=activation, ortho_init=False, optimizer_class=_NoOptimizer,
        share_features_extractor=spec.share_features_extractor, normalize_images=spec.normalize_images,
    )
    if spec.extractor == "nature_cnn":
        kwargs.update(features_extractor_class=NatureCNN, features_extractor_kwargs={"features_dim": spec.features_dim})
    else:
        kwargs.update(features_extractor_class=FlattenExtractor)
    with torch.random.fork_rng(devices=[]):
        return ActorCriticPolicy(spec_to_space(spec.policy_observation_space), spec_to_space(spec.action_space),
                                 lambda _: 0.0, **kwargs)


def space_to_spec(space: Any) -> SpaceSpec:
    """JSON description of a gymnasium space (uniform bounds stored as one number).

    Raises:
        ContractViolation: the space type is not supported by weights-only policies.
    """
    from gymnasium import spaces

    def number(x: float) -> float | str:
        return float(x) if np.isfinite(x) else str(float(x))  # "inf", "-inf", "nan"

    def bound(a: np.ndarray) -> float | str | list[Any]:
        arr = np.asarray(a, dtype=np.float64)
        flat = arr.ravel()
        if flat.size and np.all(flat == flat[0]):
            return number(flat[0])
        return np.vectorize(number, otypes=[object])(arr).tolist()

    if isinstance(space, spaces.Box):
        return SpaceSpec(type="Box", shape=list(space.shape), dtype=str(space.dtype), low=bound(space.low),
                         high=bound(space.high))
    if isinstance(space, spaces.Discrete):
        return SpaceSpec(type="Discrete", n=int(space.n), start=int(space.start), dtype=str(space.dtype))
    if isinstance(space, spaces.MultiDiscrete):
        return SpaceSpec(type="MultiDiscrete", shape=list(space.shape), nvec=[int(v) for v in np.ravel(space.nvec)],
                         dtype=str(space.dtype))
    if isinstance(space, spaces.MultiBinary):
        return SpaceSpec(type="MultiBinary", shape=list(np.atleast_1d(space.n)), dtype=str(space.dtype))
    raise ContractViolation(f"weights-only policies support Box, Discrete, MultiDiscrete and MultiBinary spaces, "
                            f"found {type(space).__name__}")


def spec_to_space(spec: SpaceSpec) -> Any:
    """The gymnasium space a :class:`SpaceSpec` describes."""
    from gymnasium import spaces

    if spec.type == "Box":
        dtype = np.dtype(spec.dtype)
        low = np.full(spec.shape, spec.low, dtype=dtype) if np.isscalar(spec.low) else np.asarray(spec.low, dtype)
        high = np.full(spec.shape, spec.high, dtype=dtype) if np.isscalar(spec.high) else np.asarray(spec.high, dtype)
        return spaces.Box(low=low, high=high, shape=tuple(spec.shape), dtype=dtype)
    if spec.type == "Discrete":
        return spaces.Discrete(int(spec.n or 0), start=spec.start)
    if spec.type == "MultiDiscrete":
        return spaces.MultiDiscrete(np.asarray(spec.nvec))
    return spaces.MultiBinary(spec.shape if len(spec.shape) > 1 else spec.shape[0])


def export_policy(model: Any, *, backend_id: str, algorithm: str, policy_model: Any, env_observation_space: Any,
                  transpose_image: bool, obs_rms: Any | None = None, obs_clip: float = 10.0,
                  obs_epsilon: float = 1e-8) -> tuple[dict[str, Any], PolicySpec]:
    """Tensors and spec of an SB3 on-policy model's policy, for :func:`save_policy_files`.

    Args:
        model: a stable-baselines3 PPO/A2C model.
        backend_id, algorithm: e.g. ``sb3.ppo``, ``ppo``.
        policy_model: the recipe's ``PolicyModel``.
        env_observation_space: the space of observations as the vector env returns them.
        transpose_image: SB3 wrapped the env in ``VecTransposeImage`` (channel-last images).
        obs_rms: VecNormalize's observation ``RunningMeanStd`` when observations are normalised.

    Returns:
        (tensors: name → CPU torch tensor, spec).
    """
    policy = model.policy
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in policy.state_dict().items()}
    norm = None
    if obs_rms is not None:
        import torch

        tensors[OBS_MEAN_KEY] = torch.as_tensor(np.asarray(obs_rms.mean, dtype=np.float64))
        tensors[OBS_VAR_KEY] = torch.as_tensor(np.asarray(obs_rms.var, dtype=np.float64))
        norm = ObsNormalization(clip=float(obs_clip), epsilon=float(obs_epsilon))
    from stable_baselines3.common.torch_layers import NatureCNN

    extractor = "nature_cnn" if isinstance(policy.features_extractor, NatureCNN) else "flatten"
    spec = PolicySpec(
        backend_id=backend_id, algorithm=algorithm,
        observation_space=space_to_spec(env_observation_space),
        policy_observation_space=space_to_spec(policy.observation_space),
        action_space=space_to_spec(policy.action_space),
        extractor=extractor, features_dim=int(policy.features_dim),
        net_arch=policy_model.net_arch, activation=policy_model.activation,
        share_features_extractor=bool(policy.share_features_extractor),
        normalize_images=bool(policy.normalize_images), transpose_image=bool(transpose_image),
        obs_normalization=norm,
    )
    return tensors, spec


def save_policy_files(folder: Path, tensors: dict[str, Any], spec: PolicySpec) -> None:
    """Write ``policy.safetensors`` and ``policy_spec.json`` into ``folder``."""
    from safetensors.torch import save_file

    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "gradlab.policy/1"})
    (folder / POLICY_SPEC_FILE).write_text(
        json.dumps(spec.model_dump(mode="json"), indent=2, sort_keys=True, allow_nan=False) + "\n")


class _NoOptimizer:
    """Stands in for SB3's optimizer: a weights-only policy never trains, and constructing a torch
    optimizer the first time imports ``torch._dynamo`` (3–12 s measured here), which every
    evaluation worker would pay."""

    def __init__(self, params: Any, lr: float = 0.0, **kwargs: Any):
        del params, lr, kwargs


class Policy:
    """A policy rebuilt from ``policy.safetensors`` + ``policy_spec.json`` (no unpickling).

    Observations are given as the vector env returns them; the policy applies the learner's
    observation pipeline (normalisation, transpose, image scaling) itself.
    """

    def __init__(self, spec: PolicySpec, tensors: dict[str, Any], *, device: str = "cpu"):
        import torch

        torch.distributions.Distribution.set_default_validate_args(False)
        self.spec = spec
        self.observation_space = spec_to_space(spec.observation_space)
        self.action_space = spec_to_space(spec.action_space)
        net = _build_net(spec)
        state = {k: v for k, v in tensors.items() if not k.startswith("gradlab.")}
        try:
            net.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise ContractViolation(f"{WEIGHTS_FILE}: tensors do not match {POLICY_SPEC_FILE}: {e}") from None
        net.set_training_mode(False)
        self.device = torch.device(device)
        self.net = net.to(self.device)
        self._obs_mean = self._obs_var = None
        if spec.obs_normalization is not None:
            self._obs_mean = tensors[OBS_MEAN_KEY].numpy()
            self._obs_var = tensors[OBS_VAR_KEY].numpy()

    def _prepare(self, obs: np.ndarray) -> Any:

        obs = np.asarray(obs)
        expected = tuple(self.spec.observation_space.shape)
        if obs.shape[1:] != expected:
            raise ContractViolation(f"policy expects observations (N, {', '.join(map(str, expected))}), "
                                    f"found {obs.shape}")
        if self.spec.obs_normalization is not None:
            n = self.spec.obs_normalization
            obs = np.clip((obs - self._obs_mean) / np.sqrt(self._obs_var + n.epsilon), -n.clip, n.clip).astype(np.float32)
        if self.spec.transpose_image:
            obs = np.transpose(obs, (0, 3, 1, 2))
        tensor, _ = self.net.obs_to_tensor(obs)
        return tensor

    def distribution(self, obs: np.ndarray) -> Any:
        """SB3's action distribution for a batch of observations (N, *obs_shape)."""
        import torch

        with torch.no_grad():
            return self.net.get_distribution(self._prepare(obs))

    def action_probs(self, obs: np.ndarray) -> np.ndarray:
        """Action probabilities, (N, n_actions) float32 (Discrete action spaces only).

        Raises:
            ContractViolation: the action space is not Discrete.
        """
        if self.spec.action_space.type != "Discrete":
            raise ContractViolation(f"action_probs needs a Discrete action space, found {self.spec.action_space.type}")
        return self.distribution(obs).distribution.probs.cpu().numpy()

    def value(self, obs: np.ndarray) -> np.ndarray:
        """State values V(s), (N,) float32."""
        import torch

        with torch.no_grad():
            return self.net.predict_values(self._prepare(obs)).cpu().numpy().reshape(-1).astype(np.float32)

    def act(self, obs: np.ndarray, *, deterministic: bool, rng: np.random.Generator | None = None) -> np.ndarray:
        """Actions for a batch of observations.

        Args:
            obs: (N, *obs_shape) as the vector env returns them.
            deterministic: take the mode (argmax for Discrete; the mean for Box, clipped to bounds).
            rng: sampling randomness for stochastic actions (a fresh generator when None).

        Returns:
            (N,) int64 for Discrete (offset by the space's ``start``), (N, *action_shape) otherwise.
        """
        dist = self.distribution(obs)
        a = self.spec.action_space
        if a.type == "Discrete":
            probs = dist.distribution.probs.cpu().numpy().astype(np.float64)
            if deterministic:
                idx = probs.argmax(axis=1)
            else:
                rng = rng or np.random.default_rng()
                u = rng.random(probs.shape[0])[:, None]
                idx = np.minimum((np.cumsum(probs, axis=1) < u).sum(axis=1), probs.shape[1] - 1)
            return idx.astype(np.int64) + a.start
        if a.type == "Box":
            mean = dist.distribution.mean.cpu().numpy()
            if deterministic:
                out = mean
            else:
                rng = rng or np.random.default_rng()
                std = dist.distribution.stddev.cpu().numpy()
                out = mean + std * rng.standard_normal(mean.shape)
            return np.clip(out, self.action_space.low, self.action_space.high).astype(np.float32)
        import torch

        with torch.no_grad():
            return dist.get_actions(deterministic=deterministic).cpu().numpy()


def load_policy(path: Path, *, verify: bool = True, device: str = "cpu") -> Any:
    """Load a checkpoint's weights-only policy (no pickle is read, so no trust is needed).

    Args:
        path: the checkpoint folder.
        verify: check every file's sha256 first (:func:`verify_checkpoint`).

    Returns:
        A :class:`Policy`, or a :class:`gradlab.checkpoints.program.ProgramPolicy` when the
        checkpoint holds a search backend's action program (``format: gradlab.program/1``).

    Raises:
        IntegrityError: a file does not match the manifest (named), or the safetensors header is
            broken. NotFound: not a checkpoint.
        ContractViolation: the spec is malformed or over its limits, or the tensors do not fit it
            (checked from the header before any network is allocated: :func:`check_policy_files`).
    """
    from safetensors.torch import load_file

    from gradlab.checkpoints.bundle import verify_checkpoint

    path = Path(path)
    if verify:
        verify_checkpoint(path)
    from gradlab.checkpoints.program import is_program, load_program

    try:
        raw = json.loads((path / POLICY_SPEC_FILE).read_bytes())
    except (OSError, ValueError):  # unreadable or malformed: check_policy_files names it
        raw = None
    if isinstance(raw, dict) and is_program(raw):  # a search backend's action program
        return load_program(path, raw)
    spec = check_policy_files(path)
    return Policy(spec, load_file(str(path / WEIGHTS_FILE)), device=device)
