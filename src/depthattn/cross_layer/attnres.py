"""Attention Residuals (``cross_layer="attnres"``): each sublayer's input is a softmax mixture over depth.

Sources: Kimi Team, "Attention Residuals", arXiv 2603.15031 (Block AttnRes, §6.1 of spec-baselines.md, the
default); the recency-bias variant of ``hyq718/Depth-Attention`` / ``wdlctc/open-attention-residuals`` (§6.2,
``attnres_recency_bias`` set to a float). Variant implemented: Block AttnRes (not Full AttnRes), blocks counted in
sublayers.

Legend: B batch, T time, C hidden size, K sources of one aggregator, S block size in sublayers.

Every aggregator (one per sublayer, plus a final one before the final norm) has a pseudo-query w ``[C]`` (zeros at
init) and its own key-norm gain g ``[C]`` (ones):

    h = Σ_k α_k src_k,   α = softmax_k( w · RMSNorm_g(src_k) [+ b on the current residual, recency variant] )

in float32, values unnormalised, no 1/√C temperature.

* **Kimi form** (default). Sublayers are grouped into blocks of S; b_0 = x_0 and b_n is the sum of block n's sublayer
  outputs. Sublayer i (1-based) of block n reads [b_0 … b_{n−1}] (i = 1) or [b_0 … b_{n−1}, b_n^{i−1}] (partial
  sum, i > 1); there is no running residual. The final aggregator mixes [b_0 … b_N], N = ⌈2L/S⌉. **At init** the
  weights are uniform, so each sublayer sees the vanilla residual divided by its source count k: vanilla with each
  norm's eps scaled by k², and **vanilla to rounding when rms_norm_eps = 0**.
* **Recency variant.** A running residual r (r ← r + f after every sublayer) is kept; the sources are x_0, snapshots
  of r taken after an MLP sublayer once S sublayers have passed since the last one, and the current r, which gets a
  learnable bias b (initialised to ``attnres_recency_bias``). At init the weight of r is e^b / (e^b + k) for k
  other sources: **not vanilla in deep layers**, by design.

State through depth: Kimi ``(blocks, partial)`` (tuple of completed block sums, partial sum or None); recency
``(snapshots, r)``. Tuples grow; nothing is concatenated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor, nn

from .registry import MethodRecord

if TYPE_CHECKING:
    from ..config import ModelConfig


# ----------------------------------------------------------------------------- static structure
def kimi_schedule(num_sublayers: int, block_size: int) -> tuple[tuple[int, bool, bool], ...]:
    """Per sublayer g (0-based): (completed blocks read incl. b_0, reads a partial sum, closes its block)."""
    return tuple((g // block_size + 1, g % block_size > 0, (g + 1) % block_size == 0 or g == num_sublayers - 1)
                 for g in range(num_sublayers))


def kimi_source_labels(num_sublayers: int, block_size: int) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """Source labels per sublayer and for the final aggregator: ``"b{m}"`` a completed block sum (b0 = x_0),
    ``"p{n}"`` the partial sum of the current block n."""
    per = tuple(tuple(f"b{m}" for m in range(n)) + ((f"p{n}",) if partial else ())
                for n, partial, _ in kimi_schedule(num_sublayers, block_size))
    num_blocks = -(-num_sublayers // block_size)
    return per, tuple(f"b{m}" for m in range(num_blocks + 1))


def recency_schedule(num_sublayers: int, block_size: int) -> tuple[tuple[tuple[int, bool], ...], int]:
    """Recency variant: per sublayer (snapshots read incl. x_0 — the current r comes on top, snapshot taken after
    it), and the final aggregator's snapshot count. A snapshot follows an MLP sublayer (odd g) once the sublayer
    counter reaches S; the counter then resets."""
    per, count, snaps = [], 0, 1
    for g in range(num_sublayers):
        count += 1
        snap = g % 2 == 1 and count >= block_size
        per.append((snaps, snap))
        if snap:
            snaps, count = snaps + 1, 0
    return tuple(per), snaps


def source_counts(cfg: ModelConfig) -> tuple[int, ...]:
    """Sources mixed by each aggregator: 2L sublayers, then the final one."""
    n_sub, S = 2 * cfg.num_hidden_layers, cfg.attnres_block_size
    if cfg.attnres_recency_bias is None:
        per, final = kimi_source_labels(n_sub, S)
        return tuple(len(p) for p in per) + (len(final),)
    per_r, final_r = recency_schedule(n_sub, S)
    return tuple(k + 1 for k, _ in per_r) + (final_r + 1,)


# ----------------------------------------------------------------------------- the mix
def attnres_mix(srcs: Sequence[Tensor], query_C: Tensor, gain_C: Tensor, eps: float,
                bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Mixture of ``srcs`` (K tensors ``[B, T, C]``) and its weights ``[B, T, K]`` float32.

    logit_k = (w ⊙ g) · src_k · rsqrt(mean(src_k²) + eps) (+ ``bias`` on the last source), softmax in float32,
    output Σ_k α_k src_k accumulated in float32 and cast back once.
    """
    wg = query_C.float() * gain_C.float()
    logits = []
    for s in srcs:
        s32 = s.float()
        logits.append((s32 @ wg) * torch.rsqrt(s32.pow(2).mean(-1) + eps))
    logits_BTK = torch.stack(logits, dim=-1)
    if bias is not None:
        onehot = torch.zeros(len(srcs), device=logits_BTK.device)
        onehot[-1] = 1.0
        logits_BTK = logits_BTK + bias.float() * onehot
    a_BTK = torch.softmax(logits_BTK, dim=-1)
    acc = srcs[0].float() * a_BTK[..., 0:1]
    for k in range(1, len(srcs)):
        acc = torch.addcmul(acc, srcs[k], a_BTK[..., k:k + 1])
    return acc.to(srcs[0].dtype), a_BTK


