"""Validation of ``DecoderLM.forward`` inputs: one ``ValueError`` naming the argument and value.

Two halves, so that the hot path never waits for the device:

- ``check_forward_shapes``: types, shapes, cache fit and room, the derived-position bound. Reads no tensor data
  (no device synchronisation); ``DecoderLM.forward`` runs it on every call.
- ``check_forward_values``: ids in the vocabulary, 0/1 masks, position range, label range, at least one target,
  and agreement of a full-width mask with the cache's padding. All reduced to one small tensor and read with a
  single synchronisation. Run once at the boundary, before any work: ``generate``, the evaluation entry points,
  the Hugging Face forward (``check_forward_inputs``), and ``check_token_array`` for the trainer's data.

``check_forward_inputs`` runs both (the boundary check). While ``torch.compile`` or ``torch.export`` traces the
forward (``tracing``), ``check_forward_values`` does nothing: reading a value on the host would graph-break a
compiled forward and cannot be exported at all. Eager calls are always checked.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .cache import KVCache
from .config import ModelConfig

IGNORE_INDEX = -100


def _is_int_tensor(x) -> bool:
    return isinstance(x, Tensor) and not x.dtype.is_floating_point and not x.dtype.is_complex and x.dtype != torch.bool


#: Index dtypes ``nn.Embedding``, ``cross_entropy`` and tensor indexing take as they are.
_INDEX_DTYPES = (torch.int32, torch.int64)


def as_index(x: Tensor | None) -> Tensor | None:
    """An integer tensor of any width or signedness (uint8 ... uint64) as an index tensor: unchanged if int32 /
    int64, else widened to int64 (values were range-checked at the boundary, so nothing wraps). Reads no data."""
    return x if x is None or x.dtype in _INDEX_DTYPES else x.to(torch.int64)


def _wide(x: Tensor) -> Tensor:
    """``x`` as int64 for range comparisons, so that no bound wraps in ``x``'s own dtype (``uint8 >= 512`` would
    compare against 0). uint64 values above int64's range become negative, so they are refused as out of range."""
    return x if x.dtype == torch.int64 else x.to(torch.int64)


def _shown(x: Tensor, value: int) -> int:
    """The value an int64 ``value`` read from ``_wide(x)`` had in ``x`` (uint64 wraps back above 2**63)."""
    return value + (1 << 64) if x.dtype == torch.uint64 and value < 0 else value


def check_text(text, what: str = "prompt") -> None:
    """Raise ``ValueError`` naming ``what`` unless ``text`` is a ``str`` that is valid Unicode text: a lone
    surrogate (what Python makes of bytes that are not UTF-8 in ``sys.argv``, or of a ``"\\ud800"`` JSON escape)
    cannot be encoded, tokenised or printed. Control characters are text and pass."""
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start:e.end]
        raw = bad.encode("utf-8", "surrogateescape") if all(0xDC80 <= ord(c) <= 0xDCFF for c in bad) else None
        what_it_is = (f"byte {raw.hex()} that is not UTF-8" if raw is not None
                      else f"lone surrogate {ascii(bad)}")
        raise ValueError(f"{what} is not valid UTF-8 text: {what_it_is} at character {e.start}") from None


