"""Analytical costs of a config: parameters, forward FLOPs per token and KV-cache bytes per token.

Formulas: spec-depth-attention.md §8 (Depth-Attention extra) and spec-baselines.md §1 (the vanilla denominator
F_vanilla ≈ 2 · (non-embedding parameters + vocab_size · hidden_size), a multiply-add counted as 2 FLOPs).
A cross-layer method's extra parameters, FLOPs and in-flight elements come from its record
(``depthattn.cross_layer``; formulas: spec-baselines.md §3, §5, §6 and docs/methods.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import cross_layer
from .config import ModelConfig


def layer_params(cfg: ModelConfig) -> int:
    """Parameters of one vanilla block: q, k, v, o, q/k norms, SwiGLU, two RMSNorms."""
    C, H, K, D, F = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size
    return C * H * D + 2 * C * K * D + H * D * C + 2 * D + 3 * C * F + 2 * C


def non_embedding_params(cfg: ModelConfig) -> int:
    """Vanilla parameters outside the embedding and LM head: blocks plus the final norm."""
    return cfg.num_hidden_layers * layer_params(cfg) + cfg.hidden_size


def num_params(cfg: ModelConfig) -> int:
    """Total parameters of ``DecoderLM(cfg)`` (tied weights counted once), including the method's extras."""
    embed = cfg.vocab_size * cfg.hidden_size
    head = 0 if cfg.tie_word_embeddings else embed
    return embed + head + non_embedding_params(cfg) + cross_layer.get(cfg.cross_layer).extra_params(cfg)


def attention_flops(cfg: ModelConfig, keys_per_query: float) -> float:
    """Sequence-attention FLOPs per token: 4 · L · H · D per attended key (scores and weighted sum)."""
    return 4.0 * cfg.num_virtual_layers * cfg.num_attention_heads * cfg.head_dim * keys_per_query


@dataclass
class FlopReport:
    """Forward FLOPs per token. ``extra`` is the cross-layer method's term; ratios are ``extra / base``."""

    vanilla: float            # 2 · (N_non-embedding + V · C), blocks counted once per loop; LM head included
    attention: float          # sequence attention at ``seq_len`` (causal mean of (T+1)/2 keys)
    extra: float              # the method's added FLOPs
    seq_len: int

    @property
    def ratio(self) -> float:
        return self.extra / self.vanilla

    @property
    def ratio_with_attention(self) -> float:
        return self.extra / (self.vanilla + self.attention)

    @property
    def total(self) -> float:
        return self.vanilla + self.attention + self.extra


def num_flops(cfg: ModelConfig, seq_len: int = 2048) -> FlopReport:
    """Analytical forward FLOPs per token for ``cfg`` at training length ``seq_len`` (spec §8 table)."""
    vanilla = 2.0 * (cfg.num_virtual_layers * layer_params(cfg) + cfg.hidden_size + cfg.vocab_size * cfg.hidden_size)
    extra = float(cross_layer.get(cfg.cross_layer).extra_flops(cfg))  # Depth-Attention: spec §8
    return FlopReport(vanilla, attention_flops(cfg, (seq_len + 1) / 2), extra, seq_len)


def kv_cache_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype = torch.bfloat16) -> int:
    """``2 · L_virtual · K · D · itemsize``: identical for every method (the value slot holds Ṽ for Depth-Attention)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_virtual_layers * cfg.num_key_value_heads * cfg.head_dim * itemsize


def inflight_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype = torch.bfloat16) -> int:
    """Residual-state elements a token carries through depth × itemsize (spec-baselines.md §7): C for vanilla and
    Depth-Attention, (L + 1)·C DenseFormer, n·C mHC, (largest source list)·C AttnRes. A prefill chunk of T tokens
    holds T times this."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return cross_layer.get(cfg.cross_layer).inflight_elements(cfg) * itemsize
