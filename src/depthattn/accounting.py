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


# ------------------------------------------------------------------------------------------------------------------
# memory: what an allocation needs against what the device has, checked before anything is built

#: cgroup files of the memory limit and usage (v2, then v1): a container's limit is what the kernel enforces.
_CGROUP_MEMORY = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                  ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):  # absent, "max" (no limit), unreadable
        return None


def available_memory(device: torch.device | str = "cpu") -> int | None:
    """Bytes that can still be allocated on ``device``: for CUDA the free memory ``torch.cuda.mem_get_info``
    reports; for the CPU ``MemAvailable`` of ``/proc/meminfo``, lowered to the cgroup's limit minus its usage when
    the process runs in a memory-limited container. None where it cannot be known (another device or OS)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    known = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            known += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in _CGROUP_MEMORY:
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 1 << 60:
            known.append(max(0, limit - usage))
            break
    return min(known) if known else None


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3g} GiB"


def check_fits(nbytes: int, what: str, device: torch.device | str, fix: str) -> None:
    """Refuse an allocation of ``nbytes`` that exceeds :func:`available_memory` of ``device`` before it is tried:
    one ``ValueError`` "``what`` needs N GiB, more than the M GiB available on ``device``; ``fix``". Nothing is
    checked where the available memory is unknown. Only what cannot fit at all is refused (no headroom is kept)."""
    free = available_memory(device)
    if free is not None and nbytes > free:
        raise ValueError(f"{what} needs {_gib(nbytes)}, more than the {_gib(free)} of memory available on "
                         f"{torch.device(device)}; {fix}")


def check_model_fits(cfg: ModelConfig, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                     source: str = "the model") -> None:
    """:func:`check_fits` for the parameters of ``DecoderLM(cfg)`` in ``dtype`` (:func:`num_params`), before it is
    built; ``source`` names the checkpoint or config in the message."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    check_fits(num_params(cfg) * itemsize, f"{source}: {num_params(cfg):.3g} parameters in {str(dtype)[6:]}",
               device, "use a machine with more memory, or check the config's sizes")


def kv_cache_bytes(cfg: ModelConfig, batch_size: int, max_seq_len: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of ``KVCache.empty(cfg, batch_size, max_seq_len, dtype)``: K and V for every virtual layer, plus the
    one-byte slot mask ``[B, S]``."""
    return batch_size * max_seq_len * (kv_cache_bytes_per_token(cfg, dtype) + 1)
