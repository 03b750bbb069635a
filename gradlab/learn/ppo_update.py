"""``gradlab.ppo``'s update: stable-baselines3 2.x ``PPO.train`` on one flat rollout batch.

:func:`ppo_update` runs ``n_epochs`` of minibatch steps over the rollout with SB3's terms, checked
term by term in ``tests/learn/test_ppo_parity.py``: advantages normalised per minibatch
(``(A - mean) / (std + 1e-8)``, unbiased std), the clipped surrogate, the value loss clipped around
the rollout's values when ``clip_range_vf`` is set, the entropy bonus, gradients clipped to
``max_grad_norm``, and an epoch stopped at the first minibatch whose approximate KL exceeds
``1.5 * target_kl`` (before that minibatch's gradient step). MLP policies may take the
hand-written gradients of :mod:`gradlab.learn.ppo_mlp` instead of autograd.
:func:`sb3_permutation` draws the minibatch order as SB3's ``RolloutBuffer.get`` does, so with the
same seed both backends train the same run. :func:`explained_variance` is the update's value-fit
metric.
"""

from __future__ import annotations

from typing import Any

from gradlab.contracts.recipe import GradlabPPOConfig
from gradlab.learn import ppo_mlp
from gradlab.learn.ppo_net import log_prob_entropy


def take_rows(tensor: Any, index: Any) -> Any:
    """``tensor[index]`` along dim 0, keeping a channels-last image batch channels-last.

    ``index_select`` is a row copy, several times faster than advanced indexing on uint8 frames
    (Breakout minibatches, measured here); a (B, C, H, W) batch stored channels-last is gathered in
    its storage order, so the convolutions get it without a layout conversion.
    """
    import torch

    if tensor.dim() == 4 and not tensor.is_contiguous() and tensor.is_contiguous(memory_format=torch.channels_last):
        return tensor.permute(0, 2, 3, 1).index_select(0, index).permute(0, 3, 1, 2)
    return tensor.index_select(0, index)


def sb3_permutation(n_steps: int, n_envs: int, device: Any = None) -> Any:
    """One epoch's minibatch order, drawn as stable-baselines3's ``RolloutBuffer.get`` draws it.

    SB3 draws ``np.random.permutation(n_steps * n_envs)`` from NumPy's global generator over its
    lane-major flattening (index ``lane * n_steps + t``); this returns the same samples in the same
    order as indices into gradlab's time-major flattening (``t * n_envs + lane``). Drawn once per
    started epoch, as SB3 does, so both backends consume NumPy's stream alike and, from the same
    seed, see the same minibatches (``tests/learn/test_ppo_rollout_parity.py``).

    Returns:
        (n_steps * n_envs,) int64 tensor on ``device`` (the CPU when None).
    """
    import numpy as np
    import torch

    lane_major = np.random.permutation(n_steps * n_envs)
    time_major = (lane_major % n_steps) * n_envs + lane_major // n_steps
    index = torch.from_numpy(time_major)
    return index if device is None or torch.device(device).type == "cpu" else index.to(device, non_blocking=True)


