"""Pure tensor operations, each with the obvious reference twin that tests compare against.

Legend: B batch, T time (query positions), S key positions, H query heads, K KV heads, G = H/K group size,
D head dim, C hidden size, V vocab.

Nothing here owns parameters or state. Source for the math: RMSNorm, RoPE (rotate-half form) and GQA attention as in
Hugging Face ``transformers`` Qwen3 (modeling_qwen3.py). The cross-layer mixes live with their methods in
``depthattn.cross_layer`` (Depth-Attention's depth mix and its float64 twin: ``cross_layer/depth_attention.py``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


# ----------------------------------------------------------------------------- norms and RoPE
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim, computed in float32 and cast back (Qwen3RMSNorm). Shape and dtype of ``x``."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, device=None) -> Tensor:
    """Inverse RoPE frequencies, float32 ``[D/2]``: ``theta ** (-2i/D)``."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    return 1.0 / (theta**exponent)


def rope_cos_sin(position_ids_BT: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """RoPE tables for absolute positions: cos and sin of shape ``[B, T, D]`` in ``dtype``."""
    freqs_BTd = position_ids_BT[:, :, None].float() * inv_freq[None, None, :].float()
    emb_BTD = torch.cat((freqs_BTd, freqs_BTd), dim=-1)
    return emb_BTD.cos().to(dtype), emb_BTD.sin().to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x_BHTD: Tensor, cos_BTD: Tensor, sin_BTD: Tensor) -> Tensor:
    """Rotate ``x`` ([B, heads, T, D]) by the positions' angles (rotate-half convention of HF/Qwen3)."""
    cos, sin = cos_BTD.unsqueeze(1), sin_BTD.unsqueeze(1)
    return x_BHTD * cos + rotate_half(x_BHTD) * sin


# ----------------------------------------------------------------------------- sequence attention
def repeat_kv(x_BKSD: Tensor, groups: int) -> Tensor:
    """Expand KV heads to query heads: ``[B, K, S, D] -> [B, K*G, S, D]``, query head h reads KV head h // G."""
    if groups == 1:
        return x_BKSD
    B, K, S, D = x_BKSD.shape
    return x_BKSD[:, :, None].expand(B, K, groups, S, D).reshape(B, K * groups, S, D)


def causal_padding_mask(
    key_mask_BS: Tensor | None, q_start: int, T: int, S: int, dtype: torch.dtype, device,
    documents_BT: Tensor | None = None,
) -> Tensor:
    """Additive attention mask ``[B or 1, 1, T, S]`` aligned to absolute slots.

    Query i sits at slot ``q_start + i`` and may see keys at slots ``<= q_start + i`` that are real tokens
    (``key_mask`` True) and, with ``documents`` (int64 ``[B, T]`` document indices from ``document_runs``, only
    without a cache: ``q_start = 0``, ``S = T``), in the query's document (block-diagonal causal). Masked entries
    hold ``finfo(dtype).min`` (not -inf) so a fully masked row of a padded query stays finite
    (spec-depth-attention.md §7.4).
    """
    q_slot = torch.arange(q_start, q_start + T, device=device)[:, None]
    k_slot = torch.arange(S, device=device)[None, :]
    allowed = (k_slot <= q_slot)[None, None]  # [1, 1, T, S]
    if key_mask_BS is not None:
        allowed = allowed & key_mask_BS[:, None, None, :S].bool()
    if documents_BT is not None:
        allowed = allowed & (documents_BT[:, None, :, None] == documents_BT[:, None, None, :])
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)


# ----------------------------------------------------------------------------- documents (packed sequences)
def document_runs(document_ids_BT: Tensor) -> Tensor:
    """Document index of every position, int64 ``[B, T]``: 0 for the first token of a row, +1 wherever
    ``document_ids`` changes from one position to the next. A document is a run of equal ids, so any integer labels
    work (a label that comes back after another one starts a new document)."""
    change = document_ids_BT[:, 1:] != document_ids_BT[:, :-1]
    return F.pad(change.long().cumsum(1), (1, 0), value=0)


def document_positions(documents_BT: Tensor, key_mask_BT: Tensor | None = None) -> Tensor:
    """RoPE positions ``[B, T]`` int64 restarting at 0 at each document: the count of real tokens (``key_mask``
    True; every token without a mask) before a token in its own document. ``documents``: ``document_runs``'s
    output. Without documents (one per row) it is ``Backbone._positions``' count; left pads get 0."""
    B, T = documents_BT.shape
    t = torch.arange(T, device=documents_BT.device).expand(B, T)
    real = torch.ones_like(t) if key_mask_BT is None else key_mask_BT.long()
    before = real.cumsum(1) - real  # real tokens strictly before t
    start = F.pad(documents_BT[:, 1:] != documents_BT[:, :-1], (1, 0), value=True)
    first = torch.where(start, t, torch.zeros_like(t)).cummax(1).values  # first slot of t's document
    return before - before.gather(1, first)


