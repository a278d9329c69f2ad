"""A float64 reference of the forward of hyq718/Depth-Attention's models (a test helper; not collected).

Written from the math of their modelling files as docs/methods.md ("The authors' code") records it, with
their **config.json** (a dict) and **their** state-dict key names; nothing here is their code. Full (non-cached)
causal forward over ``input_ids [B, T]``, no padding; returns float64 logits ``[B, T, V]``.

Methods, resolved from the config the way their code does (``resolve``):

* ``vanilla``: Llama with per-head q/k RMSNorm (``use_qk_norm``, default true).
* ``depth_attention``: their SDPA attention class (modeling_llama_depth_attention.py@3bdad70): depth candidates
  {j < l : j mod s = 0} ∪ {the w most recent}, group-mean query, softmax over candidates + self of
  <q̄, K̂_j>/sqrt(D), Ṽ = Σ α_j Ṽ_j + α_self v; the sequence attention reads K̂ and Ṽ, later layers read (K̂, Ṽ).
* ``mhc``: n streams, exp-domain Sinkhorn with 1e-12 clamps, rows then columns each round.
* ``attnres``: modeling_llama_attnres.py's recency-bias form (cumulative residual, snapshots after a layer once
  ``attnres_block_size`` sublayers passed, a 0-dim ``recency_bias`` per aggregator on the current residual).
* ``denseformer``: DWA with ``alphas.{i}`` ``[(i+1)//k + 1]`` after block i+1 when p | i+1 (``[0]`` otherwise).

``qk_norm_order``: ``"sdpa"`` (their SDPA/eager classes: q_norm before RoPE, k_norm after RoPE) or ``"fa2"``
(their FlashAttention-2 class: both before RoPE, our Qwen3 order).
"""

from __future__ import annotations

import math
import os
from typing import Mapping

import torch
from torch import Tensor

NONE_VALUES = (None, "", "none", "null", False)
BASELINE_ALIASES = {"denseformer": "denseformer", "densetransformer": "denseformer", "attnres": "attnres",
                    "block_attnres": "attnres", "block-attnres": "attnres", "attention_residual": "attnres",
                    "attention-residual": "attnres", "mhc": "mhc"}
DEPTH_PATTERNS = ("depth_attention", "depth_softmax")
#: LlamaConfig defaults (transformers 4.46) for keys a Trainer-saved config.json leaves out (``to_diff_dict``).
LLAMA_DEFAULTS = dict(max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu",
                      tie_word_embeddings=False, attention_bias=False, mlp_bias=False, pretraining_tp=1,
                      rope_scaling=None)


# ----------------------------------------------------------------------------- switches
def _baseline(config: Mapping) -> str | None:
    """baseline_mode, else the legacy residual_baseline; a conflict raises (their _normalize_residual_baseline)."""
    def norm(v):
        if v in NONE_VALUES:
            return None
        v = str(v).strip().lower()
        return None if v in NONE_VALUES else BASELINE_ALIASES.get(v, v)
    mode, legacy = norm(config.get("baseline_mode")), norm(config.get("residual_baseline"))
    if mode is not None and legacy is not None and mode != legacy:
        raise ValueError(f"conflicting baseline_mode={mode!r} and residual_baseline={legacy!r}")
    found = mode if mode is not None else legacy
    if found is not None and found not in ("denseformer", "attnres", "mhc"):
        raise ValueError(f"unsupported baseline_mode={found!r}")
    return found


def _positive_int(config: Mapping, name: str, default: int) -> int:
    """Their _positive_config_int: the value as int (the default when missing or not an int), at least 1."""
    try:
        value = int(config.get(name, default))
    except (TypeError, ValueError):
        value = default
    return max(1, value)


def _positive_int_any(config: Mapping, names: tuple[str, ...], default: int) -> int:
    for name in names:
        if config.get(name) not in (None, ""):
            return _positive_int(config, name, default)
    return max(1, default)


def _first_present(config: Mapping, names: tuple[str, ...], default: int) -> int:
    """getattr(config, new, getattr(config, old, default)): the first key present wins, even when null."""
    for name in names:
        if name in config:
            return int(config[name])  # a null value raises TypeError, as int(None) does in their code
    return default


