"""Depth-Attention (``cross_layer="depth_attention"``): its static candidate plan, its value mix and its costs.

Zeng et al., "Depth-Attention: Cross-Layer Value Mixing for Language Models", EMNLP 2026, arXiv 2606.05014; the
exact formulas we implement are spec-depth-attention.md §3.2–3.4, §4, §6 and §8.

Legend: B batch, T time (query positions), L depth, H query heads, K KV heads, G = H/K group size, D head dim,
N depth candidates including self.

Depth-Attention uses the **value seam** (``attention.py``): a layer's raw value is replaced by the depth-mixed value
Ṽ, which is what the attention reads and the cache stores; keys are never mixed. Its residual is the plain one.

Candidate rule (spec-depth-attention.md §4), over virtual layers u = 0 … L_v − 1 (§11):

    C(u) = { j < u : j mod s = 0 }  ∪  { j : max(0, u − w) ≤ j < u }        (self is added last)

The plan is a tuple of tuples built once at construction; ``forward`` never recomputes it.

**At init:** Depth-Attention has no parameters, so "identity at init" does not apply. It reduces to vanilla when the
candidate plan is empty (``cross_layer="none"``), and layer 0 is always a vanilla layer.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor

from .none import residual_layer, residual_model
from .registry import MethodRecord, Plan

if TYPE_CHECKING:
    from ..config import ModelConfig


# ----------------------------------------------------------------------------- the plan (spec §4, §11)
def candidate_plan(num_layers: int, stride: int, window: int) -> Plan:
    """Source layers of each layer, ascending, excluding self.

    Args:
        num_layers: L (virtual layers for a looped model).
        stride: s >= 1; every layer j < l with j mod s == 0 is a candidate.
        window: w >= 0; the w most recent earlier layers are candidates too.
    Raises:
        ValueError: naming the argument, for L < 1, s < 1 or w < 0.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers={num_layers} must be >= 1")
    if stride < 1:
        raise ValueError(f"depth_attention_stride={stride} must be >= 1")
    if window < 0:
        raise ValueError(f"depth_attention_window={window} must be >= 0")
    plan = []
    for layer in range(num_layers):
        by_stride = set(range(0, layer, stride))
        by_window = set(range(max(0, layer - window), layer))
        plan.append(tuple(sorted(by_stride | by_window)))
    return tuple(plan)