def packed_document_ids(position_ids_BT: Tensor) -> Tensor:
    """Hugging Face's packing convention (``DataCollatorWithFlattening``): a new document starts wherever the
    position does not grow by exactly 1 (transformers' ``find_packed_sequence_indices``). int64 ``[B, T]``, 0 for
    each row's first document."""
    step = position_ids_BT[:, 1:] - position_ids_BT[:, :-1]
    return F.pad((step != 1).long().cumsum(1), (1, 0), value=0)


def document_block_mask(documents_BT: Tensor, key_mask_BT: Tensor | None = None):
    """FlexAttention ``BlockMask`` of the block-diagonal causal mask ``causal_padding_mask`` builds with
    ``documents`` (and ``key_mask``) for one call without a cache: query q may see key k ≤ q of its own document
    (that is a real token). Batch-specific, broadcast over heads; 128 × 128 blocks (``create_block_mask``'s
    default), built eagerly from a ``[B, 1, T, T]`` boolean evaluation of the mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    docs = documents_BT
    if key_mask_BT is None:
        def mask_mod(b, h, q, k):
            return (k <= q) & (docs[b, q] == docs[b, k])
    else:
        real = key_mask_BT.bool()

        def mask_mod(b, h, q, k):
            return (k <= q) & (docs[b, q] == docs[b, k]) & real[b, k]
    B, T = docs.shape
    return create_block_mask(mask_mod, B, None, T, T, device=docs.device)


_COMPILED_FLEX = None


def flex_serves(device: torch.device) -> bool:
    """Whether document masking runs on FlexAttention (``document_block_mask`` + ``flex_attention``) on ``device``:
    on CUDA, where its fused kernel is made; elsewhere SDPA with ``causal_padding_mask``'s additive mask."""
    return device.type == "cuda"


def flex_attention(q_BHTD: Tensor, k_BKSD: Tensor, v_BKSD: Tensor, block_mask, compiled: bool = True) -> Tensor:
    """FlexAttention (``torch.nn.attention.flex_attention``) with ``block_mask`` (``document_block_mask``), scale
    ``1/sqrt(D)``, GQA by ``enable_gqa``; ``[B, H, T, D]``. ``compiled``: through one ``torch.compile`` of
    ``flex_attention`` shared by all layers (its fused kernel; the eager form materialises the scores and is
    for tests). Under autocast q, k and v are cast to the autocast dtype, as SDPA is; otherwise to v's dtype.
    Fully masked query rows (a pad before any real token) give 0 here (SDPA with ``causal_padding_mask``:
    a finite mean); they are padding, which no output reads. ``attention`` with ``causal_padding_mask`` is the
    twin."""
    global _COMPILED_FLEX
    from torch.nn.attention.flex_attention import flex_attention as flex

    if not compiled or torch.compiler.is_compiling():  # traced: the enclosing graph compiles it
        fn = flex
    else:
        if _COMPILED_FLEX is None:
            _COMPILED_FLEX = torch.compile(flex, dynamic=False)
        fn = _COMPILED_FLEX
    kind = q_BHTD.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else v_BKSD.dtype
    q, k, v = q_BHTD.to(dtype), k_BKSD.to(dtype), v_BKSD.to(dtype)
    return fn(q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])


def static_padding_mask(key_mask_BS: Tensor, slots_T: Tensor, dtype: torch.dtype) -> Tensor:
    """Additive mask ``[B, 1, T, S]`` over every cache slot for queries at device slot indices ``slots_T``.

    The fixed-shape twin of ``causal_padding_mask(key_mask, q_start, T, S, ...)`` with ``q_start`` a device
    value: query i may see slots ``<= slots[i]`` whose ``key_mask`` is True (unfilled slots are False there).
    """
    S = key_mask_BS.shape[1]
    k_slot = torch.arange(S, device=key_mask_BS.device)
    allowed = (k_slot[None, :] <= slots_T[:, None])[None, None] & key_mask_BS[:, None, None, :]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=key_mask_BS.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)