def num_streams(config: Mapping) -> int:
    """residual_baseline_num_streams, else mhc_num_streams, else $MHC_NUM_STREAMS, else 4."""
    for name in ("residual_baseline_num_streams", "mhc_num_streams"):
        if config.get(name) not in (None, ""):
            return _positive_int(config, name, 4)
    env = os.environ.get("MHC_NUM_STREAMS")
    if env in (None, ""):
        return 4
    try:
        return max(1, int(env))
    except ValueError:
        return 4


def resolve(config: Mapping) -> dict:
    """What their code runs for ``config``: ``{"method": ..., settings}``. Raises NotImplementedError for what the
    reference (and depthattn) does not implement."""
    cfg = {**LLAMA_DEFAULTS, **config}
    for key, bad in (("scale_embeds", True), ("no_residual", True), ("attention_bias", True), ("mlp_bias", True)):
        if cfg.get(key) is bad:
            raise NotImplementedError(f"{key}={bad}")
    if cfg.get("rope_scaling") is not None or int(cfg.get("pretraining_tp", 1)) > 1 or cfg["hidden_act"] != "silu":
        raise NotImplementedError("rope_scaling / pretraining_tp / hidden_act")
    baseline = _baseline(cfg)
    if baseline == "mhc":
        return dict(method="mhc", streams=num_streams(cfg), iters=_positive_int(cfg, "mhc_sinkhorn_iters", 20))
    if baseline == "attnres":
        return dict(method="attnres", block_size=_positive_int(cfg, "attnres_block_size", 12))
    if baseline == "denseformer":
        return dict(method="denseformer",
                    dilation=_positive_int_any(cfg, ("denseformer_dwa_dilation", "densetransformer_dwa_dilation"), 1),
                    period=_positive_int_any(cfg, ("denseformer_dwa_period", "densetransformer_dwa_period"), 1))
    pattern = cfg.get("cross_layer_pattern")
    if pattern == "dense" or (bool(cfg.get("recurrent_model")) and cfg.get("layer_kv_reuse_map")):
        raise NotImplementedError("cross_layer_pattern='dense' / layer_kv_reuse_map")
    on = bool(cfg.get("recurrent_model", False)) and (bool(cfg.get("use_depth_attention", False))
                                                       or pattern in DEPTH_PATTERNS)
    if not on:
        return dict(method="vanilla")
    return dict(method="depth_attention",
                stride=_first_present(cfg, ("depth_attention_stride", "depth_softmax_stride"), 1),
                window=_first_present(cfg, ("depth_attention_recent_window", "depth_recent_window"), 0))


def depth_candidates(layer: int, stride: int, window: int) -> list[int]:
    """Their selection over the ``layer`` earlier layers (every one when stride <= 1 and window <= 0)."""
    chosen = set(range(layer)) if stride <= 1 else {i for i in range(layer) if i % stride == 0}
    if window > 0:
        chosen |= set(range(max(0, layer - window), layer))
    return sorted(chosen)


# ----------------------------------------------------------------------------- pieces (float64)
def rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope(x_BHTD: Tensor, theta: float) -> Tensor:
    """Rotate-half RoPE at positions 0..T-1, in float64."""
    T, D = x_BHTD.shape[-2], x_BHTD.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], -1)
    half = D // 2
    rotated = torch.cat([-x_BHTD[..., half:], x_BHTD[..., :half]], -1)
    return x_BHTD * ang.cos() + rotated * ang.sin()


def sinkhorn_exp(logits: Tensor, iters: int) -> Tensor:
    """exp(L − max) clamped at 1e-12, then per round: rows divided by their sums, then columns (clamps 1e-12)."""
    m = (logits - logits.amax(dim=(-2, -1), keepdim=True)).exp().clamp_min(1e-12)
    for _ in range(iters):
        m = m / m.sum(-1, keepdim=True).clamp_min(1e-12)
        m = m / m.sum(-2, keepdim=True).clamp_min(1e-12)
    return m


