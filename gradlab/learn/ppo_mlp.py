"""PPO's minibatch loss and its gradients for an MLP policy, written out by hand (no autograd).

For a small MLP on a CPU (CartPole: 4 → 64 → 64 → 2 and → 1, 256 samples), autograd's graph and
engine cost more than the matrix products themselves: measured here, a gradient step through
autograd took ~0.9 ms against ~0.35 ms for its matrix products. This module computes the same loss
terms and gradients as :func:`gradlab.learn.ppo_update.ppo_update`'s autograd path with the chain rule
written out; ``tests/learn/test_ppo_parity.py`` checks both against stable-baselines3's
``PPO.train`` (loss terms, gradients, updated parameters).

Used when :func:`applies`: Discrete actions, a flatten extractor shared by both heads, fp32 and no
``torch.compile``. With the parameters in :class:`gradlab.learn.ppo_flat.FlatAdam`'s flat buffers laid
out by :func:`flat_order`, the policy's and the value's hidden layers of one shape run as one batched
product per layer (:func:`twin_layers`: CartPole's two 64-64 MLPs in half the operations) and the
gradients are written straight into the flat gradient buffer. The derivatives (B samples, ``l = log_softmax(z)``, ``p = exp(l)``):

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


def flat_order(net: Any) -> list[Any] | None:
    """The parameter layout that pairs the policy's and the value's hidden layers, or None.

    Where both MLPs have the same hidden layer shapes (``net_arch: [64, 64]``), layer l of the
    two is laid out side by side (both weights, then both biases), then the two heads, so
    :func:`twin_layers` can see each pair as one stacked (2, out, in) view and run both MLPs with
    one batched matrix product per layer. Other parameters follow in the network's order.
    """
    pi, vf = _layers(net)
    hidden = list(zip(pi[:-1], vf[:-1], strict=False))
    if not hidden or len(pi) != len(vf) or any(a.weight.shape != c.weight.shape for a, c in hidden):
        return None
    order: list[Any] = []
    for a, c in hidden:
        order += [a.weight, c.weight, a.bias, c.bias]
    order += [pi[-1].weight, pi[-1].bias, vf[-1].weight, vf[-1].bias]
    return order + [q for q in net.parameters() if all(q is not o for o in order)]


def twin_layers(net: Any, flat: Any) -> list[tuple[Any, Any, Any, Any]] | None:
    """Per hidden layer, (weights (2, out, in), biases (2, 1, out), their gradients (2, out, in)
    and (2, out)) as views of ``flat``'s buffers (a :class:`gradlab.learn.ppo_flat.FlatAdam` laid out
    by :func:`flat_order`); None where the layout does not pair them. Found once per binding."""
    twins = flat.__dict__.get("_twin_layers", False)
    if twins is False:
        pi, vf = _layers(net)
        twins = []
        for a, c in zip(pi[:-1], vf[:-1], strict=False):
            w, b = flat.stacked([a.weight, c.weight]), flat.stacked([a.bias, c.bias])
            if w is None or b is None:
                twins = None
                break
            twins.append((w[0], b[0].unsqueeze(1), w[1], b[1]))
        flat.__dict__["_twin_layers"] = twins
    return twins


def _twin_forward(twins: list[Any], x: Any, tanh: bool) -> list[Any]:
    """Both MLPs' hidden activations ``[x (2, B, D) broadcast, h1 (2, B, H1), ...]`` (index 0 the
    policy's, 1 the value's), each layer one batched product."""
    import torch

    outs = [x.expand(2, *x.shape)]
    for w, b, _, _ in twins:
        if tanh:  # tanh(z) = 2 sigmoid(2z) - 1, as _forward
            y = torch.baddbmm(b, outs[-1], w.transpose(1, 2), beta=2.0, alpha=2.0).sigmoid_().mul_(2.0).sub_(1.0)
        else:
            y = torch.baddbmm(b, outs[-1], w.transpose(1, 2)).relu_()
        outs.append(y)
    return outs


def _twin_backward(twins: list[Any], heads: tuple[Any, Any], outs: list[Any], g_head: Any, g_v: Any,
                   tanh: bool) -> None:
    """Write the gradients of both heads and of the paired hidden layers (into their flat views)."""
    import torch

    pi_head, vf_head = heads
    h = outs[-1]
    for layer, g, hl in ((pi_head, g_head, h[0]), (vf_head, g_v, h[1])):
        torch.mm(g.t(), hl, out=layer.weight.grad)
        torch.sum(g, 0, out=layer.bias.grad)
    dh = torch.empty_like(h)
    torch.mm(g_head, pi_head.weight, out=dh[0])
    torch.mm(g_v, vf_head.weight, out=dh[1])
    for i in range(len(twins) - 1, -1, -1):
        w, _, w_grad, b_grad = twins[i]
        y = outs[i + 1]
        dz = dh * (1 - y * y) if tanh else dh * (y > 0)
        if w.shape[2] < w.shape[1]:  # a narrow input (CartPole's 4): (h^T dz)^T is the fast orientation
            w_grad.copy_(torch.bmm(outs[i].transpose(1, 2), dz).transpose(1, 2))
        else:
            torch.bmm(dz.transpose(1, 2), outs[i], out=w_grad)
        torch.sum(dz, 1, out=b_grad)
        if i > 0:
            dh = torch.bmm(dz, w)


def loss_and_grads(net: Any, mb: dict[str, Any], adv: Any, *, clip_range: float, clip_range_vf: float | None,
                   ent_coef: float, vf_coef: float, twins: list[Any] | None = None) -> dict[str, Any]:
    """One minibatch's PPO loss terms, with every parameter's ``.grad`` set (no autograd graph).

    Args:
        mb: ``obs`` (B, D) float32, ``actions`` (B,) int64, ``old_log_prob``, ``old_values``,
            ``returns`` (B,) float32.
        adv: (B,) float32, the minibatch's advantages (already normalised if asked).
        twins: :func:`twin_layers` of the network's flat binding: both MLPs run as one batched
            product per layer and the gradients land in the flat buffer. None: layer by layer.

    Returns:
        ``pg_loss``, ``value_loss``, ``entropy_loss``, ``ratio``, ``log_ratio`` as tensors
        (scalars, or (B,) for the last two); the loss is ``pg_loss + ent_coef * entropy_loss +
        vf_coef * value_loss``.
    """
    import torch

    with torch.no_grad():
        tanh = net.activation == "tanh"
        pi, vf = _layers(net)
        x = mb["obs"].float().flatten(1)
        b = x.shape[0]
        if twins is not None:
            outs = _twin_forward(twins, x, tanh)
            logits = torch.addmm(pi[-1].bias, outs[-1][0], pi[-1].weight.t())
            v = torch.addmm(vf[-1].bias, outs[-1][1], vf[-1].weight.t()).squeeze(-1)
        else:
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
        take1 = surr1 <= surr2
        pg_loss = -torch.where(take1, surr1, surr2).mean()  # = -mean(min(surr1, surr2))
        old_v = mb["old_values"]
        if clip_range_vf is None:
            v_pred, v_pass = v, None
        else:
            diff = v - old_v
            v_pred = old_v + diff.clamp(-clip_range_vf, clip_range_vf)
            v_pass = diff.abs() <= clip_range_vf
        err = v_pred - mb["returns"]
        value_loss = (err * err).mean()
        entropy_loss = -entropy.mean()
        # d loss / d l_a, then d loss / d logits = g (onehot(a) - p), as autograd's log_softmax
        # backward forms it: g at the action, less p g everywhere.
        g_logp = torch.where(take1, surr1, 0.0).div_(-b).unsqueeze(1)
        g_logits = torch.mul(p, g_logp).neg_().scatter_add_(1, a, g_logp)
        if ent_coef:
            g_logits += (ent_coef / b) * p * (logp_all + entropy.unsqueeze(1))
        # d loss / d v
        g_v = (2 * vf_coef / b) * err
        if v_pass is not None:
            g_v = torch.where(v_pass, g_v, 0.0)
        if twins is not None:
            _twin_backward(twins, (pi[-1], vf[-1]), outs, g_logits, g_v.unsqueeze(1), tanh)
        else:
            _backward(pi, po, g_logits, tanh)
            _backward(vf, vo, g_v.unsqueeze(1), tanh)
    return {"pg_loss": pg_loss, "value_loss": value_loss, "entropy_loss": entropy_loss,
            "ratio": ratio, "log_ratio": log_ratio}