def candidate_count(num_layers: int, stride: int, window: int) -> int:
    """Σ_l |candidates of layer l| of :func:`candidate_plan`, without building it: layer l has the ``l - a`` layers
    of its window ``[a, l)`` (``a = max(0, l - w)``) plus the multiples of ``s`` below ``a``, ``ceil(a / s)``."""
    total = 0
    for layer in range(num_layers):
        start = max(0, layer - window)
        total += layer - start + -(-start // stride)
    return total


def model_plan(cfg: ModelConfig) -> Plan:
    """The plan a Depth-Attention model runs: the §4 rule over ``cfg``'s virtual layers, stride and window."""
    return candidate_plan(cfg.num_virtual_layers, cfg.depth_attention_stride, cfg.depth_attention_window)


# ----------------------------------------------------------------------------- the mix (spec §3.2–3.4, §6)
def _acc(x: Tensor) -> Tensor:
    """Upcast to the accumulation dtype: float32, or float64 for float64 inputs (so gradcheck is exact)."""
    return x if x.dtype == torch.float64 else x.float()


def depth_query(q_BHTD: Tensor, num_kv_heads: int) -> Tensor:
    """Group-mean depth query ``q̄`` in float32, ``[B, K, T, D]`` (spec §3.2): mean of the G query heads of a KV head."""
    return _acc(q_BHTD).unflatten(1, (num_kv_heads, -1)).mean(2)


def depth_logits(qbar_BKTD: Tensor, keys: Sequence[Tensor]) -> Tensor:
    """Depth scores ``<q̄, K̂_j> / sqrt(D)`` for each candidate key, float32 ``[B, K, T, N]`` (spec §3.3)."""
    scale = 1.0 / math.sqrt(qbar_BKTD.shape[-1])
    return torch.stack([torch.linalg.vecdot(qbar_BKTD, _acc(k)) for k in keys], dim=-1) * scale


def depth_weights(q_BHTD: Tensor, keys: Sequence[Tensor]) -> Tensor:
    """Softmax over depth, float32 ``[B, K, T, N]``; ``keys`` are the candidates' keys with self last."""
    return depth_logits(depth_query(q_BHTD, keys[0].shape[1]), keys).softmax(-1)


# The fast path below touches each full-size [B, K, T, D] tensor as few times as it can (the mix is memory-bound):
# the group *sum* of q is formed once and the 1/(G·sqrt(D)) factor is applied to the small [B, K, T, N] logits;
# dot products use vecdot; weighted sums accumulate in place with addcmul.
def _query_sum(q_BHTD: Tensor, num_kv_heads: int) -> Tensor:
    return _acc(q_BHTD).unflatten(1, (num_kv_heads, -1)).sum(2)


def _weighted_sum(w_BKTN: Tensor, tensors: Sequence[Tensor]) -> Tensor:
    """Σ_i w[..., i] · x_i in the accumulation dtype, ``[B, K, T, D]``."""
    out = w_BKTN[..., 0, None] * _acc(tensors[0])
    for i in range(1, len(tensors)):
        out.addcmul_(w_BKTN[..., i, None], _acc(tensors[i]))
    return out


def _mix_forward(q_BHTD: Tensor, keys: Sequence[Tensor], values: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    K, G, D = keys[0].shape[1], q_BHTD.shape[1] // keys[0].shape[1], q_BHTD.shape[-1]
    qsum_BKTD = _query_sum(q_BHTD, K)
    logits_BKTN = torch.stack([torch.linalg.vecdot(qsum_BKTD, _acc(k)) for k in keys], dim=-1)
    w_BKTN = (logits_BKTN * (1.0 / (G * math.sqrt(D)))).softmax(-1)
    return _weighted_sum(w_BKTN, values).to(values[-1].dtype), w_BKTN


class _DepthMix(torch.autograd.Function):
    """Depth mix with a hand-written backward that saves only activation-dtype inputs and float32 weights.

    Plain autograd would save float32 copies of every candidate value (spec §9); here they are recomputed.
    """

    @staticmethod
    def forward(ctx, q_BHTD: Tensor, n: int, *kv: Tensor) -> Tensor:  # kv = keys..., values...
        out, w_BKTN = _mix_forward(q_BHTD, kv[:n], kv[n:])
        ctx.n = n
        ctx.save_for_backward(q_BHTD, w_BKTN, *kv)
        return out

    @staticmethod
    def backward(ctx, grad_BKTD: Tensor):
        q_BHTD, w_BKTN, *kv = ctx.saved_tensors
        n = ctx.n
        keys, values = kv[:n], kv[n:]
        K, D = keys[0].shape[1], q_BHTD.shape[-1]
        G = q_BHTD.shape[1] // K
        factor = 1.0 / (G * math.sqrt(D))  # d logit / d qsum = factor · k
        g = _acc(grad_BKTD)
        dw_BKTN = torch.stack([torch.linalg.vecdot(g, _acc(v)) for v in values], dim=-1)
        dlogit_BKTN = w_BKTN * (dw_BKTN - (w_BKTN * dw_BKTN).sum(-1, keepdim=True))  # softmax backward
        dsum_BKTN = dlogit_BKTN * factor  # gradient w.r.t. <qsum, k_i>
        grads: list[Tensor | None] = [None, None]
        if ctx.needs_input_grad[0]:
            dqsum_BKTD = _weighted_sum(dsum_BKTN, keys)
            grads[0] = dqsum_BKTD.unsqueeze(2).expand(-1, -1, G, -1, -1).flatten(1, 2).to(q_BHTD.dtype)
        qsum_BKTD = _query_sum(q_BHTD, K) if any(ctx.needs_input_grad[2:2 + n]) else None
        for i, k in enumerate(keys):
            grads.append((dsum_BKTN[..., i, None] * qsum_BKTD).to(k.dtype) if ctx.needs_input_grad[2 + i] else None)
        for i, v in enumerate(values):
            grads.append((w_BKTN[..., i, None] * g).to(v.dtype) if ctx.needs_input_grad[2 + n + i] else None)
        return tuple(grads)


def depth_mix(q_BHTD: Tensor, keys: Sequence[Tensor], values: Sequence[Tensor]) -> Tensor:
    """Depth-Attention value mix (arXiv 2606.05014; spec-depth-attention.md §3.2–3.4, §6).

    ``Ṽ = Σ_j α_j Ṽ_j + α_self v`` with ``α = softmax_j(<q̄, K̂_j> / sqrt(D))`` over the candidates and self.

    Args:
        q_BHTD: the layer's rotated, normalised queries ``[B, H, T, D]`` (all H heads; pooled here).
        keys: candidate keys ``[B, K, T, D]`` each, in candidate order with **self last**.
        values: matching values ``[B, K, T, D]``: stored (already mixed) values of the sources, self's raw value last.
    Returns:
        the mixed value ``[B, K, T, D]`` in the dtype of the self value, rounded once from float32.
    """
    if len(keys) != len(values) or not keys:
        raise ValueError(f"depth_mix needs as many keys as values (>= 1), got {len(keys)} and {len(values)}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q_BHTD, *keys, *values)):
        return _DepthMix.apply(q_BHTD, len(keys), *keys, *values)
    return _mix_inference(q_BHTD, keys, values)


def _mix_inference(q_BHTD: Tensor, keys: Sequence[Tensor], values: Sequence[Tensor]) -> Tensor:
    """Same math as ``_mix_forward`` in the fewest eager kernels (stacked candidates, one small matmul): no autograd
    memory to save here, and a decode step's tensors are so small that the kernel count is its cost.

    Under ``torch.compile`` ``_mix_unrolled`` is traced instead (see there for why and what it measured)."""
    if torch.compiler.is_compiling():
        return _mix_unrolled(q_BHTD, keys, values)
    K, G, D = keys[0].shape[1], q_BHTD.shape[1] // keys[0].shape[1], q_BHTD.shape[-1]
    k_BKTND = _acc(torch.stack(keys, dim=-2))
    v_BKTND = _acc(torch.stack(values, dim=-2))
    logits_BKTN1 = k_BKTND @ _query_sum(q_BHTD, K).unsqueeze(-1)
    w_BKTN1 = (logits_BKTN1 * (1.0 / (G * math.sqrt(D)))).softmax(-2)
    return (v_BKTND * w_BKTN1).sum(-2).to(values[-1].dtype)


def _mix_unrolled(q_BHTD: Tensor, keys: Sequence[Tensor], values: Sequence[Tensor]) -> Tensor:
    """The inference mix written for inductor: one reduction over D for all N logits, then the softmax over N
    unrolled into N-term elementwise max / exp / sum, and the weighted sum as N multiply-adds, normalised once.

    N is a compile-time constant. In the compiled CPU decode step of the ``small`` preset at B = 1 (inductor's C++
    wrapper, ``generate.CPU_DECODE_OPTIONS``) this form needs 25 buffer allocations per step where ``_mix_forward``
    needs 28 and vanilla 20, with the same 200 tensor views; at decode batch 1 on CPU that bookkeeping, not the
    arithmetic, is Depth-Attention's overhead. Timing: a one-process scratch measurement with the Python wrapper
    gave 1.019 × vanilla against ``_mix_forward``'s 1.042, but six processes of ``scripts/bench.py`` then gave
    1.044 (1.033–1.055), so the form alone is not a measured gain; the decode step of this form with the C++
    wrapper measures 1.015 and 1.018 × vanilla in two six-process runs, ``_mix_forward`` 1.019 in a third: no
    difference beyond the run-to-run spread (docs/benchmarks.md). Equal to the float64 twin within float32
    rounding; a bf16 result is rounded once from float32 (tests/model/test_functional.py)."""
    K, G, D = keys[0].shape[1], q_BHTD.shape[1] // keys[0].shape[1], q_BHTD.shape[-1]
    qsum_BKTD = _query_sum(q_BHTD, K) * (1.0 / (G * math.sqrt(D)))
    logits_BKTN = (_acc(torch.stack(keys, dim=-2)) * qsum_BKTD.unsqueeze(-2)).sum(-1)
    n = len(keys)
    top_BKT = logits_BKTN[..., 0]
    for i in range(1, n):
        top_BKT = torch.maximum(top_BKT, logits_BKTN[..., i])
    e_BKTN = (logits_BKTN - top_BKT.unsqueeze(-1)).exp()
    total_BKT = e_BKTN[..., 0]
    out_BKTD = e_BKTN[..., 0, None] * _acc(values[0])
    for i in range(1, n):
        total_BKT = total_BKT + e_BKTN[..., i]
        out_BKTD = out_BKTD + e_BKTN[..., i, None] * _acc(values[i])
    return (out_BKTD / total_BKT.unsqueeze(-1)).to(values[-1].dtype)


def depth_mix_ref(q_BHTD: Tensor, keys: Sequence[Tensor], values: Sequence[Tensor]) -> Tensor:
    """Loop-based float64 twin of ``depth_mix``: per-head scores, averaged over each group, then softmax."""
    B, H, T, D = q_BHTD.shape
    K = keys[0].shape[1]
    G = H // K
    out = torch.zeros(B, K, T, D, dtype=torch.float64)
    for b in range(B):
        for m in range(K):
            for t in range(T):
                scores = []
                for k in keys:
                    per_head = [float(q_BHTD[b, m * G + j, t].double() @ k[b, m, t].double()) for j in range(G)]
                    scores.append(sum(per_head) / G / math.sqrt(D))
                w = torch.tensor(scores, dtype=torch.float64).softmax(0)
                for i, v in enumerate(values):
                    out[b, m, t] += w[i] * v[b, m, t].double()
    return out


# ----------------------------------------------------------------------------- costs (spec §8)
def extra_flops(cfg: ModelConfig) -> int:
    """Σ_l F_l with F_l = 4·n_l·K·D + (G−1)·K·D + 5·n_l·K over layers with candidates (spec §8)."""
    K, D, G = cfg.num_key_value_heads, cfg.head_dim, cfg.group_size
    total = 0
    for cands in model_plan(cfg):
        if cands:
            n = len(cands) + 1
            total += 4 * n * K * D + (G - 1) * K * D + 5 * n * K
    return total


RECORD = MethodRecord(
    name="depth_attention",
    at_init="no parameters; vanilla when the candidate plan is empty, and layer 0 is always a vanilla layer",
    layer=residual_layer,
    model=residual_model,
    extra_flops=extra_flops,
    loopable=True,
    value_plan=model_plan,
)
