"""Building the model a run trains: on the meta device, parallelised, then materialised on the run's device.

The model is built on ``meta`` (no memory), wrapped (activation checkpointing, compile, FSDP2 sharding) and only
then given storage (``to_empty``) and initialised, so under FSDP a rank never holds more than its shard of the
model plus one full parameter at a time. Initialisation replays ``DecoderLM.init_weights``' table module by
module, children first, drawing each parameter's *full* tensor from the seeded generator and keeping this rank's
shard: a sharded model starts bit-identical to the same run unsharded (single process or DDP) at any world size.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import ModelConfig
from ..model import DecoderLM, _children_first, init_module_weights


def build_on_meta(cfg: ModelConfig) -> DecoderLM:
    """``DecoderLM(cfg)`` on the meta device (no storage; the tied head stays the embedding's Parameter)."""
    return DecoderLM(cfg, device="meta")


@torch.no_grad()
def materialize(model: DecoderLM, device: torch.device) -> DecoderLM:
    """Give a meta-built (possibly FSDP-sharded) model storage on ``device`` and initialise it (``init_weights``'
    table, in its module order, with the current RNG state). Ties the LM head again after ``to_empty`` (which
    unties it), so ``model.is_tied()`` holds whenever ``tie_word_embeddings`` is set.

    Raises ``ValueError`` if a parameter is still on the meta device afterwards.
    """
    model.to_empty(device=device)
    model.tie_weights()
    for module in _children_first(model):
        if module is not model:
            _init_module(module, model.config)
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise ValueError(f"parameters {left[:3]} are still on the meta device after materialising on {device}")
    return model


def _init_module(module: nn.Module, cfg: ModelConfig) -> None:
    """``init_module_weights`` on ``module``; each sharded (DTensor) parameter is swapped for a full tensor for
    the draw and gets this rank's shard of it afterwards."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    sharded = {name: p for name, p in module._parameters.items() if isinstance(p, DTensor)}
    if not sharded:
        init_module_weights(module, cfg)
        return
    full = {name: nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=p.to_local().device), requires_grad=False)
            for name, p in sharded.items()}
    module._parameters.update(full)
    try:
        init_module_weights(module, cfg)
    finally:
        module._parameters.update(sharded)
    for name, p in sharded.items():
        shard = distribute_tensor(full[name].data, p.device_mesh, p.placements, src_data_rank=None)
        p.to_local().copy_(shard.to_local())
