"""``gradlab.ppo``'s network: SB3 ``ActorCriticPolicy``'s modules, names and initialisation, and
the policy's action distribution as plain tensor operations (docs/ARCHITECTURE.md section 5).

The network has SB3 ``ActorCriticPolicy``'s modules and tensor names, built in the same order with
SB3's orthogonal initialisation (gain sqrt(2) for the extractor and hidden layers, 0.01 for the
action head, 1 for the value head), so the same seed gives the same initial parameters
(``tests/learn/test_ppo_parity.py``) and a ``gradlab.ppo`` weights-only policy loads in
:class:`gradlab.checkpoints.policy.Policy` exactly like an ``sb3.ppo`` one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gradlab.errors import ConfigError


# -- the network ------------------------------------------------------------------------------
def is_image(space: Any) -> bool:
    """SB3's ``is_image_space(check_channels=False)``: a uint8 Box of 3 dims bounded by [0, 255]."""
    from gymnasium import spaces

    return (isinstance(space, spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3
            and bool(np.all(space.low == 0)) and bool(np.all(space.high == 255)))


def channels_last(space: Any) -> bool:
    """SB3 transposes an image space whose smallest dimension is not the first (``VecTransposeImage``)."""
    return is_image(space) and int(np.argmin(space.shape)) != 0


def build_network(observation_space: Any, action_space: Any, policy_model: Any, *,
                  normalized_image: bool = False) -> Any:
    """An :class:`ActorCritic` for the spaces (as the network takes them) and the recipe's ``PolicyModel``.

    Args:
        normalized_image: ``observation_space`` is
            :func:`gradlab.learn.sb3_model.normalized_image_space` of image frames:
            ``extractor: auto`` picks the Nature CNN, which takes the float frames unscaled.

    Raises:
        ConfigError: Nature CNN on non-image observations, an unsupported space.
    """
    from gymnasium import spaces

    if not isinstance(observation_space, spaces.Box):
        raise ConfigError(f"train.backend.id: gradlab.ppo needs Box observations, found {observation_space}")
    if not isinstance(action_space, (spaces.Discrete, spaces.Box)):
        raise ConfigError(f"train.backend.id: gradlab.ppo needs Discrete or Box actions, found {action_space}")
    image = is_image(observation_space) or normalized_image
    extractor = policy_model.extractor if policy_model.extractor != "auto" else ("nature_cnn" if image else "mlp")
    if extractor == "nature_cnn" and not image:
        raise ConfigError(f"train.policy_model.extractor: nature_cnn needs image observations (uint8, 3 dims), "
                          f"found {observation_space}")
    return _actor_critic_class()(observation_space, action_space, policy_model, extractor == "nature_cnn")


def _actor_critic_class() -> type:
    import torch
    from torch import nn

    class NatureCNN(nn.Module):
        """Mnih et al. 2015's convolutions; SB3's ``NatureCNN`` (same layers, same tensor names)."""

        def __init__(self, channels: int, hw: tuple[int, int], features_dim: int):
            super().__init__()
            self.cnn = nn.Sequential(
                nn.Conv2d(channels, 32, kernel_size=8, stride=4, padding=0), nn.ReLU(),
                nn.Conv2d(32, 64, kernel_size=4, stride=2, padding=0), nn.ReLU(),
                nn.Conv2d(64, 64, kernel_size=3, stride=1, padding=0), nn.ReLU(), nn.Flatten())
            with torch.no_grad():
                n_flatten = self.cnn(torch.zeros(1, channels, *hw)).shape[1]
            self.linear = nn.Sequential(nn.Linear(n_flatten, features_dim), nn.ReLU())
            self.features_dim = features_dim

        def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
            """(B, C, H, W) float32 → (B, features_dim) float32; ``scale`` multiplies the input.

            The scale is applied to the first convolution's weight instead of the input
            (``conv(s * x, W) = conv(x, s * W)``), which saves a pass over every frame: SB3's 1/255
            pixel scaling costs one multiplication per weight here, not per pixel.
            """
            first = self.cnn[0]
            if scale != 1.0:
                x = torch.nn.functional.conv2d(x, first.weight * scale, first.bias, stride=first.stride)
            else:
                x = first(x)
            *inner, last_relu, flatten = self.cnn[1:]
            for layer in inner:
                x = layer(x)
            # The last ReLU runs in the layout Flatten's gradient comes back in (NCHW): given a
            # channels-last output to mask, ReLU's backward takes a slow mixed-layout path (3.4 ms
            # against 0.4 for 256 Breakout frames on one thread, fp32 and bf16 alike).
            return self.linear(flatten(last_relu(x.contiguous())))

    class MlpExtractor(nn.Module):
        """SB3's ``MlpExtractor``: separate policy and value MLPs (``net_arch`` list or ``{pi, vf}``)."""

        def __init__(self, features_dim: int, net_arch: Any, activation: type):
            super().__init__()
            pi_dims = net_arch.get("pi", []) if isinstance(net_arch, dict) else list(net_arch)
            vf_dims = net_arch.get("vf", []) if isinstance(net_arch, dict) else list(net_arch)
            layers: dict[str, list] = {"pi": [], "vf": []}
            last = {"pi": features_dim, "vf": features_dim}
            for key, dims in (("pi", pi_dims), ("vf", vf_dims)):
                for d in dims:
                    layers[key] += [nn.Linear(last[key], d), activation()]
                    last[key] = d
            self.policy_net = nn.Sequential(*layers["pi"])
            self.value_net = nn.Sequential(*layers["vf"])
            self.latent_dim_pi, self.latent_dim_vf = last["pi"], last["vf"]

    class ActorCritic(nn.Module):
        """SB3's ``ActorCriticPolicy`` network (same modules, order, names and initialisation).

        Input: observations as the vector env gives them, (B, *obs_shape) (uint8 images are
        transposed to channel-first when channel-last and scaled by 1/255, as SB3 does).
        Output of :meth:`forward`: (action logits (B, n_actions) or Gaussian means (B, act_dim),
        values (B,)), float32.
        """

        def __init__(self, observation_space: Any, action_space: Any, policy_model: Any, nature_cnn: bool):
            super().__init__()
            from gymnasium import spaces

            act = {"tanh": nn.Tanh, "relu": nn.ReLU}[policy_model.activation]
            self.activation = policy_model.activation
            self.image = is_image(observation_space)
            self.transpose = channels_last(observation_space)
            shape = tuple(observation_space.shape)
            net_shape = (shape[2], shape[0], shape[1]) if self.transpose else shape
            self.net_observation_shape = net_shape
            self.discrete = isinstance(action_space, spaces.Discrete)
            self.share = bool(policy_model.share_features_extractor)

            def make_extractor() -> nn.Module:
                if nature_cnn:
                    return NatureCNN(net_shape[0], (net_shape[1], net_shape[2]), policy_model.features_dim)
                return nn.Flatten()

            self.nature_cnn = nature_cnn
            self.features_dim = policy_model.features_dim if nature_cnn else int(np.prod(shape))
            self.features_extractor = make_extractor()
            self.pi_features_extractor = self.features_extractor
            self.vf_features_extractor = self.features_extractor if self.share else make_extractor()
            self.mlp_extractor = MlpExtractor(self.features_dim, policy_model.net_arch, act)
            if self.discrete:
                self.action_net = nn.Linear(self.mlp_extractor.latent_dim_pi, int(action_space.n))
            else:
                dim = int(np.prod(action_space.shape))
                self.action_net = nn.Linear(self.mlp_extractor.latent_dim_pi, dim)
                self.log_std = nn.Parameter(torch.zeros(dim))  # SB3's log_std_init = 0.0
            self.value_net = nn.Linear(self.mlp_extractor.latent_dim_vf, 1)
            if policy_model.ortho_init:
                gains: dict[nn.Module, float] = {self.features_extractor: math.sqrt(2), self.mlp_extractor: math.sqrt(2),
                                                 self.action_net: 0.01, self.value_net: 1.0}
                if not self.share:
                    del gains[self.features_extractor]
                    gains[self.pi_features_extractor] = math.sqrt(2)
                    gains[self.vf_features_extractor] = math.sqrt(2)
                for module, gain in gains.items():
                    module.apply(lambda m, g=gain: _ortho(m, g))

        def preprocess(self, obs: torch.Tensor) -> torch.Tensor:
            """(B, *obs_shape) as stored → float network input (SB3's ``preprocess_obs``).

            Images for the Nature CNN stay in [0, 255] (in the dtype the first convolution computes
            in): :meth:`features` folds SB3's 1/255 into that convolution's weight. Normalised
            frames (:func:`gradlab.learn.sb3_model.normalized_image_space`) go to that dtype as they are.
            """
            if self.image:
                if self.transpose:
                    obs = obs.permute(0, 3, 1, 2)
                if not self.nature_cnn:
                    return obs.float() / 255.0
            if self.nature_cnn:
                # Straight to the dtype the convolution computes in (uint8 pixels are exact in bf16 and
                # fp16): under autocast that saves a float32 copy of every frame.
                dev = obs.device.type
                dtype = (torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev)
                         else self.features_extractor.cnn[0].weight.dtype)
                return obs.to(dtype)
            return obs.float()

        def features(self, extractor: nn.Module, x: torch.Tensor) -> torch.Tensor:
            """``extractor`` on :meth:`preprocess`'s output (the 1/255 of images applied in the CNN)."""
            if type(extractor) is nn.Flatten:  # the MLPs' extractor, without a module call per rollout step
                return x.flatten(1)
            return extractor(x, 1.0 / 255.0) if self.nature_cnn and self.image else extractor(x)

        def _mlp(self, seq: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
            """``seq(x)`` without module-call overhead (Linear layers with the activation after each)."""
            act = torch.tanh if self.activation == "tanh" else torch.relu
            for layer in seq:
                if isinstance(layer, nn.Linear):
                    x = act(torch.nn.functional.linear(x, layer.weight, layer.bias))
            return x

        def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = self.preprocess(obs)
            if self.share:
                fp = fv = self.features(self.features_extractor, x)
            else:
                fp, fv = self.features(self.pi_features_extractor, x), self.features(self.vf_features_extractor, x)
            head = self.action_net(self._mlp(self.mlp_extractor.policy_net, fp))
            value = self.value_net(self._mlp(self.mlp_extractor.value_net, fv)).squeeze(-1)
            return head, value

        def head(self, obs: torch.Tensor) -> torch.Tensor:
            """The action head alone (logits or Gaussian means): the rollout's per-step call for MLPs."""
            fp = self.features(self.pi_features_extractor, self.preprocess(obs))
            head = self.action_net
            return torch.nn.functional.linear(self._mlp(self.mlp_extractor.policy_net, fp), head.weight, head.bias)

        def value(self, obs: torch.Tensor) -> torch.Tensor:
            """V(s), (B,) (the bootstrap of truncated lanes)."""
            fv = self.features(self.vf_features_extractor, self.preprocess(obs))
            return self.value_net(self._mlp(self.mlp_extractor.value_net, fv)).squeeze(-1)

    def _ortho(module: nn.Module, gain: float) -> None:
        """SB3's ``BasePolicy.init_weights``: orthogonal weights with ``gain``, zero biases."""
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(module.weight, gain=gain)
            if module.bias is not None:
                module.bias.data.fill_(0.0)

    return ActorCritic


def log_prob_entropy(net: Any, head: Any, actions: Any) -> tuple[Any, Any]:
    """Log-probability of ``actions`` and entropy, each (B,) float32, from the network's head.

    Discrete: a categorical over ``head`` logits (B, n). Box: a diagonal Gaussian with mean ``head``
    (B, d) and the state-independent ``net.log_std`` (log-probs and entropies summed over d), as
    SB3's ``CategoricalDistribution`` / ``DiagGaussianDistribution``.
    """
    import torch

    head = head.float()
    if net.discrete:
        logp_all = torch.log_softmax(head, dim=-1)
        logp = logp_all.gather(1, actions.long().unsqueeze(1)).squeeze(1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy
    log_std = net.log_std.expand_as(head)
    var = torch.exp(2 * log_std)
    logp = (-((actions - head) ** 2) / (2 * var) - log_std - math.log(math.sqrt(2 * math.pi))).sum(-1)
    entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum(-1)
    return logp, entropy


def sample_actions(net: Any, head: Any) -> tuple[Any, Any]:
    """Sampled actions and their log-probabilities from the head: Discrete (B,) int64, Box (B, d) float32."""
    import torch

    head = head.float()
    if net.discrete:
        logp_all = torch.log_softmax(head, dim=-1)
        actions = torch.multinomial(logp_all.exp(), 1).squeeze(1)
        return actions, logp_all.gather(1, actions.unsqueeze(1)).squeeze(1)
    actions = head + torch.randn_like(head) * net.log_std.exp()
    return actions, log_prob_entropy(net, head, actions)[0]