def tracing() -> bool:
    """Whether ``torch.compile`` (dynamo) or ``torch.export`` is tracing the caller (then no value is read)."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def check_forward_inputs(cfg: ModelConfig, input_ids, attention_mask, position_ids, labels,
                         cache: KVCache | None, document_ids=None, inputs_embeds=None) -> None:
    """The boundary check: ``check_forward_shapes`` then ``check_forward_values`` (one device synchronisation;
    none while ``tracing``)."""
    check_forward_shapes(cfg, input_ids, attention_mask, position_ids, labels, cache, document_ids, inputs_embeds)
    check_forward_values(cfg, input_ids, attention_mask, position_ids, labels, cache, inputs_embeds)


def _check_tokens(cfg: ModelConfig, input_ids, inputs_embeds) -> tuple[int, int]:
    """``(B, T)`` of exactly one of ``input_ids`` (integer ``[B, T]``) and ``inputs_embeds`` (floating
    ``[B, T, hidden_size]``), B, T >= 1; else ``ValueError`` naming the argument."""
    if inputs_embeds is not None:
        if input_ids is not None:
            raise ValueError("give exactly one of input_ids and inputs_embeds, not both")
        if not isinstance(inputs_embeds, Tensor) or not inputs_embeds.dtype.is_floating_point \
                or inputs_embeds.dim() != 3 or inputs_embeds.shape[2] != cfg.hidden_size:
            raise ValueError(f"inputs_embeds must be a floating tensor [B, T, hidden_size={cfg.hidden_size}], got "
                             f"{getattr(inputs_embeds, 'dtype', type(inputs_embeds).__name__)} of shape "
                             f"{tuple(getattr(inputs_embeds, 'shape', ()))}")
        name, shape = "inputs_embeds", tuple(inputs_embeds.shape)
    else:
        if not _is_int_tensor(input_ids) or input_ids.dim() != 2:
            raise ValueError(f"input_ids must be an integer tensor [B, T], got "
                             f"{getattr(input_ids, 'dtype', type(input_ids).__name__)} of shape "
                             f"{tuple(getattr(input_ids, 'shape', ()))}")
        name, shape = "input_ids", tuple(input_ids.shape)
    B, T = shape[:2]
    if B == 0 or T == 0:
        raise ValueError(f"{name} has shape {shape}: it needs at least one row and one token")
    return B, T


def check_forward_shapes(cfg: ModelConfig, input_ids, attention_mask, position_ids, labels,
                         cache: KVCache | None, document_ids=None, inputs_embeds=None) -> None:
    """Raise ``ValueError`` for inputs whose types or shapes ``DecoderLM.forward`` cannot use; reads no data.

    Checked: exactly one of ``input_ids`` (an integer tensor ``[B, T]``) and ``inputs_embeds`` (a floating tensor
    ``[B, T, hidden_size]``, ``Backbone.forward`` only), with B, T >= 1; ``attention_mask`` is bool/integer of
    shape ``[B, T]`` or ``[B, past + T]``; ``position_ids`` is an integer ``[B, T]`` tensor; ``labels`` is an integer
    ``[B, T]`` tensor; ``cache`` matches the model (virtual layers, KV heads, head dim, batch) and has room; without
    ``position_ids``, ``past + T`` slots fit ``max_position_embeddings`` (derived positions stay below the slot
    count, so this bounds them without reading the mask); ``document_ids`` is an integer ``[B, T]`` tensor and comes
    without a ``cache`` (document masking is a training-time feature). Any integer values are valid document ids.
    """
    B, T = _check_tokens(cfg, input_ids, inputs_embeds)
    past = 0
    if cache is not None:
        expect = (cfg.num_virtual_layers, B, cfg.num_key_value_heads, cfg.head_dim)
        got = (cache.num_layers, cache.batch_size, cache.k.shape[2], cache.k.shape[4])
        if got != expect:
            raise ValueError(f"cache has (layers, batch, kv heads, head_dim)={got}, the model and input need {expect}")
        past = cache.length
        cache.check_room(T)
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
    if position_ids is None and past + T > cfg.max_position_embeddings:
        raise ValueError(f"the sequence reaches position {past + T - 1}, beyond max_position_embeddings="
                         f"{cfg.max_position_embeddings}")
    if document_ids is not None and (not _is_int_tensor(document_ids) or tuple(document_ids.shape) != (B, T)):
        raise ValueError(f"document_ids must be an integer tensor of shape ({B}, {T}), got "
                         f"{getattr(document_ids, 'dtype', type(document_ids).__name__)} "
                         f"{tuple(getattr(document_ids, 'shape', ()))}")
    if document_ids is not None and cache is not None:
        raise ValueError("document_ids cannot be combined with a KV cache: document masking is a training-time "
                         "feature (run packed documents without cache=, or generate each document on its own)")
    if labels is not None and (not _is_int_tensor(labels) or tuple(labels.shape) != (B, T)):
        raise ValueError(f"labels must be an integer tensor of input_ids' shape ({B}, {T}), got "
                         f"{getattr(labels, 'dtype', type(labels).__name__)} {tuple(getattr(labels, 'shape', ()))}")


def check_forward_values(cfg: ModelConfig, input_ids: Tensor | None, attention_mask: Tensor | None,
                         position_ids: Tensor | None, labels: Tensor | None, cache: KVCache | None,
                         inputs_embeds: Tensor | None = None) -> None:
    """Raise ``ValueError`` for values ``DecoderLM.forward`` cannot use (inputs of valid shape; one sync). Does
    nothing while ``tracing`` (compiled or exported forwards run unchecked; eager calls are checked).

    Checked: ids in ``[0, vocab_size)`` (compared in int64, so no bound wraps in a narrow dtype such as uint8; no
    ids with ``inputs_embeds``, whose values are not checked); an integer mask holds only 0/1, and no row of it is all zeros (a sequence without a real token); ``position_ids`` in
    ``[0, max_position_embeddings)``; labels are ids or -100 with at least one target; a ``[B, past + T]`` mask
    agrees with the padding the cache recorded for its first ``past`` columns.
    """
    if tracing():
        return
    V = cfg.vocab_size
    T = (input_ids if input_ids is not None else inputs_embeds).shape[1]
    past = cache.length if cache is not None else 0
    checks: dict[str, Tensor] = {}
    if input_ids is not None:
        ids = _wide(input_ids)
        checks["ids"] = ((ids < 0) | (ids >= V)).any()
    if attention_mask is not None:
        mask = _wide(attention_mask) if attention_mask.dtype != torch.bool else attention_mask
        if attention_mask.dtype != torch.bool:
            checks["mask"] = ((mask != 0) & (mask != 1)).any()
        real_row = mask.bool().any(dim=1)
        if cache is not None and past > 0 and attention_mask.shape[1] == T:  # the past columns are the cache's
            real_row = real_row | cache.key_mask[:, :past].any(dim=1)
        checks["empty_row"] = ~real_row.all()
    if attention_mask is not None and cache is not None and past > 0 and attention_mask.shape[1] == past + T:
        checks["cache_mask"] = (attention_mask[:, :past].bool() != cache.key_mask[:, :past]).any()
    if position_ids is not None:
        pos = _wide(position_ids)
        checks["pos"] = ((pos < 0) | (pos >= cfg.max_position_embeddings)).any()
    if labels is not None:
        lab = _wide(labels)
        checks["labels"] = (((lab < 0) & (lab != IGNORE_INDEX)) | (lab >= V)).any()
        real = lab[:, 1:] != IGNORE_INDEX
        if attention_mask is not None:
            m = attention_mask[:, -T:].bool()
            real = real & m[:, 1:] & m[:, :-1]
        checks["no_target"] = ~real.any()
    if not checks:
        return
    failed = dict(zip(checks, torch.stack(list(checks.values())).tolist()))
    if failed.get("ids"):
        bad = _shown(input_ids, ids[(ids < 0) | (ids >= V)][0].item())
        raise ValueError(f"input_ids contains token id {bad} outside the vocabulary [0, {V})")
    if failed.get("mask"):
        raise ValueError("attention_mask must hold only 0 and 1")
    if failed.get("empty_row"):
        row = int((~real_row).nonzero()[0, 0])
        raise ValueError(f"attention_mask row {row} is all zeros: that sequence has no real token (drop the row, "
                         f"or give it at least one token with mask 1)")
    if failed.get("cache_mask"):
        raise ValueError("attention_mask's first past columns disagree with the cached padding mask")
    if failed.get("pos"):
        bad = _shown(position_ids, pos[(pos < 0) | (pos >= cfg.max_position_embeddings)][0].item())
        raise ValueError(f"position_ids contains {bad}, outside [0, max_position_embeddings="
                         f"{cfg.max_position_embeddings})")
    if failed.get("labels"):
        bad = _shown(labels, lab[((lab < 0) & (lab != IGNORE_INDEX)) | (lab >= V)][0].item())
        raise ValueError(f"labels contains {bad}: labels must be token ids in [0, {V}) or {IGNORE_INDEX}")
    if failed.get("no_target"):
        raise ValueError(f"labels leave no target token (every shifted label is {IGNORE_INDEX} or padding), "
                         f"so the loss is undefined")


_SCAN_CHUNK = 1 << 24  # token ids per min/max pass of check_token_array (64 MiB at int32)


def check_token_array(tokens, vocab_size: int, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` if a 1-D token array (numpy, memmap or tensor) holds an id outside
    ``[0, vocab_size)``: the one value check of token data that is fed to the model without further checks
    (training windows, evaluation splits). One pass over the array, in chunks of ``_SCAN_CHUNK`` ids per shard of
    a multi-shard split (``parts``), so a corpus larger than memory is scanned without being loaded whole."""
    if isinstance(tokens, Tensor):
        parts = [tokens.numpy()]
    else:
        parts = list(getattr(tokens, "parts", None) or [tokens])
    lo = hi = None
    for part in parts:
        for i in range(0, len(part), _SCAN_CHUNK):
            chunk = np.asarray(part[i:i + _SCAN_CHUNK])
            if chunk.size:
                c_lo, c_hi = int(chunk.min()), int(chunk.max())
                lo = c_lo if lo is None else min(lo, c_lo)
                hi = c_hi if hi is None else max(hi, c_hi)
    if lo is None:
        return
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{where} contains token id {bad} outside the vocabulary [0, {vocab_size})")
