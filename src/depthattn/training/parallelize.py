"""Applied from outside the model, in a fixed order: activation checkpointing → compile → DDP / FSDP2.

The model code knows nothing about any of them (house style rule 11). Activation checkpointing is non-reentrant,
so every cross-layer tensor (Depth-Attention sources, residual-seam state) keeps its gradient.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ..model import DecoderLM


def apply_activation_checkpointing(model: DecoderLM, enabled: bool = True) -> DecoderLM:
    """Recompute each (virtual) layer in the backward pass (``torch.utils.checkpoint``, ``use_reentrant=False``)."""
    model.activation_checkpointing = enabled
    return model


def compile_units(model: DecoderLM) -> list[tuple[str, int]]:
    """What ``apply_compile`` compiles, as (unit, distinct signatures): the bound on its dynamo graphs.

    A block whose residual-seam state has a fixed shape (``none``, ``depth_attention``, ``mhc``) is compiled whole;
    its signatures are the distinct Depth-Attention candidate-set sizes (one for the other methods). A block whose
    seam state grows with depth (DenseFormer's history, AttnRes's block sums: the layer module says so with
    ``state_grows_with_depth``) would need a graph per layer, so only its two sublayer bodies (norm + attention,
    norm + MLP), whose signatures are the candidate-set sizes and one, are compiled and the seam's mixing runs
    eagerly between them.
    """
    sizes = len({len(c) for c in model.plan})
    if any(_grows(layer) for layer in model.model.layers):
        return [("attention_sublayer", sizes), ("mlp_sublayer", 1)]
    return [("block", sizes)]


def _grows(layer: nn.Module) -> bool:
    return bool(getattr(layer.cross_layer, "state_grows_with_depth", False))


def check_compiler(device: torch.device) -> None:
    """Refuse ``compile`` in one line where inductor cannot work: no C++ compiler on CPU, no Triton on CUDA."""
    import importlib.util
    import shutil

    if device.type == "cuda":
        if importlib.util.find_spec("triton") is None:
            raise ValueError("TrainConfig.compile=true: torch.compile's inductor backend needs the triton package on "
                             "CUDA, which is not installed; install triton or set compile=false")
        return
    cxx = os.environ.get("CXX", "g++")
    if not any(shutil.which(c) for c in (cxx, "g++", "clang++", "c++")):
        raise ValueError(f"TrainConfig.compile=true: torch.compile's inductor backend needs a C++ compiler on CPU "
                         f"(looked for {cxx}, g++, clang++, c++ on PATH); install one or set compile=false")


def apply_compile(model: DecoderLM, backend: str = "inductor") -> DecoderLM:
    """Compile the blocks in place (``nn.Module.compile`` / a compiled bound method on the instance), so parameter
    names and state-dict keys never change and compiled runs save, resume and load strictly.

    Graphs are shared by all blocks of one signature (``compile_units``), whatever the depth; dynamo's recompile
    limit is raised to that bound (at least its default) so no block silently falls back to eager.
    """
    import torch._dynamo

    bound = max(n for _, n in compile_units(model))
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, bound + 1)
    for layer in model.model.layers:
        if _grows(layer):
            layer.attention_sublayer = torch.compile(layer.attention_sublayer, backend=backend, dynamic=False)
            layer.mlp_sublayer = torch.compile(layer.mlp_sublayer, backend=backend, dynamic=False)
        else:
            layer.compile(backend=backend, dynamic=False)
    return model


def apply_fsdp(model: DecoderLM, param_dtype: torch.dtype | None = None, replicate: int = 1) -> DecoderLM:
    """FSDP2: ``fully_shard`` each block, then the root (embedding, final norm, LM head, model-level seam modules).

    ``param_dtype=torch.bfloat16``: ``MixedPrecisionPolicy`` with bf16 parameters in forward/backward and float32
    gradient reduction (the sharded master weights and AdamW states stay float32). ``replicate > 1``: HSDP, a
    (replicate × shard) device mesh, shards within groups of ``world_size / replicate`` ranks (one node) and
    replicates across them. Works on a meta-built model (``build.materialize`` afterwards). Raises ``ValueError`` if
    ``replicate`` does not divide the world size.
    """
    import warnings

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # A block returns its (K̂, Ṽ) as views; nothing modifies them in place, so FSDP2's warning does not apply.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")

    world = torch.distributed.get_world_size()
    if replicate < 1 or world % replicate:
        raise ValueError(f"TrainConfig.fsdp_replicate={replicate} must divide the world size {world}")
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if replicate > 1:
        mesh = init_device_mesh(device_type, (replicate, world // replicate), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else None
    kwargs = {"mesh": mesh, **({"mp_policy": mp} if mp else {})}
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def parallelize(model: DecoderLM, *, activation_checkpointing: bool = False, compile: bool = False,
                data_parallel: str | None = None, param_dtype: torch.dtype | None = None,
                replicate: int = 1) -> nn.Module:
    """Apply the wrappers in order. ``data_parallel``: None, ``"ddp"`` or ``"fsdp"`` (needs an initialised
    process group; ``param_dtype`` and ``replicate`` as ``apply_fsdp``). Returns the module to train (the wrapper
    for DDP, the model itself otherwise). A meta-built model can take every step but DDP (``build.materialize``
    first)."""
    apply_activation_checkpointing(model, activation_checkpointing)
    if compile:
        device = next(model.parameters()).device
        check_compiler(torch.device("cuda" if device.type == "meta" and torch.cuda.is_available() else
                                    "cpu" if device.type == "meta" else device))
        apply_compile(model)
    if data_parallel is None:
        return model
    if not torch.distributed.is_initialized():
        raise ValueError(f"data_parallel={data_parallel!r} needs torch.distributed initialised (use torchrun)")
    if data_parallel == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    if data_parallel == "fsdp":
        return apply_fsdp(model, param_dtype, replicate)
    raise ValueError(f"data_parallel={data_parallel!r} must be None, 'ddp' or 'fsdp'")