def ppo_update(net: Any, optimizer: Any, batch: dict[str, Any], cfg: GradlabPPOConfig, *, clip_range: float,
               ent_coef: float, permutations: list[Any] | None = None, autocast: Any = None,
               scaler: Any = None, fast: bool = False, forward: Any = None) -> dict[str, Any]:
    """SB3's ``PPO.train`` on one flat rollout batch (the learning rate is set on ``optimizer`` already).

    Args:
        batch: ``obs`` (B, *obs_shape), ``actions`` (B,) int64 or (B, d) float32, ``old_log_prob``,
            ``old_values``, ``advantages``, ``returns`` (B,) float32; all on the network's device.
        permutations: one index permutation of ``range(B)`` per epoch, or a function of the epoch
            that draws it when the epoch starts (the backend passes :func:`sb3_permutation`);
            default ``torch.randperm`` on the device. A batch that fits one minibatch is used in
            order (a function is still called, so the generator advances as SB3's does).
        autocast: a context factory for the forward pass (bf16 / fp16 autocast), or None.
        scaler: a ``torch.amp.GradScaler`` for fp16, or None.
        fast: compute the loss and gradients with :mod:`gradlab.learn.ppo_mlp` (hand-written
            chain rule) instead of autograd; only where ``ppo_mlp.applies``. With a plain Adam
            (:func:`gradlab.learn.ppo_flat.supported`) and no ``scaler``, the clip and Adam's step
            then run over flat buffers (:class:`gradlab.learn.ppo_flat.FlatAdam`), the same arithmetic.
        forward: the network's forward to call (a ``torch.compile``d one), default ``net``.

    Returns:
        ``pg_loss``, ``value_loss``, ``entropy``, ``clip_fraction``, ``approx_kl`` (means over the
        minibatches; ``approx_kl`` over the last epoch's), ``loss`` (last minibatch), ``epochs``
        (completed, counting an epoch stopped by the KL rule), ``grad_norm`` (mean before clipping),
        as floats.
    """
    import contextlib

    import torch

    b = batch["advantages"].shape[0]
    bs = cfg.batch_size
    ctx = autocast or contextlib.nullcontext
    forward = forward or net
    pg, vl, ent, cf, gn = [], [], [], [], []
    kls: list[Any] = []
    loss = torch.zeros(())
    epochs = 0
    params = [p for p in net.parameters()]
    flat = twins = None
    if fast and scaler is None:
        from gradlab.learn import ppo_flat

        if ppo_flat.supported(optimizer):
            flat = ppo_flat.FlatAdam.of(optimizer, lambda: ppo_mlp.flat_order(net))  # the layout: first update only
            twins = ppo_mlp.twin_layers(net, flat)
    whole_adv = None  # the whole batch's normalised advantages, when a minibatch is the whole batch
    for epoch in range(cfg.n_epochs):
        kls = []
        stop = False
        if callable(permutations):
            perm = permutations(epoch)
            if bs >= b:
                perm = None  # one minibatch of every sample: the order changes nothing but rounding
        elif permutations is not None:
            perm = permutations[epoch]
        elif bs >= b:
            perm = None
        else:
            perm = torch.randperm(b, device=batch["advantages"].device)
        for start in range(0, b, bs):
            if perm is None and start == 0 and bs >= b:
                mb = batch
            else:
                if perm is not None:
                    idx = perm[start:start + bs]
                    mb = {k: take_rows(v, idx) for k, v in batch.items()}
                else:
                    mb = {k: v[start:start + bs] for k, v in batch.items()}
            adv = mb["advantages"]
            if cfg.normalize_advantage and adv.shape[0] > 1:
                if mb is not batch:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                else:  # the same every epoch: normalised once
                    if whole_adv is None:
                        whole_adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                    adv = whole_adv
            if fast:
                terms = ppo_mlp.loss_and_grads(net, mb, adv, clip_range=clip_range, clip_range_vf=cfg.clip_range_vf,
                                               ent_coef=ent_coef, vf_coef=cfg.vf_coef, twins=twins)
                pg_loss, value_loss, entropy_loss = (terms[k] for k in ("pg_loss", "value_loss", "entropy_loss"))
                ratio, log_ratio = terms["ratio"], terms["log_ratio"]
                loss = None  # only the last minibatch's is reported: formed after the loop
            else:
                with ctx():
                    head, values = forward(mb["obs"])
                values = values.float()
                logp, entropy = log_prob_entropy(net, head, mb["actions"])
                log_ratio = logp - mb["old_log_prob"]
                ratio = torch.exp(log_ratio)
                pg_loss = -torch.min(adv * ratio, adv * torch.clamp(ratio, 1 - clip_range, 1 + clip_range)).mean()
                if cfg.clip_range_vf is not None:
                    old = mb["old_values"]
                    values = old + torch.clamp(values - old, -cfg.clip_range_vf, cfg.clip_range_vf)
                value_loss = torch.nn.functional.mse_loss(mb["returns"], values)
                entropy_loss = -entropy.mean()
                loss = pg_loss + ent_coef * entropy_loss + cfg.vf_coef * value_loss
            with torch.no_grad():
                kl = ((ratio - 1) - log_ratio).mean()
                pg.append(pg_loss.detach())
                vl.append(value_loss.detach())
                ent.append(entropy_loss.detach())
                cf.append(((ratio - 1).abs() > clip_range).float().mean())
                kls.append(kl)
            if cfg.target_kl is not None and float(kl) > 1.5 * cfg.target_kl:
                stop = True
                break
            if not fast:
                optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                gn.append(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm, foreach=True))
                scaler.step(optimizer)
                scaler.update()
            elif flat is not None:
                gn.append(flat.clip_and_step(cfg.max_grad_norm))
            else:
                if not fast:
                    loss.backward()
                gn.append(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm, foreach=True))
                optimizer.step()
        epochs += 1
        if stop:
            break
    if flat is not None:
        flat.record_step()
    if loss is None:
        loss = pg[-1] + ent_coef * ent[-1] + cfg.vf_coef * vl[-1]

    def mean(xs: list[Any]) -> float:
        return float(torch.stack(xs).float().mean()) if xs else float("nan")

    return {"pg_loss": mean(pg), "value_loss": mean(vl), "entropy": -mean(ent), "clip_fraction": mean(cf),
            "approx_kl": mean(kls), "loss": float(loss.detach()), "epochs": float(epochs), "grad_norm": mean(gn)}


def explained_variance(y_pred: Any, y_true: Any) -> float:
    """``1 - Var[y_true - y_pred] / Var[y_true]`` (population variances; NaN when Var[y_true] = 0), SB3's.

    Args:
        y_pred: (B,) float32 tensor, the rollout's values. y_true: (B,) float32 tensor, the value targets.
    """
    var_y = float(y_true.var(unbiased=False))
    return float("nan") if var_y == 0 else 1.0 - float((y_true - y_pred).var(unbiased=False)) / var_y
