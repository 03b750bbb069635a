"""PPO's minibatch loss and its gradients for an MLP policy, written out by hand (no autograd).

For a small MLP on a CPU (CartPole: 4 → 64 → 64 → 2 and → 1, 256 samples), autograd's graph and
engine cost more than the matrix products themselves: measured here, a gradient step through
autograd took ~0.9 ms against ~0.35 ms for its matrix products. This module computes the same loss
terms and gradients as :func:`gradlab.learn.ppo_update.ppo_update`'s autograd path with the chain rule
written out; ``tests/learn/test_ppo_parity.py`` checks both against stable-baselines3's
``PPO.train`` (loss terms, gradients, updated parameters).

Used when :func:`applies`: Discrete actions, a flatten extractor shared by both heads, fp32 and no
``torch.compile``. The derivatives (B samples, ``l = log_softmax(z)``, ``p = exp(l)``):

* policy term ``-mean(min(A r, A clip(r, 1-c, 1+c)))``, ``r = exp(l_a - old)``:
  ``d/dl_a = -A r m / B`` with ``m = [A r <= A clip(r)]`` (torch's ``min`` and ``clamp``
  pass the gradient to the selected branch, so a tie inside the range gives ``A``);
* ``d l_a / d z = onehot(a) - p``;
* entropy term ``-ent_coef * mean(H)``, ``H = -sum p l``: ``d/dz = ent_coef * p (l + H) / B``;
* value term ``vf_coef * mean((R - v')^2)``: ``d/dv = 2 vf_coef (v' - R) / B`` times
  ``[|v - old| <= clip_range_vf]`` when ``v' = old + clip(v - old)``;
* a linear layer ``y = h W^T + b``: ``dW = g^T h``, ``db = sum g``, ``dh = g W``; tanh:
  ``g (1 - y^2)``; relu: ``g [y > 0]``. The forward computes tanh as ``2 sigmoid(2z) - 1`` (the
  same function; faster on a CPU, see :func:`_forward`).
"""

from __future__ import annotations

from typing import Any


def applies(net: Any, precision: str, compiled: bool) -> bool:
    """Whether :func:`loss_and_grads` covers this network and settings."""
    return bool(net.discrete and not net.nature_cnn and net.share and not net.image and precision == "fp32"
                and not compiled)


def _layers(net: Any) -> tuple[list[Any], list[Any]]:
    """The policy's and the value's linear layers in order, found once per network."""
    layers = net.__dict__.get("_fast_path_layers")
    if layers is None:
        from torch import nn

        pi = [m for m in net.mlp_extractor.policy_net if isinstance(m, nn.Linear)] + [net.action_net]
        vf = [m for m in net.mlp_extractor.value_net if isinstance(m, nn.Linear)] + [net.value_net]
        layers = net.__dict__["_fast_path_layers"] = (pi, vf)
    return layers


def _forward(layers: list[Any], x: Any, tanh: bool) -> list[Any]:
    """Activations ``[x, h1, ..., out]`` (no activation after the last layer)."""
    import torch

    outs = [x]
    last = len(layers) - 1
    for i, layer in enumerate(layers):
        if i < last and tanh:
            # tanh(z) = 2 sigmoid(2z) - 1, with 2z from addmm's own scaling: torch's CPU tanh took 35 us
            # on a (256, 64) batch against 12 us for this (AVX-512, one thread, measured here), within
            # 2e-7 of it; the hidden layers' tanh was a sixth of CartPole's training time.
            y = torch.addmm(layer.bias, outs[-1], layer.weight.t(), beta=2.0, alpha=2.0).sigmoid_().mul_(2.0).sub_(1.0)
        else:
            y = torch.addmm(layer.bias, outs[-1], layer.weight.t())
            if i < last:
                y = torch.relu(y)
        outs.append(y)
    return outs


def _backward(layers: list[Any], outs: list[Any], g: Any, tanh: bool) -> None:
    """Write ``layer.weight.grad`` / ``layer.bias.grad`` from the output gradient ``g`` (B, out):
    into the existing gradient tensors (``out=``; the flat buffer of
    :class:`gradlab.learn.ppo_flat.FlatAdam`), or new ones where a parameter has none."""
    import torch

    for i in range(len(layers) - 1, -1, -1):
        layer = layers[i]
        h = outs[i]
        w, bias = layer.weight, layer.bias
        if w.grad is None or bias.grad is None:
            w.grad, bias.grad = g.t().mm(h), g.sum(0)
        else:
            torch.mm(g.t(), h, out=w.grad)
            torch.sum(g, 0, out=bias.grad)
        if i == 0:
            break
        g = g.mm(w)
        g = g * (1 - h * h) if tanh else g * (h > 0)  # tanh' = 1 - y^2 (autograd's formula); relu' = [y > 0]


def loss_and_grads(net: Any, mb: dict[str, Any], adv: Any, *, clip_range: float, clip_range_vf: float | None,
                   ent_coef: float, vf_coef: float) -> dict[str, Any]:
    """One minibatch's PPO loss terms, with every parameter's ``.grad`` set (no autograd graph).

    Args:
        mb: ``obs`` (B, D) float32, ``actions`` (B,) int64, ``old_log_prob``, ``old_values``,
            ``returns`` (B,) float32.
        adv: (B,) float32, the minibatch's advantages (already normalised if asked).

    Returns:
        ``pg_loss``, ``value_loss``, ``entropy_loss``, ``loss``, ``ratio``, ``log_ratio`` as
        tensors (scalars, or (B,) for the last two).
    """
    import torch

    with torch.no_grad():
        tanh = net.activation == "tanh"
        pi, vf = _layers(net)
        x = mb["obs"].float().flatten(1)
        b = x.shape[0]
        po = _forward(pi, x, tanh)
        vo = _forward(vf, x, tanh)
        logits, v = po[-1], vo[-1].squeeze(-1)
        logp_all = torch.log_softmax(logits, dim=-1)
        p = logp_all.exp()
        a = mb["actions"].long().unsqueeze(1)
        logp = logp_all.gather(1, a).squeeze(1)
        entropy = -(p * logp_all).sum(-1)
        log_ratio = logp - mb["old_log_prob"]
        ratio = log_ratio.exp()
        surr1 = adv * ratio
        surr2 = adv * ratio.clamp(1 - clip_range, 1 + clip_range)
        pg_loss = -torch.min(surr1, surr2).mean()
        old_v = mb["old_values"]
        if clip_range_vf is None:
            v_pred, v_pass = v, None
        else:
            diff = v - old_v
            v_pred = old_v + diff.clamp(-clip_range_vf, clip_range_vf)
            v_pass = (diff.abs() <= clip_range_vf).float()
        err = v_pred - mb["returns"]
        value_loss = (err * err).mean()
        entropy_loss = -entropy.mean()
        loss = pg_loss + ent_coef * entropy_loss + vf_coef * value_loss
        # d loss / d logits
        g_logp = -(surr1 <= surr2).float() * surr1 / b
        onehot = torch.zeros_like(p).scatter_(1, a, 1.0)
        g_logits = g_logp.unsqueeze(1) * (onehot - p) + (ent_coef / b) * p * (logp_all + entropy.unsqueeze(1))
        # d loss / d v
        g_v = (2 * vf_coef / b) * err
        if v_pass is not None:
            g_v = g_v * v_pass
        _backward(pi, po, g_logits, tanh)
        _backward(vf, vo, g_v.unsqueeze(1), tanh)
    return {"pg_loss": pg_loss, "value_loss": value_loss, "entropy_loss": entropy_loss, "loss": loss,
            "ratio": ratio, "log_ratio": log_ratio}
