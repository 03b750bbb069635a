"""Flat buffers for ``gradlab.ppo``'s MLP fast path: parameters, gradients and Adam's moments.

A small MLP's update is dominated by per-tensor overhead, not arithmetic: CartPole's network has
12 parameter tensors of 2 to 4,096 elements, and ``clip_grad_norm_`` plus a fused
``torch.optim.Adam.step`` over them cost ~100 us of CPU per gradient step here, a fifth of the
step. :class:`FlatAdam` lays every parameter, its gradient and Adam's two moments out as views of
four contiguous float32 buffers, so the global-norm clip is one norm and one scale of one buffer
and Adam's step five in-place operations on three (docs/ARCHITECTURE.md section 5, gradlab.ppo).

The torch optimizer stays the record: its ``param_groups`` give the learning rate and Adam's
constants, and its ``state`` holds the moments as views of the flat buffers and the step count,
so a checkpoint saves and a resume loads the same ``optimizer.safetensors`` as before
(:mod:`gradlab.learn.ppo_checkpoint`). State loaded into the optimizer after binding (a resume
replaces its tensors) is copied into the buffers at the next :meth:`FlatAdam.bind`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

#: Where an optimizer keeps its binding (an attribute of the optimizer: the two live and die together).
_BINDING = "_gradlab_flat_adam"


def supported(optimizer: Any) -> bool:
    """Whether :class:`FlatAdam` computes ``optimizer``'s step: a ``torch.optim.Adam`` with one
    parameter group, no weight decay, no AMSGrad, not maximising, float32 CPU parameters."""
    import torch

    if type(optimizer) is not torch.optim.Adam or len(optimizer.param_groups) != 1:
        return False
    g = optimizer.param_groups[0]
    return (not g.get("amsgrad") and not g.get("maximize") and not g.get("weight_decay")
            and all(p.dtype == torch.float32 and p.device.type == "cpu" for p in g["params"]))


class FlatAdam:
    """Global-norm gradient clipping and Adam over flat buffers, bound to a ``torch.optim.Adam``.

    Attributes:
        params: the optimizer's parameters in layout order; each ``.data`` is a view of ``flat``.
        flat, grad, exp_avg, exp_avg_sq: (n,) float32 buffers, n the parameter count; each
            parameter's ``.grad`` is a view of ``grad``, where a hand-written backward writes (``out=``).
        step: Adam steps taken (as the optimizer's ``state[p]["step"]``).

    The arithmetic is ``torch.nn.utils.clip_grad_norm_`` (coefficient ``max_norm / (norm + 1e-6)``
    capped at 1) and torch's single-tensor Adam (Kingma & Ba 2015, Algorithm 1, with
    ``eps`` added to the bias-corrected ``sqrt(v)``), which stable-baselines3's PPO uses.
    """

    def __init__(self, optimizer: Any, order: list[Any] | None = None):
        import torch

        self.optimizer = optimizer
        self.params = list(optimizer.param_groups[0]["params"])
        if order is not None:  # a layout of the same parameters (gradlab.learn.ppo_mlp.flat_order)
            if len(order) != len(self.params) or {id(p) for p in order} != {id(p) for p in self.params}:
                raise ValueError("FlatAdam: the layout must list the optimizer's parameters, each once")
            self.params = list(order)
        n = sum(p.numel() for p in self.params)
        self.flat = torch.empty(n, dtype=torch.float32)
        self.grad = torch.zeros(n, dtype=torch.float32)
        self.exp_avg = torch.zeros(n, dtype=torch.float32)
        self.exp_avg_sq = torch.zeros(n, dtype=torch.float32)
        self._views: list[tuple[Any, Any, Any, Any]] = []
        self._offsets: dict[int, int] = {}
        offset = 0
        with torch.no_grad():
            for p in self.params:
                k = p.numel()
                self._offsets[id(p)] = offset
                view = self.flat[offset:offset + k].view_as(p)
                view.copy_(p.detach())
                p.data = view
                p.grad = self.grad[offset:offset + k].view_as(p)
                self._views.append((view, p.grad, self.exp_avg[offset:offset + k].view_as(p),
                                    self.exp_avg_sq[offset:offset + k].view_as(p)))
                offset += k
        self.step = 0
        self._adopt_state()

    @classmethod
    def of(cls, optimizer: Any, order: Callable[[], list[Any] | None] | None = None) -> FlatAdam:
        """The binding of ``optimizer``, checked by :meth:`bind`; made on first use, laid out in what
        ``order()`` returns (asked for then only), else in the optimizer's parameter order."""
        flat = optimizer.__dict__.get(_BINDING)
        if flat is None:
            flat = cls(optimizer, None if order is None else order())
            setattr(optimizer, _BINDING, flat)
        else:
            flat.bind()
        return flat

    def stacked(self, params: list[Any]) -> tuple[Any, Any] | None:
        """(values, gradients), each a (len(params), *shape) view of the flat buffers, where
        ``params`` lie one after another in the layout with one shape; else None."""
        shape = params[0].shape
        first = self._offsets.get(id(params[0]))
        k = params[0].numel()
        if first is None or any(q.shape != shape or self._offsets.get(id(q)) != first + i * k
                                for i, q in enumerate(params)):
            return None
        n = len(params) * k
        return (self.flat[first:first + n].view(len(params), *shape),
                self.grad[first:first + n].view(len(params), *shape))

    def bind(self) -> None:
        """Re-bind whatever was replaced since the last update: parameter data (a new tensor from
        ``load_state_dict(assign=True)`` or ``.data =``), gradients, or optimizer state (a resume's
        ``optimizer.load_state_dict``), copying their values into the buffers."""
        import torch

        with torch.no_grad():
            for p, (view, grad, _, _) in zip(self.params, self._views, strict=True):
                if p.data_ptr() != view.data_ptr() or p.data.shape != view.shape:
                    view.copy_(p.detach())
                    p.data = view
                if p.grad is None or p.grad.data_ptr() != grad.data_ptr():
                    p.grad = grad
        self._adopt_state()

    def _adopt_state(self) -> None:
        """Make the optimizer's state the flat moments, taking over values it holds elsewhere."""
        import torch

        state = self.optimizer.state
        steps = set()
        with torch.no_grad():
            for p, (_, _, m, v) in zip(self.params, self._views, strict=True):
                entry = state[p]
                for name, buf in (("exp_avg", m), ("exp_avg_sq", v)):
                    held = entry.get(name)
                    if held is None:
                        buf.zero_()
                    elif held.data_ptr() != buf.data_ptr():
                        buf.copy_(held)
                    entry[name] = buf
                step = entry.get("step")
                steps.add(int(step.item()) if torch.is_tensor(step) else int(step or 0))
                if not torch.is_tensor(step):
                    entry["step"] = torch.tensor(float(step or 0), dtype=torch.float32)
        if len(steps) != 1:
            raise ValueError(f"Adam state: parameters at different step counts {sorted(steps)}; expected one count")
        self.step = steps.pop()

    def clip_and_step(self, max_norm: float) -> Any:
        """Clip the gradients to global 2-norm ``max_norm``, then take one Adam step.

        Returns:
            The gradients' global 2-norm before clipping, a 0-d float32 tensor.
        """
        import torch

        g = self.grad
        norm = torch.linalg.vector_norm(g)
        g.mul_((max_norm / (norm + 1e-6)).clamp_(max=1.0))
        group = self.optimizer.param_groups[0]
        beta1, beta2 = group["betas"]
        lr, eps = float(group["lr"]), float(group["eps"])
        self.step += 1
        bias_correction1 = 1 - beta1 ** self.step
        bias_correction2_sqrt = math.sqrt(1 - beta2 ** self.step)
        self.exp_avg.lerp_(g, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = self.exp_avg_sq.sqrt().div_(bias_correction2_sqrt).add_(eps)
        self.flat.addcdiv_(self.exp_avg, denom, value=-lr / bias_correction1)
        return norm

    def record_step(self) -> None:
        """Write the step count into the optimizer's state (once per update: what a checkpoint saves)."""
        state = self.optimizer.state
        for p in self.params:
            state[p]["step"].fill_(float(self.step))
