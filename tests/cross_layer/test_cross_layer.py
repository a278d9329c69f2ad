"""The cross-layer registry: one record per method is all a method needs.

A toy method defined and registered here alone (no other file changes) is constructible from ``ModelConfig``,
exactly vanilla at init, trainable, decodable (cached = full forward) and accounted for; its record decides its
weight decay. The built-in records are checked against what the rest of the package expected before the registry.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor, nn

from depthattn import DecoderLM, ModelConfig, num_flops, num_params
from depthattn import cross_layer
from depthattn.accounting import inflight_bytes_per_token
from depthattn.analyze import depth_weight_means
from depthattn.cross_layer import MethodRecord, registered
from depthattn.cross_layer.none import residual_model
from depthattn.training.optim import build_optimizer

from conftest import assert_cache_matches_full, padded_batch


# ----------------------------------------------------------------------------- the toy method
class ToyGate(nn.Module):
    """``h ← h + (1 + s_l)·f(norm(h))`` for both sublayers of layer l: one learnable scalar ``s_l`` per layer, held
    as ``gate.weight`` ``[1, 1]`` of an ``nn.Linear`` (so the generic rule would decay it; the record says no).
    **At init** s = 0: exactly vanilla."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, device=None):
        super().__init__()
        self.gate = nn.Linear(1, 1, bias=False, device=device)

    @torch.no_grad()
    def init_weights(self, cfg: ModelConfig) -> None:
        """s = 0."""
        self.gate.weight.zero_()

    def prepare(self, state: Tensor, sublayer: int) -> Tensor:
        return state

    def read(self, state: Tensor, sublayer: int) -> Tensor:
        return state

    def write(self, state: Tensor, sublayer: int, out: Tensor) -> Tensor:
        return state + out * (1.0 + self.gate.weight[0, 0]).to(out.dtype)


TOY = MethodRecord(
    name="toy",
    at_init="exactly vanilla (s = 0)",
    layer=ToyGate,
    model=residual_model,
    extra_params=lambda cfg: cfg.num_hidden_layers,                       # s_l
    extra_flops=lambda cfg: 2.0 * cfg.num_hidden_layers * cfg.hidden_size,  # (1 + s)·f: C multiplies per sublayer
    no_decay=(r"gate\.weight",),
)


@pytest.fixture
def toy():
    with registered(TOY) as record:
        yield record


def tiny_toy(**kw) -> ModelConfig:
    return ModelConfig.from_preset("tiny", cross_layer="toy", **kw)


@torch.no_grad()
def set_gates(model: DecoderLM, seed: int = 1) -> DecoderLM:
    g = torch.Generator().manual_seed(seed)
    for layer in model.model.layers:
        layer.cross_layer.gate.weight.copy_(0.5 * torch.randn(1, 1, generator=g))
    return model


# ----------------------------------------------------------------------------- registration
def test_registering_one_record_makes_the_method_a_config_value():
    assert "toy" not in cross_layer.names()
    with pytest.raises(ValueError, match=r"cross_layer='toy' is invalid: must be one of \('none', 'depth_attention', "
                                         r"'denseformer', 'mhc', 'attnres', 'value_residual', "
                                         r"'depth_attention_uniform'\)"):
        tiny_toy()
    with registered(TOY):
        assert cross_layer.names() == ("none", "depth_attention", "denseformer", "mhc", "attnres", "value_residual",
                                       "depth_attention_uniform", "toy")
        assert cross_layer.get("toy") is TOY and tiny_toy().cross_layer == "toy"
        with pytest.raises(ValueError, match="num_loops=2 is invalid: looped models are defined only for cross_layer "
                                             r"in \('none', 'depth_attention', 'depth_attention_uniform'\), not 'toy'"):
            tiny_toy(num_loops=2)
        with pytest.raises(ValueError, match="'toy' is already registered"):
            cross_layer.register(TOY)
    assert "toy" not in cross_layer.names()
    with pytest.raises(ValueError, match="unknown cross_layer 'toy'"):
        cross_layer.get("toy")
    with pytest.raises(KeyError, match="'toy' is not registered"):
        cross_layer.unregister("toy")


def test_loopable_record_allows_loops():
    with registered(dataclasses.replace(TOY, loopable=True)):
        assert cross_layer.loopable() == ("none", "depth_attention", "depth_attention_uniform", "toy")
        assert tiny_toy(num_loops=2).num_virtual_layers == 8


