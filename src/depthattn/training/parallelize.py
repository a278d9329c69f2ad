"""Applied from outside the model, in a fixed order: activation checkpointing → compile → DDP / FSDP2.

The model code knows nothing about any of them (house style rule 11). Activation checkpointing is non-reentrant,
so every cross-layer tensor (Depth-Attention sources, residual-seam state) keeps its gradient.
"""

from __future__ import annotations

import torch
from torch import nn

from ..model import DecoderLM


def apply_activation_checkpointing(model: DecoderLM, enabled: bool = True) -> DecoderLM:
    """Recompute each (virtual) layer in the backward pass (``torch.utils.checkpoint``, ``use_reentrant=False``)."""
    model.activation_checkpointing = enabled
    return model


def apply_compile(model: DecoderLM) -> DecoderLM:
    """Compile each physical block with ``torch.compile`` (a handful of graphs: one per candidate-set size)."""
    for i, layer in enumerate(model.model.layers):
        model.model.layers[i] = torch.compile(layer, dynamic=False)
    return model


def parallelize(model: DecoderLM, *, activation_checkpointing: bool = False, compile: bool = False,
                data_parallel: str | None = None) -> nn.Module:
    """Apply the wrappers in order. ``data_parallel``: None, ``"ddp"`` or ``"fsdp"`` (needs an initialised
    process group). Returns the module to train (the wrapper for DDP, the model itself otherwise)."""
    apply_activation_checkpointing(model, activation_checkpointing)
    if compile:
        apply_compile(model)
    if data_parallel is None:
        return model
    if not torch.distributed.is_initialized():
        raise ValueError(f"data_parallel={data_parallel!r} needs torch.distributed initialised (use torchrun)")
    if data_parallel == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    if data_parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model
    raise ValueError(f"data_parallel={data_parallel!r} must be None, 'ddp' or 'fsdp'")
