"""Pure ops against their reference twins: depth mix, GQA pooling, RoPE invariance, attention, autograd."""

import math

import pytest
import torch

from depthattn.cross_layer.depth_attention import depth_logits, depth_mix, depth_mix_ref, depth_query, depth_weights
from depthattn.functional import apply_rope, attention, attention_ref, causal_padding_mask, rope_cos_sin, rope_inv_freq


def _inputs(B=2, H=4, K=2, T=3, D=8, n=3, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=g, dtype=dtype)
    keys = [torch.randn(B, K, T, D, generator=g, dtype=dtype) for _ in range(n)]
    values = [torch.randn(B, K, T, D, generator=g, dtype=dtype) for _ in range(n)]
    return q, keys, values


@pytest.mark.parametrize("H,K,n", [(4, 2, 3), (4, 4, 2), (6, 2, 4), (4, 1, 1)])
def test_depth_mix_matches_loop_reference(H, K, n):
    q, keys, values = _inputs(H=H, K=K, n=n)
    ref = depth_mix_ref(q, keys, values)
    out = depth_mix(q, keys, values)  # inference path (no autograd)
    assert out.shape == (2, K, 3, 8)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)
    trained = depth_mix(q.requires_grad_(), keys, values)  # training path (custom autograd function)
    assert trained.grad_fn is not None
    torch.testing.assert_close(trained.detach().double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("H,K,n", [(4, 2, 3), (6, 2, 5), (4, 1, 1)])
def test_unrolled_inference_mix_matches_loop_reference_even_for_large_logits(H, K, n):
    """``_mix_unrolled`` (what compiled decode traces) against the float64 twin, run eagerly here; logits of
    order 1e3 would overflow exp without the running max."""
    from depthattn.cross_layer.depth_attention import _mix_unrolled

    for scale in (1.0, 30.0):
        q, keys, values = _inputs(H=H, K=K, n=n, D=16)
        q = q * scale
        keys = [k * scale for k in keys]
        out = _mix_unrolled(q, keys, values)
        assert out.shape == (2, K, 3, 16) and out.dtype == torch.float32 and torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), depth_mix_ref(q, keys, values), atol=1e-5, rtol=0)
    qb, kb, vb = q.bfloat16(), [k.bfloat16() for k in keys], [v.bfloat16() for v in values]
    out_b = _mix_unrolled(qb, kb, vb)
    assert out_b.dtype == torch.bfloat16  # rounded once from float32, like the eager path
    torch.testing.assert_close(out_b, depth_mix_ref(qb, kb, vb).to(torch.bfloat16), atol=0, rtol=0)


def test_depth_weights_sum_to_one_and_equal_values_are_fixed_point():
    q, keys, values = _inputs(n=4)
    w = depth_weights(q, keys)
    assert w.dtype == torch.float32 and w.shape == (2, 2, 3, 4)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 3), atol=1e-6, rtol=0)
    same = [values[0]] * 4
    torch.testing.assert_close(depth_mix(q, keys, same), values[0], atol=1e-6, rtol=0)


def test_gqa_pooled_logits_equal_mean_of_per_head_logits():
    q, keys, _ = _inputs(H=6, K=2, n=3)
    pooled = depth_logits(depth_query(q, 2), keys)  # [B, K, T, N]
    G = 3
    for m in range(2):
        per_head = torch.stack([
            torch.stack([(q[:, m * G + j] * k[:, m]).sum(-1) / math.sqrt(8) for k in keys], -1) for j in range(G)
        ]).mean(0)
        torch.testing.assert_close(pooled[:, m], per_head, atol=1e-6, rtol=0)
    # g = 1: the depth query is the head itself.
    q1, keys1, _ = _inputs(H=2, K=2, n=2)
    torch.testing.assert_close(depth_query(q1, 2), q1)


def test_depth_logits_are_position_independent_under_rope():
    q, keys, _ = _inputs(T=5, D=16, n=3)
    pos = torch.tensor([[0, 7, 100, 1000, 4000]] * 2)
    cos, sin = rope_cos_sin(pos, rope_inv_freq(16, 10000.0), torch.float32)
    rotated = depth_logits(depth_query(apply_rope(q, cos, sin), 2), [apply_rope(k, cos, sin) for k in keys])
    plain = depth_logits(depth_query(q, 2), keys)
    torch.testing.assert_close(rotated, plain, atol=1e-5, rtol=0)