def attention(q_BHTD: Tensor, k_BKSD: Tensor, v_BKSD: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
    """Scaled dot-product GQA attention with scale ``1/sqrt(D)``; returns ``[B, H, T, D]``.

    ``mask`` is an additive ``[B|1, 1, T, S]`` mask (see ``causal_padding_mask``) or None; ``is_causal`` may only be
    True when ``T == S`` and there is no padding (top-left alignment then equals absolute alignment).

    The KV heads are shared without copying the keys and values where SDPA allows it, in the order transformers'
    ``sdpa_attention_forward`` (Qwen3) chooses: without a mask, SDPA's own GQA (``enable_gqa``); for one query
    position, the G query heads of a KV head are packed as G query rows of that head (``[B, K, G, D]``, the mask
    ``[B|1, 1, 1, S]`` broadcasts over them), which turns a decode step into one small attention per KV head;
    otherwise K and V are expanded to the H query heads (``repeat_kv``). ``enable_gqa`` is taken only where a fast
    SDPA kernel serves it (CPU; CUDA flash: fp16/bf16); elsewhere (e.g. float32 on CUDA) SDPA would fall
    back to its math kernel, so K and V are expanded instead. ``attention_ref`` is the twin.
    """
    B, H, T, D = q_BHTD.shape
    groups = H // k_BKSD.shape[1]
    if groups > 1 and mask is None and _sdpa_gqa_is_fast(q_BHTD):
        return F.scaled_dot_product_attention(q_BHTD, k_BKSD, v_BKSD, is_causal=is_causal, enable_gqa=True)
    if groups > 1 and T == 1:
        packed = q_BHTD.reshape(B, H // groups, groups, D)
        return F.scaled_dot_product_attention(packed, k_BKSD, v_BKSD, attn_mask=mask).reshape(B, H, T, D)
    k, v = repeat_kv(k_BKSD, groups), repeat_kv(v_BKSD, groups)
    return F.scaled_dot_product_attention(q_BHTD, k, v, attn_mask=mask, is_causal=is_causal and mask is None)


def _sdpa_gqa_is_fast(q: Tensor) -> bool:
    """Whether SDPA serves ``enable_gqa=True`` with a fused kernel for ``q``: on CPU, and on CUDA through flash
    attention, which takes fp16/bf16 only (on GPUs older than sm80 SDPA falls back to its math kernel even then)."""
    return q.device.type == "cpu" or (q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16))


def eager_attention(q_BHTD: Tensor, k_BKSD: Tensor, v_BKSD: Tensor, mask: Tensor | None,
                    is_causal: bool) -> tuple[Tensor, Tensor]:
    """``attention`` with an explicit softmax, which also returns the attention probabilities: (output
    ``[B, H, T, D]``, probabilities ``[B, H, T, S]``), both in q's dtype; each row of the probabilities sums to 1.

    transformers' ``eager_attention_forward`` (Qwen3): K and V expanded to the H query heads (``repeat_kv``),
    scores ``q k^T · 1/sqrt(D)`` plus the additive ``mask`` (``[B|1, 1, T, S]``; with ``mask=None`` and
    ``is_causal``, the causal mask of ``T == S`` positions), softmax in float32, cast to q's dtype, times V. The
    path a forward takes when it is asked for the attention weights (``Attention.forward``); SDPA (``attention``)
    gives the same output to rounding. Fully masked rows (a pad before any real token) are uniform over the
    slots, as SDPA's are."""
    B, H, T, D = q_BHTD.shape
    groups = H // k_BKSD.shape[1]
    k, v = repeat_kv(k_BKSD, groups), repeat_kv(v_BKSD, groups)
    scores = (q_BHTD @ k.transpose(-1, -2)) * (1.0 / math.sqrt(D))
    if mask is None and is_causal:
        mask = causal_padding_mask(None, 0, T, k.shape[2], scores.dtype, scores.device)
    if mask is not None:
        scores = scores + mask
    probs = scores.softmax(-1, dtype=torch.float32).to(q_BHTD.dtype)
    return probs @ v, probs


def attention_ref(q_BHTD: Tensor, k_BKSD: Tensor, v_BKSD: Tensor, mask: Tensor | None) -> Tensor:
    """Eager twin of ``attention``: explicit softmax(q k^T / sqrt(D) + mask) v in float32 (``eager_attention``
    on float32 copies), cast to q's dtype."""
    out, _ = eager_attention(q_BHTD.float(), k_BKSD.float(), v_BKSD.float(), None if mask is None else mask.float(),
                             False)
    return out.to(q_BHTD.dtype)
