"""The MLP fast path's flat buffers: the same clip and Adam as torch's, twin layers as layer by layer."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from gradlab.contracts.recipe import PolicyModel
from gradlab.learn import ppo_flat, ppo_mlp
from gradlab.learn.ppo_net import build_network


def _net(net_arch: object = (64, 64), activation: str = "tanh", seed: int = 3) -> torch.nn.Module:
    from gymnasium import spaces

    torch.manual_seed(seed)
    return build_network(spaces.Box(-np.inf, np.inf, (4,), np.float32), spaces.Discrete(3),
                         PolicyModel(net_arch=list(net_arch) if not isinstance(net_arch, dict) else net_arch,
                                     activation=activation))


def _batch(seed: int = 0, b: int = 96) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mb = {"obs": torch.randn(b, 4, generator=g), "actions": torch.randint(0, 3, (b,), generator=g),
          "old_log_prob": -torch.rand(b, generator=g) - 0.5, "old_values": torch.randn(b, generator=g),
          "returns": torch.randn(b, generator=g)}
    adv = torch.randn(b, generator=g)
    return mb, (adv - adv.mean()) / (adv.std() + 1e-8)


def _terms(net: torch.nn.Module, mb: dict, adv: torch.Tensor, twins: object = None, ent_coef: float = 0.01,
           clip_range_vf: float | None = 0.2) -> dict:
    return ppo_mlp.loss_and_grads(net, mb, adv, clip_range=0.2, clip_range_vf=clip_range_vf, ent_coef=ent_coef,
                                  vf_coef=0.5, twins=twins)


def test_clip_and_adam_over_flat_buffers_equal_torchs_over_several_steps() -> None:
    """FlatAdam's clip + step against clip_grad_norm_ + torch.optim.Adam (SB3's) on the same gradients."""
    ours, theirs = _net(), _net()
    opt_ours = torch.optim.Adam(ours.parameters(), lr=3e-3, eps=1e-5, fused=True)
    opt_theirs = torch.optim.Adam(theirs.parameters(), lr=3e-3, eps=1e-5)
    flat = ppo_flat.FlatAdam.of(opt_ours, lambda: ppo_mlp.flat_order(ours))
    for step in range(5):
        mb, adv = _batch(step)
        _terms(ours, mb, adv, ppo_mlp.twin_layers(ours, flat))
        _terms(theirs, mb, adv)
        norm = flat.clip_and_step(0.1)
        expected = torch.nn.utils.clip_grad_norm_(list(theirs.parameters()), 0.1)
        opt_theirs.step()
        assert float(norm) == pytest.approx(float(expected), rel=1e-5)
        assert float(expected) > 0.1  # the clip acted, so the test covers it
    flat.record_step()
    initial = _net().state_dict()
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-7), name
        assert not torch.equal(p, initial[name]), name  # every parameter moved
    sd_ours, sd_theirs = opt_ours.state_dict(), opt_theirs.state_dict()
    for index, entry in sd_theirs["state"].items():
        assert float(sd_ours["state"][index]["step"]) == float(entry["step"]) == 5
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(sd_ours["state"][index][name], entry[name], rtol=1e-5, atol=1e-9), (index, name)


def test_twin_layers_give_the_layer_by_layer_terms_and_gradients() -> None:
    """Both MLPs in one batched product per layer: the same loss terms and gradients (tanh and relu)."""
    for activation in ("tanh", "relu"):
        twin_net = _net(activation=activation)
        plain_net = copy.deepcopy(twin_net)
        flat = ppo_flat.FlatAdam.of(torch.optim.Adam(twin_net.parameters()), lambda net=twin_net: ppo_mlp.flat_order(net))
        twins = ppo_mlp.twin_layers(twin_net, flat)
        assert twins is not None and len(twins) == 2
        mb, adv = _batch(1)
        a, b = _terms(twin_net, mb, adv, twins), _terms(plain_net, mb, adv)
        for key in ("pg_loss", "value_loss", "entropy_loss", "ratio"):
            assert torch.allclose(a[key], b[key], rtol=1e-6, atol=1e-7), (activation, key)
        plain = dict(plain_net.named_parameters())
        for name, p in twin_net.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, name
            assert torch.allclose(p.grad, plain[name].grad, rtol=1e-5, atol=1e-7), (activation, name)


def test_unpaired_mlps_keep_the_layer_by_layer_path() -> None:
    net = _net({"pi": [32, 16], "vf": [8]})
    assert ppo_mlp.flat_order(net) is None
    flat = ppo_flat.FlatAdam.of(torch.optim.Adam(net.parameters()))
    assert ppo_mlp.twin_layers(net, flat) is None
    first, second = list(net.parameters())[:2]
    assert flat.stacked([first, second]) is None  # a weight and a bias: not one shape


def test_a_resumed_optimizer_state_is_taken_into_the_flat_buffers() -> None:
    """A resume loads the optimizer's state after binding: the next bind copies it in."""
    net = _net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-5, fused=True)
    flat = ppo_flat.FlatAdam.of(opt, lambda: ppo_mlp.flat_order(net))
    mb, adv = _batch(2)
    _terms(net, mb, adv, ppo_mlp.twin_layers(net, flat))
    flat.clip_and_step(0.5)
    flat.record_step()
    saved = copy.deepcopy(opt.state_dict())
    params = copy.deepcopy(net.state_dict())
    _terms(net, *_batch(3), ppo_mlp.twin_layers(net, flat))
    flat.clip_and_step(0.5)  # moves on past the saved state
    net.load_state_dict(params)
    opt.load_state_dict(saved)  # replaces the state's tensors, as a resume does
    again = ppo_flat.FlatAdam.of(opt)
    assert again is flat and again.step == 1
    storage = flat.exp_avg.untyped_storage().data_ptr()
    for i, p in enumerate(opt.param_groups[0]["params"]):
        for name in ("exp_avg", "exp_avg_sq"):
            held = opt.state[p][name]
            assert torch.equal(held, saved["state"][i][name]), (i, name)  # the resumed moments ...
            assert held.untyped_storage().data_ptr() in (storage, flat.exp_avg_sq.untyped_storage().data_ptr())
        assert torch.equal(p, params[[k for k, q in net.named_parameters() if q is p][0]])
    assert torch.equal(torch.cat([p.detach().flatten() for p in flat.params]), flat.flat)  # ... in the buffers


def test_an_adam_flat_buffers_cannot_compute_is_refused() -> None:
    net = _net()
    assert not ppo_flat.supported(torch.optim.Adam(net.parameters(), amsgrad=True))
    assert not ppo_flat.supported(torch.optim.Adam(net.parameters(), weight_decay=1e-4))
    assert not ppo_flat.supported(torch.optim.SGD(net.parameters(), lr=0.1))
    assert ppo_flat.supported(torch.optim.Adam(net.parameters(), eps=1e-5))


def test_a_binding_lives_and_dies_with_its_optimizer() -> None:
    import gc
    import weakref

    net = _net()
    opt = torch.optim.Adam(net.parameters())
    flat = ppo_flat.FlatAdam.of(opt, lambda order=ppo_mlp.flat_order(net): order)  # asked for on first use only
    assert ppo_flat.FlatAdam.of(opt, lambda: pytest.fail("the layout is asked for again")) is flat
    assert ppo_mlp.twin_layers(net, flat) is not None  # laid out as the callable said
    gone = weakref.ref(flat)
    del net, opt, flat
    gc.collect()
    assert gone() is None  # nothing outside the optimizer keeps its buffers alive