def test_builtin_records():
    """What config, accounting and the model hard-coded before the registry."""
    assert cross_layer.names() == ("none", "depth_attention", "denseformer", "mhc", "attnres", "value_residual",
                                   "depth_attention_uniform")
    assert cross_layer.loopable() == ("none", "depth_attention", "depth_attention_uniform")
    assert [r.name for r in cross_layer.records() if r.has_value_seam] == ["depth_attention", "value_residual",
                                                                           "depth_attention_uniform"]
    cfg = ModelConfig.from_preset("tiny", cross_layer="depth_attention", num_hidden_layers=5, depth_attention_stride=2)
    assert DecoderLM(cfg, device="meta").plan == cross_layer.get("depth_attention").plan(cfg) == \
        ((), (0,), (0,), (0, 2), (0, 2))
    for record in cross_layer.records():
        assert record.at_init
        if not record.has_value_seam:
            assert record.plan(cfg) == ((),) * 5
    for name in ("none", "depth_attention"):
        assert cross_layer.get(name).extra_params(cfg) == 0
        assert cross_layer.get(name).inflight_elements(cfg) == cfg.hidden_size


# ----------------------------------------------------------------------------- the toy end to end
def test_toy_is_exactly_vanilla_at_init(toy):
    torch.manual_seed(0)
    vanilla = DecoderLM(ModelConfig.from_preset("tiny")).eval()
    model = DecoderLM(tiny_toy()).eval()
    missing, unexpected = model.load_state_dict(vanilla.state_dict(), strict=False)
    assert not unexpected and sorted(missing) == [f"model.layers.{i}.cross_layer.gate.weight" for i in range(4)]
    assert all(layer.cross_layer.gate.weight.item() == 0.0 for layer in model.model.layers)
    ids, mask = padded_batch(512)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, attention_mask=mask).logits, vanilla(ids, attention_mask=mask).logits,
                                   atol=0, rtol=0)


def test_toy_trains_and_its_record_decides_weight_decay(toy):
    torch.manual_seed(0)
    model = DecoderLM(tiny_toy()).train()
    gates = [f"model.layers.{i}.cross_layer.gate.weight" for i in range(4)]
    opt, names = build_optimizer(model, lr=1e-2, weight_decay=0.1)
    assert set(gates) <= set(names["no_decay"]) and not set(gates) & set(names["decay"])
    ids, _ = padded_batch(512, T=12, pads=(0, 0))
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = model(ids, labels=ids).loss
        loss.backward()
        params = dict(model.named_parameters())
        for n in gates:
            assert params[n].grad is not None and torch.isfinite(params[n].grad).all() and params[n].grad.abs() > 0, n
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses
    assert all(model.get_parameter(n).item() != 0.0 for n in gates)
    # the same method without the record's no_decay entry: the generic rule (an nn.Linear weight) decays the gates
    cross_layer.unregister("toy")
    try:
        with registered(dataclasses.replace(TOY, no_decay=())):
            _, names = build_optimizer(DecoderLM(tiny_toy()), lr=1e-2, weight_decay=0.1)
            assert set(gates) <= set(names["decay"])
    finally:
        cross_layer.register(TOY)


def test_toy_cached_decode_equals_full_forward(toy):
    torch.manual_seed(0)
    assert_cache_matches_full(set_gates(DecoderLM(tiny_toy()).eval()), atol=1e-5)


def test_toy_is_accounted_for(toy):
    vanilla = ModelConfig.from_preset("tiny")
    for kw in ({}, {"num_hidden_layers": 6, "hidden_size": 32, "tie_word_embeddings": True}):
        cfg, base = tiny_toy(**kw), vanilla.replace(**kw)
        assert num_params(cfg) == DecoderLM(cfg, device="meta").num_params() == num_params(base) + cfg.num_hidden_layers
        flops = num_flops(cfg, seq_len=64)
        assert flops.extra == 2.0 * cfg.num_hidden_layers * cfg.hidden_size
        assert (flops.vanilla, flops.attention) == (num_flops(base, 64).vanilla, num_flops(base, 64).attention)
        assert inflight_bytes_per_token(cfg, torch.bfloat16) == cfg.hidden_size * 2  # the record's default


def test_toy_has_no_value_seam(toy):
    model = DecoderLM(tiny_toy())
    assert model.plan == ((),) * 4 and not model.model.sources
    with pytest.raises(ValueError, match="depth-attention weights need cross_layer='depth_attention'"):
        depth_weight_means(model, torch.zeros(1, 3, dtype=torch.long))
