"""mHC: manifold-constrained hyper-connections (``cross_layer="mhc"``).

Source: Xie et al., "mHC: Manifold-Constrained Hyper-Connections", arXiv 2512.24880 (on Hyper-Connections, Zhu et
al., ICLR 2025, arXiv 2409.19606); our form and decisions are spec-baselines.md §5. Variant implemented: the paper's
dynamic + static mHC maps on n streams (Hpre sigmoid, Hpost 2·sigmoid, Hres projected to doubly stochastic), with
the projection runs the paper's Sinkhorn rounds in the log domain (``sinkhorn``, with its measured column bound), or,
with ``mhc_sinkhorn="exp"``, in the exp domain with the Depth-Attention authors' clamps and order (``sinkhorn_exp``).

Legend: B batch, T time, C hidden size, S streams (n = ``mhc_num_streams``).

The residual is widened to S streams X ``[B, T, S, C]``: expanded once after the embedding (S copies of x_0) and
reduced once before the final norm (softmax over S learnable logits, a mean at init). Per sublayer, from
x̃ = RMSNorm(vec(X)) (length S·C), in float32:

    Hpre  = σ(α_pre · x̃ φ_pre + b_pre)              [S]      (0, 1)
    Hpost = 2 σ(α_post · x̃ φ_post + b_post)         [S]      (0, 2)
    Hres  = Sinkhorn(α_res · mat(x̃ φ_res) + b_res)  [S, S]   rows sum to 1, columns ≈ 1 (bound: ``sinkhorn``)
    input = Σ_s Hpre[s] X_s;   X_s ← Σ_t Hres[s, t] X_t + Hpost[s] · f(input)

Init: b_pre = logit(1/n), b_post = 0, b_res = log(0.99 on the diagonal, 0.01/(n−1) elsewhere), α = ``mhc_alpha_init``,
φ ~ N(0, initializer_range²), norm gain 1. **At init the model is vanilla to rounding when φ = 0** and near-vanilla
with the default φ (the dynamic logits add noise of order α · σ · √(nC)).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..functional import rms_norm
from ..layers import RMSNorm
from .registry import MethodRecord

if TYPE_CHECKING:
    from ..config import ModelConfig


# ----------------------------------------------------------------------------- Sinkhorn
def sinkhorn(logits_SS: Tensor, iters: int) -> Tensor:
    """Doubly stochastic projection of ``[..., S, S]`` logits, in float32 (spec-baselines.md §5 decision).

    The mHC paper's Sinkhorn–Knopp iteration (arXiv 2512.24880, t_max = 20 rounds), run on the log-scalings:
    subtract the max, then ``iters`` rounds of (normalise columns, normalise rows) by ``logsumexp`` in float32, and
    one ``exp`` at the end. No entry is exponentiated before it is normalised and nothing is clamped, so logits of
    any scale stay finite and exact zeros never appear. Rows are normalised last, so they sum to 1 (up to rounding)
    and equal streams stay equal.

    **Bound** (tested, ``tests/cross_layer/test_residual.py``): rows within 1e-6 of 1 at any scale; columns within 1e-3
    of 1 for S ≤ 4 and logits ``s · N(0, 1)`` with s ≤ 30 after ``iters`` ≥ 2000 rounds. Sinkhorn converges only like
    1/t when the logits spread widely (measured worst column error ≈ 1.5 / t at s = 30, S = 4), so the paper's 20 rounds
    (the default ``mhc_sinkhorn_iters``) leave columns up to ~0.05 off at s ≥ 3 and up to 1 off at s = 30: raise
    ``mhc_sinkhorn_iters`` where Hres must be doubly stochastic to 1e-3.

    Args:
        logits_SS: ``[..., S, S]`` of any float dtype.
        iters: rounds (``mhc_sinkhorn_iters``).
    Returns:
        float32 ``[..., S, S]``, entries > 0 unless they underflow float32 after normalisation.
    """
    x = logits_SS.float()
    x = x - x.amax(dim=(-2, -1), keepdim=True)
    for _ in range(iters):
        x = x - x.logsumexp(-2, keepdim=True)  # columns
        x = x - x.logsumexp(-1, keepdim=True)  # rows
    return x.exp()


def sinkhorn_ref(logits_SS: Tensor, iters: int) -> Tensor:
    """Slow twin of ``sinkhorn``: plain Sinkhorn–Knopp on exp(logits − max) in float64 with explicit Python loops
    over matrices, rows and columns (columns, then rows, ``iters`` rounds); returns float64. Tests only."""
    flat = logits_SS.double().reshape(-1, logits_SS.shape[-2], logits_SS.shape[-1])
    n = flat.shape[-1]
    out = []
    for m in flat:
        top = max(float(v) for v in m.flatten())
        p = [[math.exp(float(m[i, j]) - top) for j in range(n)] for i in range(n)]
        for _ in range(iters):
            for j in range(n):
                col = sum(p[i][j] for i in range(n))
                for i in range(n):
                    p[i][j] /= col
            for i in range(n):
                row = sum(p[i])
                p[i] = [v / row for v in p[i]]
        out.append(torch.tensor(p, dtype=torch.float64))
    return torch.stack(out).reshape(logits_SS.shape)


#: Smallest entry and denominator of the exp-domain Sinkhorn (``sinkhorn_exp``).
EXP_CLAMP = 1e-12


def sinkhorn_exp(logits_SS: Tensor, iters: int) -> Tensor:
    """The exp-domain Sinkhorn–Knopp of the Depth-Attention authors' mHC (``mhc_sinkhorn="exp"``), in float32.

    Source: hyq718/Depth-Attention, ``src/llamafactory/model/modeling/modeling_llama_mhc.py`` @ 019daf9,
    ``ResidualStreamConnector._sinkhorn`` (read, not copied). Subtract the max over each ``S × S`` matrix, ``exp``,
    clamp entries at >= ``EXP_CLAMP``; then ``iters`` rounds of (normalise rows, normalise columns), each
    denominator clamped at >= ``EXP_CLAMP``. Columns are normalised last, so they sum to 1 (up to rounding) and rows
    only approximately. Where no clamp binds, ``sinkhorn_exp(L) = sinkhorn(Lᵀ)ᵀ`` (tested): transposing the stored
    logits would hand the model Hresᵀ, so no weight mapping turns one form into the other.

    Args:
        logits_SS: ``[..., S, S]`` of any float dtype.
        iters: rounds (``mhc_sinkhorn_iters``).
    Returns:
        float32 ``[..., S, S]``, entries >= ``EXP_CLAMP`` / (largest row or column sum) > 0.
    """
    p = logits_SS.float()
    p = (p - p.amax(dim=(-2, -1), keepdim=True)).exp().clamp_min(EXP_CLAMP)
    for _ in range(iters):
        p = p / p.sum(-1, keepdim=True).clamp_min(EXP_CLAMP)  # rows
        p = p / p.sum(-2, keepdim=True).clamp_min(EXP_CLAMP)  # columns
    return p


def sinkhorn_exp_ref(logits_SS: Tensor, iters: int) -> Tensor:
    """Slow twin of ``sinkhorn_exp`` in float64 with explicit Python loops (rows, then columns, ``iters`` rounds;
    the same clamps); returns float64. Tests only."""
    flat = logits_SS.double().reshape(-1, logits_SS.shape[-2], logits_SS.shape[-1])
    n = flat.shape[-1]
    out = []
    for m in flat:
        top = max(float(v) for v in m.flatten())
        p = [[max(math.exp(float(m[i, j]) - top), EXP_CLAMP) for j in range(n)] for i in range(n)]
        for _ in range(iters):
            for i in range(n):
                row = max(sum(p[i]), EXP_CLAMP)
                p[i] = [v / row for v in p[i]]
            for j in range(n):
                col = max(sum(p[i][j] for i in range(n)), EXP_CLAMP)
                for i in range(n):
                    p[i][j] /= col
        out.append(torch.tensor(p, dtype=torch.float64))
    return torch.stack(out).reshape(logits_SS.shape)


#: ``ModelConfig.mhc_sinkhorn`` → the projection (config.MHC_SINKHORN_FORMS).
SINKHORN_FORMS = {"log": sinkhorn, "exp": sinkhorn_exp}


def static_logits(n: int) -> Tensor:
    """b = [b_pre (n), b_post (n), b_res (n·n, row-major)] in float32 (spec-baselines.md §5).

    b_pre = logit(1/n) so Hpre ≈ 1/n; for n = 1 the probability 1 is clamped to 1 − 1e-6 (logit 13.8) to stay
    finite. b_post = 0 so Hpost = 1. b_res = log of 0.99 on the diagonal and 0.01/(n−1) elsewhere (0 for n = 1).
    """
    p = min(1.0 / n, 1.0 - 1e-6)
    pre = torch.full((n,), math.log(p / (1.0 - p)))
    post = torch.zeros(n)
    res = torch.full((n, n), 0.01 / (n - 1) if n > 1 else 1.0).fill_diagonal_(0.99 if n > 1 else 1.0)
    return torch.cat([pre, post, res.log().flatten()])


# ----------------------------------------------------------------------------- costs (spec-baselines.md §5)
def extra_params(cfg: ModelConfig) -> int:
    """2L connectors × [n·C (norm) + n·C·(n² + 2n) (φ) + (n² + 2n) (b) + 3 (α)] + n readout logits."""
    n, C, L = cfg.mhc_num_streams, cfg.hidden_size, cfg.num_hidden_layers
    m = n * n + 2 * n
    return 2 * L * (n * C + n * C * m + m + 3) + n


def extra_flops(cfg: ModelConfig) -> float:
    """2L · [2·n·C·(n² + 2n) + 2·(n² + 2n)·C + 3·n·C] forward FLOPs per token (Sinkhorn not counted)."""
    n, C, L = cfg.mhc_num_streams, cfg.hidden_size, cfg.num_hidden_layers
    m = n * n + 2 * n
    return 2.0 * L * (2 * n * C * m + 2 * m * C + 3 * n * C)


def inflight_elements(cfg: ModelConfig) -> int:
    """n · C per token: the widened residual."""
    return cfg.mhc_num_streams * cfg.hidden_size


# ----------------------------------------------------------------------------- modules
class Connector(nn.Module):
    """One sublayer's maps. Parameters: ``norm.weight`` [S·C], ``phi.weight`` [S²+2S, S·C], ``alpha`` [3]
    (pre, post, res), ``bias`` [S²+2S] (the static logits b: pre, post, res row-major). Hres is projected by
    ``SINKHORN_FORMS[cfg.mhc_sinkhorn]``."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        n, C = cfg.mhc_num_streams, cfg.hidden_size
        self.n, self.iters = n, cfg.mhc_sinkhorn_iters
        self.sinkhorn = SINKHORN_FORMS[cfg.mhc_sinkhorn]
        self.norm = RMSNorm(n * C, cfg.rms_norm_eps, device=device)
        self.phi = nn.Linear(n * C, n * n + 2 * n, bias=False, device=device)
        self.alpha = nn.Parameter(torch.empty(3, device=device))
        self.bias = nn.Parameter(torch.empty(n * n + 2 * n, device=device))

    @torch.no_grad()
    def init_weights(self, cfg: ModelConfig) -> None:
        """norm gain 1; φ ~ N(0, initializer_range²); α = mhc_alpha_init; b = ``static_logits(n)``."""
        nn.init.ones_(self.norm.weight)
        nn.init.normal_(self.phi.weight, mean=0.0, std=cfg.initializer_range)
        self.alpha.fill_(cfg.mhc_alpha_init)
        self.bias.copy_(static_logits(self.n))

    def maps(self, X_BTSC: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(Hpre ``[B,T,S]``, Hpost ``[B,T,S]``, Hres ``[B,T,S,S]``), computed in float32 (autocast off), cast to
        the dtype of ``X``."""
        B, T, n, C = X_BTSC.shape
        with torch.autocast(X_BTSC.device.type, enabled=False):
            x = rms_norm(X_BTSC.reshape(B, T, n * C).float(), self.norm.weight.float(), self.norm.eps)
            z = F.linear(x, self.phi.weight.float())
            a, b = self.alpha.float(), self.bias.float()
            pre, post, res = z.split([n, n, n * n], dim=-1)
            b_pre, b_post, b_res = b.split([n, n, n * n])
            hpre = torch.sigmoid(a[0] * pre + b_pre)
            hpost = 2.0 * torch.sigmoid(a[1] * post + b_post)
            hres = self.sinkhorn((a[2] * res + b_res).view(B, T, n, n), self.iters)
        dt = X_BTSC.dtype
        return hpre.to(dt), hpost.to(dt), hres.to(dt)


class MHC(nn.Module):
    """Layer module: ``connectors.0`` (attention) and ``connectors.1`` (MLP). State: X ``[B, T, S, C]``, or
    (X, maps) between ``prepare`` and ``write``."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, device=None):
        super().__init__()
        self.connectors = nn.ModuleList(Connector(cfg, device=device) for _ in range(2))

    def prepare(self, X_BTSC: Tensor, sublayer: int):
        return X_BTSC, self.connectors[sublayer].maps(X_BTSC)

    def read(self, state, sublayer: int) -> Tensor:
        X, (hpre, _, _) = state
        return torch.einsum("bts,btsc->btc", hpre, X)

    def write(self, state, sublayer: int, out_BTC: Tensor) -> Tensor:
        X, (_, hpost, hres) = state
        # mHC (arXiv 2512.24880): X ← Hres X + Hpostᵀ f(Hpre X)
        return torch.einsum("btsu,btuc->btsc", hres, X) + hpost[..., None] * out_BTC[:, :, None, :]


class MHCStreams(nn.Module):
    """Model module: expand x_0 to S streams; reduce with softmax(``readout``) (``readout`` [S], zeros at init)."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        self.n = cfg.mhc_num_streams
        self.readout = nn.Parameter(torch.zeros(self.n, device=device))

    @torch.no_grad()
    def init_weights(self, cfg: ModelConfig) -> None:
        """readout logits 0 (a mean over streams)."""
        self.readout.zero_()

    def begin(self, h0_BTC: Tensor) -> Tensor:
        B, T, C = h0_BTC.shape
        return h0_BTC[:, :, None, :].expand(B, T, self.n, C)

    def end(self, X_BTSC: Tensor) -> Tensor:
        w = torch.softmax(self.readout.float(), dim=0).to(X_BTSC.dtype)
        return torch.einsum("s,btsc->btc", w, X_BTSC)


RECORD = MethodRecord(
    name="mhc",
    at_init="vanilla to rounding with φ = 0; near-vanilla with the default φ",
    layer=MHC,
    model=MHCStreams,
    extra_params=extra_params,
    extra_flops=extra_flops,
    inflight_elements=inflight_elements,
    no_decay=(r"connectors\.\d+\.(alpha|bias)", r"readout"),  # α, b, readout; φ decays (spec-baselines.md §8)
)