def test_depth_mix_order_of_candidates_does_not_matter():
    q, keys, values = _inputs(n=4)
    perm = [2, 0, 1, 3]
    out = depth_mix(q, keys, values)
    out_perm = depth_mix(q, [keys[i] for i in perm], [values[i] for i in perm])
    torch.testing.assert_close(out, out_perm, atol=1e-6, rtol=0)


def test_custom_backward_passes_gradcheck_in_float64():
    q, keys, values = _inputs(B=1, H=4, K=2, T=2, D=4, n=3, dtype=torch.float64)
    tensors = [t.requires_grad_() for t in (q, *keys, *values)]

    def f(q, *kv):
        return depth_mix(q, kv[:3], kv[3:])

    assert torch.autograd.gradcheck(f, tuple(tensors), eps=1e-6, atol=1e-6)


def test_custom_backward_equals_plain_autograd_in_float32():
    q, keys, values = _inputs(n=3)
    leaves = [t.clone().requires_grad_() for t in (q, *keys, *values)]
    out = depth_mix(leaves[0], leaves[1:4], leaves[4:])
    grad_out = torch.randn_like(out)
    grads_fast = torch.autograd.grad(out, leaves, grad_out)
    leaves2 = [t.clone().requires_grad_() for t in (q, *keys, *values)]
    w = depth_weights(leaves2[0], leaves2[1:4])  # plain autograd through the same formulas
    plain = sum(w[..., i, None] * leaves2[4 + i] for i in range(3))
    grads_plain = torch.autograd.grad(plain, leaves2, grad_out)
    for a, b in zip(grads_fast, grads_plain):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_bf16_mix_rounds_once_from_float32():
    q, keys, values = _inputs(n=3)
    qb, kb, vb = q.bfloat16(), [k.bfloat16() for k in keys], [v.bfloat16() for v in values]
    out = depth_mix(qb, kb, vb)
    assert out.dtype == torch.bfloat16
    ref = depth_mix_ref(qb, kb, vb).to(torch.bfloat16)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)


def test_sdpa_attention_matches_eager_with_absolute_causal_and_padding_mask():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 3, 8, generator=g)
    k = torch.randn(2, 2, 7, 8, generator=g)
    v = torch.randn(2, 2, 7, 8, generator=g)
    key_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7], dtype=torch.bool)
    mask = causal_padding_mask(key_mask, 4, 3, 7, torch.float32, "cpu")
    # Query 0 sits at slot 4: it sees slots 0..4 (minus padding), never 5 or 6.
    assert bool((mask[1, 0, 0, :5] == 0).all()) and bool((mask[1, 0, 0, 5:] < -1e30).all())
    assert bool((mask[0, 0, 0, :2] < -1e30).all())
    torch.testing.assert_close(attention(q, k, v, mask, False), attention_ref(q, k, v, mask), atol=1e-5, rtol=0)


def test_fully_masked_query_row_stays_finite():
    q = torch.randn(1, 2, 2, 4)
    k = torch.randn(1, 1, 2, 4)
    v = torch.randn(1, 1, 2, 4)
    mask = causal_padding_mask(torch.tensor([[False, True]]), 0, 2, 2, torch.float32, "cpu")
    assert torch.isfinite(attention(q, k, v, mask, False)).all()


@pytest.mark.parametrize("T,S,masked,causal", [(1, 7, True, False), (1, 7, False, False), (5, 5, False, True),
                                               (3, 7, True, False)])
def test_every_gqa_dispatch_of_attention_matches_the_eager_twin(T, S, masked, causal):
    """Packed single-query GQA, SDPA's enable_gqa and repeat_kv each equal the explicit softmax, values and grads."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(3, 6, T, 8, generator=g, requires_grad=True)
    k = torch.randn(3, 2, S, 8, generator=g, requires_grad=True)
    v = torch.randn(3, 2, S, 8, generator=g, requires_grad=True)
    key_mask = torch.ones(3, S, dtype=torch.bool)
    key_mask[0, :2] = False
    mask = causal_padding_mask(key_mask, S - T, T, S, torch.float32, "cpu") if masked else None
    ref_mask = mask if masked or not causal else causal_padding_mask(None, 0, T, S, torch.float32, "cpu")
    out, ref = attention(q, k, v, mask, causal), attention_ref(q, k, v, ref_mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