class _Trunk:
    """Shared Llama + qk-norm pieces over one state dict (float64 copies)."""

    def __init__(self, config: Mapping, state: Mapping[str, Tensor], qk_norm_order: str):
        if qk_norm_order not in ("sdpa", "fa2"):
            raise ValueError(f"qk_norm_order={qk_norm_order!r}")
        self.cfg = {**LLAMA_DEFAULTS, **config}
        self.w = {k: v.double() for k, v in state.items()}
        self.order = qk_norm_order
        c = self.cfg
        self.C, self.H = c["hidden_size"], c["num_attention_heads"]
        self.K = c.get("num_key_value_heads") or self.H
        self.D = c.get("head_dim") or self.C // self.H
        self.eps, self.theta = float(c["rms_norm_eps"]), float(c["rope_theta"])
        self.qk_norm = bool(c.get("use_qk_norm", True))
        self.L = c["num_hidden_layers"]

    def p(self, name: str) -> Tensor:
        return self.w[name]

    def project(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(q [B,H,T,D], K̂ [B,K,T,D], v [B,K,T,D]) with the norms placed by ``qk_norm_order``."""
        B, T, _ = x.shape
        pre = f"model.layers.{i}.self_attn."
        q = (x @ self.p(pre + "q_proj.weight").T).view(B, T, self.H, self.D).transpose(1, 2)
        k = (x @ self.p(pre + "k_proj.weight").T).view(B, T, self.K, self.D).transpose(1, 2)
        v = (x @ self.p(pre + "v_proj.weight").T).view(B, T, self.K, self.D).transpose(1, 2)
        qn = (lambda t: rms(t, self.p(pre + "q_norm.weight"), self.eps)) if self.qk_norm else (lambda t: t)
        kn = (lambda t: rms(t, self.p(pre + "k_norm.weight"), self.eps)) if self.qk_norm else (lambda t: t)
        q = rope(qn(q), self.theta)
        k = kn(rope(k, self.theta)) if self.order == "sdpa" else rope(kn(k), self.theta)
        return q, k, v

    def attend(self, i: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        B, H, T, D = q.shape
        g = self.H // self.K
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(D)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * D)
        return o @ self.p(f"model.layers.{i}.self_attn.o_proj.weight").T

    def attention(self, i: int, x: Tensor) -> Tensor:
        """Sublayer 0 (with its input_layernorm), no depth mixing."""
        q, k, v = self.project(i, rms(x, self.p(f"model.layers.{i}.input_layernorm.weight"), self.eps))
        return self.attend(i, q, k, v)

    def mlp(self, i: int, x: Tensor) -> Tensor:
        pre = f"model.layers.{i}.mlp."
        h = rms(x, self.p(f"model.layers.{i}.post_attention_layernorm.weight"), self.eps)
        gate, up = h @ self.p(pre + "gate_proj.weight").T, h @ self.p(pre + "up_proj.weight").T
        return (torch.nn.functional.silu(gate) * up) @ self.p(pre + "down_proj.weight").T

    def embed(self, ids: Tensor) -> Tensor:
        return self.p("model.embed_tokens.weight")[ids]

    def head(self, h: Tensor) -> Tensor:
        """model.norm then lm_head (the embedding when tied); ``lm_head_layernorm`` is never used."""
        h = rms(h, self.p("model.norm.weight"), self.eps)
        w = self.w.get("lm_head.weight")
        if w is None and self.cfg["tie_word_embeddings"]:
            w = self.p("model.embed_tokens.weight")
        return h @ w.T


# ----------------------------------------------------------------------------- methods
def _vanilla(t: _Trunk, h: Tensor) -> Tensor:
    for i in range(t.L):
        h = h + t.attention(i, h)
        h = h + t.mlp(i, h)
    return h


def _depth_attention(t: _Trunk, h: Tensor, stride: int, window: int) -> Tensor:
    saved: list[tuple[Tensor, Tensor]] = []  # (K̂_j, Ṽ_j) of every layer
    for i in range(t.L):
        q, k, v = t.project(i, rms(h, t.p(f"model.layers.{i}.input_layernorm.weight"), t.eps))
        cands = depth_candidates(i, stride, window)
        if cands:
            B, H, T, D = q.shape
            qbar = q.view(B, t.K, H // t.K, T, D).mean(2)
            keys = [saved[j][0] for j in cands] + [k]
            values = [saved[j][1] for j in cands] + [v]
            w = torch.stack([(qbar * kj).sum(-1) / math.sqrt(D) for kj in keys], -1).softmax(-1)
            v = sum(w[..., n, None] * vj for n, vj in enumerate(values))
        saved.append((k, v))
        h = h + t.attend(i, q, k, v)
        h = h + t.mlp(i, h)
    return h


def _mhc(t: _Trunk, h: Tensor, n: int, iters: int) -> Tensor:
    B, T, C = h.shape
    X = h[:, :, None, :].expand(B, T, n, C)
    for i in range(t.L):
        for side, sub in (("attn", t.attention), ("mlp", t.mlp)):
            pre = f"model.layers.{i}.{side}_residual_connector."
            x = rms(X.reshape(B, T, n * C), t.p(pre + "mhc_input_norm.weight"), t.eps)
            z = x @ t.p(pre + "mhc_dynamic_projection.weight").T
            zpre, zpost, zres = z[..., :n], z[..., n:2 * n], z[..., 2 * n:].reshape(B, T, n, n)
            hpre = torch.sigmoid(t.p(pre + "alpha_pre") * zpre + t.p(pre + "pre_logits"))
            hpost = 2 * torch.sigmoid(t.p(pre + "alpha_post") * zpost + t.p(pre + "post_logits"))
            hres = sinkhorn_exp(t.p(pre + "alpha_res") * zres + t.p(pre + "residual_logits"), iters)
            out = sub(i, torch.einsum("bts,btsc->btc", hpre, X))
            X = torch.einsum("btij,btjc->btic", hres, X) + hpost[..., None] * out[:, :, None, :]
    w = t.p("model.residual_stream_projector.reduce_logits").softmax(0)
    return torch.einsum("s,btsc->btc", w, X)


def _aggregate(t: _Trunk, prefix: str, completed: list[Tensor], current: Tensor) -> Tensor:
    """softmax over [completed..., current] of (w ⊙ g)·src·rsqrt(mean(src²)+eps), + recency_bias on current."""
    query = t.p(prefix + "pseudo_query") * t.p(prefix + "norm.weight")
    srcs = completed + [current]
    logits = [(s @ query) / torch.sqrt(s.pow(2).mean(-1) + t.eps) for s in srcs]
    logits[-1] = logits[-1] + t.p(prefix + "recency_bias")
    a = torch.stack(logits, -1).softmax(-1)
    return sum(a[..., k, None] * s for k, s in enumerate(srcs))


def _attnres(t: _Trunk, h: Tensor, block_size: int) -> Tensor:
    completed, r, count = [h], h, 0
    for i in range(t.L):
        pre = f"model.layers.{i}."
        r = r + t.attention(i, _aggregate(t, pre + "attnres_attn_aggregator.", completed, r))
        r = r + t.mlp(i, _aggregate(t, pre + "attnres_mlp_aggregator.", completed, r))
        count += 2
        if count >= block_size:  # a snapshot of the running residual at the end of the layer
            completed, count = completed + [r], 0
    return _aggregate(t, "model.attnres_final_aggregator.", completed, r)


def _denseformer(t: _Trunk, h: Tensor, dilation: int, period: int) -> Tensor:
    history = [h]
    for i in range(t.L):
        x = h + t.attention(i, h)
        x = x + t.mlp(i, x)
        history.append(x)
        depth = i + 1
        if depth % period:
            h = x
            continue
        alpha = t.p(f"model.densetransformer_dwa.alphas.{i}")
        idx = range(depth % dilation, depth + 1, dilation)
        if alpha.numel() != len(idx):
            raise ValueError(f"alphas.{i} has {alpha.numel()} entries, the DWA of block {depth} mixes {len(idx)}")
        h = sum(a * history[j] for a, j in zip(alpha, idx))
    return h


def authors_logits(config: Mapping, state: Mapping[str, Tensor], input_ids: Tensor,
                   qk_norm_order: str = "sdpa") -> Tensor:
    """Float64 logits ``[B, T, V]`` of their model for ``config`` (their config.json as a dict) and ``state``
    (their key names; ``lm_head_layernorm.weight`` may be present and is unused)."""
    spec = resolve(config)
    t = _Trunk(config, state, qk_norm_order)
    h = t.embed(input_ids)
    method = spec.pop("method")
    if method == "vanilla":
        h = _vanilla(t, h)
    elif method == "depth_attention":
        h = _depth_attention(t, h, spec["stride"], spec["window"])
    elif method == "mhc":
        h = _mhc(t, h, spec["streams"], spec["iters"])
    elif method == "attnres":
        h = _attnres(t, h, spec["block_size"])
    else:
        h = _denseformer(t, h, spec["dilation"], spec["period"])
    return t.head(h)


def read_folder(folder: str | os.PathLike) -> tuple[dict, dict[str, Tensor]]:
    """(config dict, state dict) of one of their folders: ``model.safetensors`` or shards with an index."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else [
        "model.safetensors"]
    state: dict[str, Tensor] = {}
    for name in files:
        state.update(load_file(str(folder / name)))
    return config, state
