"""Validation of ``DecoderLM.forward`` inputs at the boundary: one ``ValueError`` naming the argument and value.

Shapes and dtypes are checked without touching the data; all value checks (ids in the vocabulary, 0/1 masks,
position range, label range, at least one target) are reduced to one small tensor and read with a single device
synchronisation.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .cache import KVCache
from .config import ModelConfig

IGNORE_INDEX = -100


def _is_int_tensor(x) -> bool:
    return isinstance(x, Tensor) and not x.dtype.is_floating_point and not x.dtype.is_complex and x.dtype != torch.bool


def check_forward_inputs(cfg: ModelConfig, input_ids, attention_mask, position_ids, labels,
                         cache: KVCache | None) -> None:
    """Raise ``ValueError`` for any input ``DecoderLM.forward`` cannot use as given.

    Checked: ``input_ids`` is an integer tensor ``[B, T]`` with B, T >= 1 and ids in ``[0, vocab_size)``;
    ``attention_mask`` is bool/integer 0/1 of shape ``[B, T]`` or ``[B, past + T]``; ``position_ids`` is an integer
    ``[B, T]`` tensor in ``[0, max_position_embeddings)``; ``labels`` is an integer ``[B, T]`` tensor of ids or -100
    with at least one target; ``cache`` matches the model (virtual layers, KV heads, head dim, batch) and has room.
    """
    if not _is_int_tensor(input_ids) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be an integer tensor [B, T], got "
                         f"{getattr(input_ids, 'dtype', type(input_ids).__name__)} of shape "
                         f"{tuple(getattr(input_ids, 'shape', ()))}")
    B, T = input_ids.shape
    if B == 0 or T == 0:
        raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}: it needs at least one row and one token")
    past = 0
    if cache is not None:
        expect = (cfg.num_virtual_layers, B, cfg.num_key_value_heads, cfg.head_dim)
        got = (cache.num_layers, cache.batch_size, cache.k.shape[2], cache.k.shape[4])
        if got != expect:
            raise ValueError(f"cache has (layers, batch, kv heads, head_dim)={got}, the model and input need {expect}")
        past = cache.length
        if past + T > cache.capacity:
            raise ValueError(f"{T} new tokens after {past} cached exceed the cache capacity={cache.capacity}")
    if attention_mask is not None:
        if not isinstance(attention_mask, Tensor) or not (_is_int_tensor(attention_mask)
                                                          or attention_mask.dtype == torch.bool):
            raise ValueError(f"attention_mask must be a bool or integer tensor of 0/1, got "
                             f"{getattr(attention_mask, 'dtype', type(attention_mask).__name__)}")
        if tuple(attention_mask.shape) not in ((B, T), (B, past + T)):
            raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} must be (B, T)=({B}, {T})"
                             f" or (B, past+T)=({B}, {past + T})")
    if position_ids is not None and (not _is_int_tensor(position_ids) or tuple(position_ids.shape) != (B, T)):
        raise ValueError(f"position_ids must be an integer tensor of shape ({B}, {T}), got "
                         f"{getattr(position_ids, 'dtype', type(position_ids).__name__)} "
                         f"{tuple(getattr(position_ids, 'shape', ()))}")
    if labels is not None and (not _is_int_tensor(labels) or tuple(labels.shape) != (B, T)):
        raise ValueError(f"labels must be an integer tensor of input_ids' shape ({B}, {T}), got "
                         f"{getattr(labels, 'dtype', type(labels).__name__)} {tuple(getattr(labels, 'shape', ()))}")

    V = cfg.vocab_size
    checks: dict[str, Tensor] = {"ids": ((input_ids < 0) | (input_ids >= V)).any()}
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        checks["mask"] = ((attention_mask != 0) & (attention_mask != 1)).any()
    if position_ids is not None:
        checks["pos"] = ((position_ids < 0) | (position_ids >= cfg.max_position_embeddings)).any()
    if labels is not None:
        checks["labels"] = (((labels < 0) & (labels != IGNORE_INDEX)) | (labels >= V)).any()
        real = labels[:, 1:] != IGNORE_INDEX
        if attention_mask is not None:
            m = attention_mask[:, -T:].bool()
            real = real & m[:, 1:] & m[:, :-1]
        checks["no_target"] = ~real.any()
    failed = dict(zip(checks, torch.stack(list(checks.values())).tolist()))
    if failed["ids"]:
        bad = input_ids[(input_ids < 0) | (input_ids >= V)][0].item()
        raise ValueError(f"input_ids contains token id {bad} outside the vocabulary [0, {V})")
    if failed.get("mask"):
        raise ValueError("attention_mask must hold only 0 and 1")
    if failed.get("pos"):
        bad = position_ids[(position_ids < 0) | (position_ids >= cfg.max_position_embeddings)][0].item()
        raise ValueError(f"position_ids contains {bad}, outside [0, max_position_embeddings="
                         f"{cfg.max_position_embeddings})")
    if failed.get("labels"):
        bad = labels[((labels < 0) & (labels != IGNORE_INDEX)) | (labels >= V)][0].item()
        raise ValueError(f"labels contains {bad}: labels must be token ids in [0, {V}) or {IGNORE_INDEX}")
    if failed.get("no_target"):
        raise ValueError(f"labels leave no target token (every shifted label is {IGNORE_INDEX} or padding), "
                         f"so the loss is undefined")