def attnres_mix_ref(srcs: Sequence[Tensor], query_C: Tensor, gain_C: Tensor, eps: float,
                    bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Reference twin of ``attnres_mix``: normalise each key with its gain, dot with w, softmax, weighted sum."""
    logits = []
    for k, s in enumerate(srcs):
        x = s.float()
        key = gain_C.float() * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        logit = (key * query_C.float()).sum(-1)
        if bias is not None and k == len(srcs) - 1:
            logit = logit + bias.float()
        logits.append(logit)
    a = torch.softmax(torch.stack(logits, -1), -1)
    out = sum(a[..., k:k + 1] * s.float() for k, s in enumerate(srcs))
    return out.to(srcs[0].dtype), a


# ----------------------------------------------------------------------------- costs (spec-baselines.md §6)
def extra_params(cfg: ModelConfig) -> int:
    """(2L + 1) · 2C (Kimi form); (2L + 1) · (2C + 1) with the recency bias."""
    per = 2 * cfg.hidden_size + (cfg.attnres_recency_bias is not None)
    return (2 * cfg.num_hidden_layers + 1) * per


def extra_flops(cfg: ModelConfig) -> float:
    """4 · C per (aggregator, source) evaluation, summed over the 2L + 1 aggregators."""
    return 4.0 * cfg.hidden_size * sum(source_counts(cfg))


def inflight_elements(cfg: ModelConfig) -> int:
    """Per-token in-flight state: the largest source list × C ((N + 1) · C in the Kimi form)."""
    return max(source_counts(cfg)) * cfg.hidden_size


# ----------------------------------------------------------------------------- modules
class _Aggregators(nn.Module):
    """``query`` [A, C] (zeros), ``key_gain`` [A, C] (ones), ``recency_bias`` [A] (recency variant only)."""

    def __init__(self, cfg: ModelConfig, count: int, device=None):
        super().__init__()
        C = cfg.hidden_size
        self.eps = cfg.rms_norm_eps
        self.recency = cfg.attnres_recency_bias is not None
        self.query = nn.Parameter(torch.zeros(count, C, device=device))
        self.key_gain = nn.Parameter(torch.ones(count, C, device=device))
        self.recency_bias = nn.Parameter(torch.zeros(count, device=device)) if self.recency else None

    @torch.no_grad()
    def init_weights(self, cfg: ModelConfig) -> None:
        """w = 0 (required for stability), g = 1, b = attnres_recency_bias."""
        self.query.zero_()
        self.key_gain.fill_(1.0)
        if self.recency_bias is not None:
            self.recency_bias.fill_(float(cfg.attnres_recency_bias))

    def sources(self, state) -> tuple[Tensor, ...]:
        if self.recency:
            snaps, r = state
            return snaps + (r,)
        blocks, partial = state
        return blocks if partial is None else blocks + (partial,)

    def mix(self, state, a: int) -> tuple[Tensor, Tensor]:
        bias = None if self.recency_bias is None else self.recency_bias[a]
        return attnres_mix(self.sources(state), self.query[a], self.key_gain[a], self.eps, bias)


class AttnRes(_Aggregators):
    """Layer module: aggregators 0 (attention input) and 1 (MLP input) of layer ``layer_idx``."""

    #: The state's tuple grows with depth: ``parallelize.apply_compile`` compiles the sublayer bodies only.
    state_grows_with_depth = True

    def __init__(self, cfg: ModelConfig, layer_idx: int, device=None):
        super().__init__(cfg, 2, device=device)
        g0, n_sub, S = 2 * layer_idx, 2 * cfg.num_hidden_layers, cfg.attnres_block_size
        if self.recency:
            self.boundary = tuple(snap for _, snap in recency_schedule(n_sub, S)[0][g0:g0 + 2])
        else:
            self.boundary = tuple(closes for _, _, closes in kimi_schedule(n_sub, S)[g0:g0 + 2])

    def mix_weights(self, state, sublayer: int) -> Tensor:
        """The softmax weights ``[B, T, K]`` float32 this sublayer uses (for tests and inspection)."""
        return self.mix(state, sublayer)[1]

    def prepare(self, state, sublayer: int):
        return state

    def read(self, state, sublayer: int) -> Tensor:
        return self.mix(state, sublayer)[0]

    def write(self, state, sublayer: int, out: Tensor):
        if self.recency:
            snaps, r = state
            r = r + out
            return (snaps + (r,) if self.boundary[sublayer] else snaps), r
        blocks, partial = state
        partial = out if partial is None else partial + out
        if self.boundary[sublayer]:  # block complete: b_n = Σ of its sublayer outputs
            return blocks + (partial,), None
        return blocks, partial


class AttnResFinal(_Aggregators):
    """Model module: ``begin`` makes the first source x_0; ``end`` is the final aggregator (feeds the final norm)."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__(cfg, 1, device=device)

    def begin(self, h0: Tensor):
        return ((h0,), h0) if self.recency else ((h0,), None)

    def end(self, state) -> Tensor:
        return self.mix(state, 0)[0]

    def mix_weights(self, state) -> Tensor:
        return self.mix(state, 0)[1]


RECORD = MethodRecord(
    name="attnres",
    at_init="Kimi form: vanilla up to each norm's eps, scaled by the square of its source count (vanilla to rounding "
            "when rms_norm_eps = 0); recency variant: not vanilla in deep layers, by design (e^b weighting)",
    layer=AttnRes,
    model=AttnResFinal,
    extra_params=extra_params,
    extra_flops=extra_flops,
    inflight_elements=inflight_elements,
    no_decay=(r"query|key_gain|recency_bias",),  # w, g, b: stacked [A, C] matrices, yet never decayed (§8)
)
