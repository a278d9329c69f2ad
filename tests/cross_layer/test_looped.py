"""Looped Transformers (spec-depth-attention.md §11): virtual layers u = r·L_phys + l with their own cache slots."""

from __future__ import annotations

import pytest
import torch

from depthattn import DecoderLM, ModelConfig, kv_cache_bytes_per_token, num_params

from conftest import assert_cache_matches_full, build, padded_batch


def looped_and_unrolled(method: str, L_phys: int = 2, R: int = 2, **kw) -> tuple[DecoderLM, DecoderLM]:
    """A looped model and an unrolled L_phys·R-layer model whose layer u is a copy of physical layer u mod L_phys."""
    looped = build(ModelConfig.from_preset("tiny", cross_layer=method, num_hidden_layers=L_phys, num_loops=R, **kw))
    with torch.no_grad():
        for name, p in looped.named_parameters():  # non-trivial norm gains
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    unrolled = DecoderLM(ModelConfig.from_preset("tiny", cross_layer=method, num_hidden_layers=L_phys * R, **kw)).eval()
    sd = looped.state_dict()
    tied = {}
    for key in unrolled.state_dict():
        if key.startswith("model.layers."):
            u, rest = key[len("model.layers."):].split(".", 1)
            tied[key] = sd[f"model.layers.{int(u) % L_phys}.{rest}"]
        else:
            tied[key] = sd[key]
    unrolled.load_state_dict(tied, strict=True)
    return looped, unrolled


@pytest.mark.parametrize("method", ["none", "depth_attention"])
def test_one_loop_equals_the_plain_model_exactly(method):
    plain = build(ModelConfig.from_preset("tiny", cross_layer=method))
    one = build(ModelConfig.from_preset("tiny", cross_layer=method, num_loops=1))
    assert one.config.num_virtual_layers == plain.config.num_virtual_layers == 4 and one.plan == plain.plan
    ids, mask = padded_batch(512)
    with torch.no_grad():
        torch.testing.assert_close(one(ids, attention_mask=mask).logits, plain(ids, attention_mask=mask).logits,
                                   atol=0, rtol=0)


@pytest.mark.parametrize("method", ["none", "depth_attention"])
@pytest.mark.parametrize("L_phys,R", [(2, 2), (1, 3)])
def test_looped_equals_unrolled_with_tied_weights(method, L_phys, R):
    looped, unrolled = looped_and_unrolled(method, L_phys, R)
    assert looped.plan == unrolled.plan  # candidates over virtual layers use L_v = R·L_phys (default stride L_v // 2)
    assert looped.config.depth_attention_stride == unrolled.config.depth_attention_stride == (L_phys * R) // 2
    ids, mask = padded_batch(512)
    with torch.no_grad():
        torch.testing.assert_close(looped(ids, attention_mask=mask).logits, unrolled(ids, attention_mask=mask).logits,
                                   atol=0, rtol=0)
    # a shared weight's gradient is the sum over its R uses
    for m in (looped, unrolled):
        m.train().zero_grad()
        m(ids, attention_mask=mask, labels=ids).loss.backward()
    grads = dict(unrolled.named_parameters())
    for name, p in looped.named_parameters():
        if name.startswith("model.layers."):
            l, rest = name[len("model.layers."):].split(".", 1)
            total = sum(grads[f"model.layers.{int(l) + r * L_phys}.{rest}"].grad for r in range(R))
            torch.testing.assert_close(p.grad, total, atol=1e-6, rtol=1e-5, msg=name)
        else:
            torch.testing.assert_close(p.grad, grads[name].grad, atol=1e-6, rtol=1e-5, msg=name)


def test_looped_plan_example_from_the_spec():
    """L_phys = 12, R = 2, s = 12: u = 1…12 read {0}; u = 13…23 read {0, 12} (spec §11)."""
    cfg = ModelConfig.from_preset("tiny", cross_layer="depth_attention", num_hidden_layers=12, num_loops=2)
    plan = DecoderLM(cfg, device="meta").plan
    assert cfg.depth_attention_stride == 12 and len(plan) == 24 and plan[0] == ()
    assert all(plan[u] == (0,) for u in range(1, 13)) and all(plan[u] == (0, 12) for u in range(13, 24))


@pytest.mark.parametrize("method", ["depth_attention", "none"])
def test_looped_cached_decode_equals_full_forward(method):
    looped, _ = looped_and_unrolled(method, 2, 2)
    assert looped.new_cache(2, 8).num_layers == 4
    assert_cache_matches_full(looped)


def test_looped_costs():
    base = ModelConfig.from_preset("tiny", cross_layer="depth_attention", num_hidden_layers=2)
    looped = base.replace(num_loops=3)
    assert num_params(looped) == num_params(base) == DecoderLM(looped, device="meta").num_params()
    assert kv_cache_bytes_per_token(looped) == 3 * kv_cache_bytes_per_token(base)


@pytest.mark.parametrize("method", ["denseformer", "mhc", "attnres"])
def test_loops_rejected_for_residual_methods(method):
    with pytest.raises(ValueError, match=rf"num_loops=3 is invalid: .*not '{method}'"):
        ModelConfig.from_preset("tiny", cross_layer=method, num_loops=3)


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_bad_loop_count(value):
    with pytest.raises(ValueError, match=rf"num_loops={value!r} is invalid"):
        ModelConfig.from_preset("tiny", num_loops=value)
