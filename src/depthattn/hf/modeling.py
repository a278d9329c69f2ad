"""``DepthAttnForCausalLM``: a thin ``PreTrainedModel`` + ``GenerationMixin`` shell around the core's modules.

Legend: B batch, T time (this call), S cache slots, V vocab.

No model code lives here. Like ``Qwen3ForCausalLM``, the wrapper owns the core ``Backbone`` as ``model`` (HF
``Qwen3Model``'s place) and an ``lm_head``, and its forward is ``self.model(...)`` then ``self.lm_head``, so the
state dict holds exactly the core's keys (``model.*``, ``lm_head.*``, the Hugging Face Qwen3 names) and a
``cross_layer="none"`` export is a valid Qwen3 checkpoint. The RoPE frequencies live in ``model.rotary_emb``
(a non-persistent float32 buffer, recomputed by ``_init_weights`` after ``from_pretrained``).

The cache transformers sees is ``DepthAttnCache``, a ``transformers.Cache`` that owns one core ``KVCache`` and grows
it on demand. It stores what the core stores: keys and the depth-mixed values Ṽ (spec-depth-attention.md §7.1),
vanilla-sized. Beam search reorders it generically (``reorder_cache``), and it can be cropped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

from depthattn import checkpoint as core_checkpoint
from depthattn.accounting import check_fits, kv_cache_bytes
from depthattn.cache import KVCache
from depthattn.checks import IGNORE_INDEX, check_forward_inputs
from depthattn.config import ModelConfig
from depthattn.fileio import file_states, rewrite_manifest_entries
from depthattn.functional import packed_document_ids
from depthattn.model import Backbone, DecoderLM, init_module_weights, next_token_loss, next_token_targets

from .configuration import DepthAttnConfig


class DepthAttnCache(Cache):
    """A ``transformers.Cache`` backed by one growing ``depthattn.KVCache`` (K̂ and Ṽ per virtual layer).

    The model calls ``core_for(batch_size, new_tokens)`` before each forward; the first call allocates, later calls
    double the capacity when needed (copying the filled slots). ``update`` is not used: the core writes its own slots.
    """

    is_compileable = False

    def __init__(self, config: DepthAttnConfig | None = None, initial_capacity: int = 64):
        super().__init__(layers=[])
        self.config = config
        self.initial_capacity = initial_capacity
        self.kv: KVCache | None = None

    # ------------------------------------------------------------------ growth
    def core_for(self, model_config, batch_size: int, new_tokens: int, dtype: torch.dtype,
                 device: torch.device) -> KVCache:
        """The core cache, with room for ``new_tokens`` more tokens per row."""
        kv = self.kv
        if kv is None or kv.length + new_tokens > kv.capacity:
            cap = max(self.initial_capacity, new_tokens) if kv is None else max(2 * kv.capacity, kv.length + new_tokens)
            check_fits(kv_cache_bytes(model_config, batch_size, cap, dtype), f"the KV cache for {batch_size} × {cap} "
                       f"tokens over {model_config.num_virtual_layers} virtual layers", device,
                       "lower max_new_tokens or the batch")
        if kv is None:
            self.kv = KVCache(model_config.num_virtual_layers, batch_size, model_config.num_key_value_heads,
                              model_config.head_dim, cap, dtype=dtype, device=device)
            return self.kv
        if kv.length + new_tokens > kv.capacity:
            cap = max(2 * kv.capacity, kv.length + new_tokens)
            L, B, K, _, D = kv.k.shape
            grown = KVCache(L, B, K, D, cap, dtype=kv.k.dtype, device=kv.k.device)
            n = kv.length
            grown.k[:, :, :, :n] = kv.k[:, :, :, :n]
            grown.v[:, :, :, :n] = kv.v[:, :, :, :n]
            grown.key_mask[:, :n] = kv.key_mask[:, :n]
            grown.length = n
            self.kv = grown
        return self.kv

    # ------------------------------------------------------------------ the Cache interface generate() uses
    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        raise NotImplementedError("DepthAttnCache is written by the depthattn core, not through update()")

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.kv is None else self.kv.length

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1  # grows without bound (the model checks max_position_embeddings)

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.kv is not None:
            self.kv.reorder(beam_idx.to(self.kv.k.device))

    def batch_select_indices(self, indices: Tensor) -> None:
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.kv is not None:
            index = torch.arange(self.kv.batch_size, device=self.kv.k.device).repeat_interleave(repeats)
            self.kv.reorder(index)

    def crop(self, tokens_to_remove: int) -> None:
        """transformers 5.24 semantics (``DynamicLayer.crop``): a negative value removes that many tokens from the
        end (all of them when it is at least the current length), 0 is a no-op, and a positive value raises
        ``ValueError`` (the legacy "new length" form is not supported)."""
        if tokens_to_remove > 0:
            raise ValueError(
                f"Calling `crop` with a positive value (`{tokens_to_remove}`) is not supported. "
                "Please use a negative integer to remove that number of tokens from the cache instead.")
        if tokens_to_remove == 0 or self.kv is None:
            return
        self.kv.crop(max(0, self.kv.length - abs(tokens_to_remove)))

    def reset(self) -> None:
        if self.kv is not None:
            self.kv.reset()

    @property
    def is_initialized(self) -> bool:
        return self.kv is not None

    @property
    def is_croppable(self) -> bool:
        return True

    @property
    def is_sliding(self) -> list[bool]:
        return [False] * (0 if self.kv is None else self.kv.num_layers)

    @property
    def is_linear(self) -> list[bool]:
        return [False] * (0 if self.kv is None else self.kv.num_layers)

    @property
    def is_dummy(self) -> list[bool]:
        return [False] * (0 if self.kv is None else self.kv.num_layers)

    def __len__(self) -> int:
        return 0 if self.kv is None else self.kv.num_layers

    def __repr__(self) -> str:
        return f"DepthAttnCache(length={self.get_seq_length()}, capacity={0 if self.kv is None else self.kv.capacity})"


@dataclass
class DepthAttnCausalLMOutputWithPast(CausalLMOutputWithPast):
    """``CausalLMOutputWithPast`` (``loss``, ``logits``, ``cache``, ``hidden_states``, ``attentions``) plus
    ``depth_weights``: with ``output_depth_weights=True`` on a model whose method mixes values by Depth-Attention's
    softmax (``cross_layer="depth_attention"``), one entry per virtual layer u: the float32 ``[B, K, T, N]`` softmax
    over the N candidates ``model.model.plan[u] + (u,)`` (self last) that each KV head's pooled query puts on them
    (the weights ``depthattn analyze`` averages), or None for a layer without sources (layer 0); None when no layer
    has any (every other method: their mix, if any, has no such weights) and when not asked."""

    depth_weights: tuple[Tensor | None, ...] | None = None


class DepthAttnPreTrainedModel(PreTrainedModel):
    config_class = DepthAttnConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules = ["DecoderLayer"]
    _supports_sdpa = True

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """``PreTrainedModel.from_pretrained`` after two checks on a local folder, before anything is built:
        its ``config.json`` must say ``model_type="depthattn"`` (or be the previous flat depthattn format), and the
        shapes that config (with the ``config=`` or field overrides given) needs must match the safetensors
        header; a tied config with a different stored ``lm_head.weight`` is refused as the core refuses it. Each
        failure is one ``ValueError`` naming the file."""
        path = pretrained_model_name_or_path
        if isinstance(path, (str, os.PathLike)) and os.path.isfile(os.path.join(os.fspath(path), "config.json")):
            folder = os.fspath(path)
            config = kwargs.get("config")
            if isinstance(config, DepthAttnConfig):
                cfg = config.to_model_config()
            else:
                cfg = core_checkpoint.load_config(folder)  # refuses another model_type in one line
                names = {f for f in ModelConfig.__dataclass_fields__}
                overrides = {k: v for k, v in kwargs.items() if k in names}
                if overrides:
                    cfg = cfg.replace(**overrides)
            core_checkpoint.check_folder_shapes(folder, cfg)
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """``PreTrainedModel.save_pretrained``, then, in a folder that has our ``checksums.json`` (a checkpoint or
        export saved into again), the entries of the files it wrote or removed are rewritten
        (``fileio.rewrite_manifest_entries``), so the folder still verifies on load; files it did not touch keep
        their recorded digests."""
        before = file_states(save_directory)
        out = super().save_pretrained(save_directory, *args, **kwargs)
        rewrite_manifest_entries(save_directory, before)
        return out

    @torch.no_grad()
    def _init_weights(self, module):
        """One module of the core's ``DecoderLM.init_weights`` table (``depthattn.model.init_module_weights``).

        transformers calls this module by module, children first: on a new model for every module (so
        ``DepthAttnForCausalLM(config)`` draws exactly what ``DecoderLM(config)`` draws), and after
        ``from_pretrained`` only for modules with a tensor it did not load: a method's parameters when a vanilla
        checkpoint is loaded with ``cross_layer="mhc"``, and always ``model.rotary_emb``, whose non-persistent
        ``inv_freq`` transformers re-creates uninitialised off the meta device. Tensors that were loaded
        (``_is_hf_initialized``) are never overwritten.
        """
        if isinstance(module, PreTrainedModel):
            return
        # the seam modules write in place (zero_/fill_/copy_), so keep whatever was loaded under them
        loaded = [(p, p.detach().clone()) for p in module.parameters() if getattr(p, "_is_hf_initialized", False)]
        init_module_weights(module, self.config.to_model_config())
        for p, value in loaded:
            p.copy_(value)


class DepthAttnForCausalLM(DepthAttnPreTrainedModel, GenerationMixin):
    """Hugging Face causal LM: the core ``Backbone`` (``model``) and ``lm_head``, as in ``depthattn.DecoderLM``.

    ``forward(input_ids [B,T] int64, attention_mask [B,T] or [B,S+T] 0/1, position_ids [B,T], cache, labels [B,T],
    use_cache, logits_to_keep, document_ids [B,T], output_hidden_states, output_attentions, output_depth_weights)``
    → ``DepthAttnCausalLMOutputWithPast(loss, logits [B,T',V], cache, hidden_states, attentions, depth_weights)``.
    With L = ``num_virtual_layers`` (``num_hidden_layers`` × ``num_loops``: a looped model reports per virtual
    layer), each output asked for by its argument or, when that is None, the config attribute of the same name
    (``Backbone.forward``'s ``record`` computes them):

    - ``output_hidden_states=True``: L + 1 tensors ``[B, T, C]``: the embedding output, the hidden state after each
      layer, the last one after the final norm (the ``lm_head`` input), as ``Qwen3ForCausalLM``. After layer u it
      is what the method's readout makes of its state there (the input the final norm would get if the model
      stopped after u: logit lens = ``lm_head(model.norm(h))``): the residual stream for ``none`` and the
      value-seam methods, DenseFormer's mixed output, the readout of mHC's n streams, AttnRes's final depth mix
      over the blocks so far. An int or a list of ints (negative from the end) selects entries, the others are None.
    - ``output_attentions=True``: L tensors ``[B, H, T, S]``, each layer's sequence-attention probabilities over
      its S = past + T key slots (the cache's and this call's). The forward then runs the explicit-softmax attention
      (``functional.eager_attention``, equal to SDPA to rounding) whatever ``attn_implementation`` says; the default
      forward is untouched.
    - ``output_depth_weights=True``: ``depth_weights`` (``DepthAttnCausalLMOutputWithPast``); None for a method
      without Depth-Attention's softmax.

    Packed documents (``DecoderLM.forward``'s ``document_ids``) are given as ``document_ids`` or, Hugging Face's
    convention, as restarting ``position_ids`` without an ``attention_mask`` (``packed_documents``); either with a
    cache (or ``use_cache=True``) is a ``ValueError``, and the cache is not made by default then. ``past_key_values`` is
    accepted as the pre-5.24 name of ``cache``. ``num_items_in_batch`` (passed by the HF ``Trainer``) turns the loss
    into the summed next-token loss over that count (``summed_over``); ``shift_labels`` (already-shifted targets,
    checked as ``labels`` are) replace the shifted ``labels`` (``causal_lm_loss``); as in transformers, a loss needs
    ``labels``. ``return_dict=False`` (or ``config.return_dict=False``) returns the output's non-None fields as a
    tuple, loss first. Errors are the core's ``ValueError``s (ids
    outside the vocabulary, positions beyond ``max_position_embeddings``, bad masks), plus ``ValueError`` for a cache
    that is not a ``DepthAttnCache`` holding tokens (a ``DynamicCache`` cannot hold our depth sources' layout).
    """

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    #: ``forward`` honours ``num_items_in_batch`` (the HF ``Trainer``'s gradient-accumulation normaliser).
    accepts_loss_kwargs = True

    def __init__(self, config: DepthAttnConfig):
        super().__init__(config)
        cfg = config.to_model_config()
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        else:
            self._tied_weights_keys = {}
        self.post_init()

    @classmethod
    def from_core(cls, core: DecoderLM, **config_kwargs) -> "DepthAttnForCausalLM":
        """Wrap an existing ``DecoderLM``: the wrapper's ``model`` and ``lm_head`` are the core's own modules (shares
        its parameters; nothing is copied). ``config_kwargs`` set HF-only config fields (``eos_token_id``, ...)."""
        cfg = DepthAttnConfig.from_model_config(core.config, **config_kwargs)
        with torch.device("meta"):  # built without allocating or drawing anything, then given the core's modules
            wrapper = cls(cfg)
        wrapper.model, wrapper.lm_head = core.model, core.lm_head
        return wrapper

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def resize_token_embeddings(self, *args, **kwargs):
        """``PreTrainedModel.resize_token_embeddings`` (grow or shrink; a tied head follows the embedding), then
        the core config's ``vocab_size`` follows the new embedding, so the forward accepts exactly the new ids."""
        out = super().resize_token_embeddings(*args, **kwargs)
        self.model.config = self.model.config.replace(vocab_size=self.model.embed_tokens.num_embeddings)
        return out

    def get_output_embeddings(self):
        return self.lm_head

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        """Give ``generate()`` a ``DepthAttnCache`` instead of transformers' default ``DynamicCache``."""
        if model_kwargs.get("cache") is None and model_kwargs.get("past_key_values") is None \
                and generation_config.use_cache is not False:
            model_kwargs["cache"] = DepthAttnCache(self.config)
            return
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, cache: Cache | None = None, labels: Tensor | None = None,
                use_cache: bool | None = None, logits_to_keep: int | Tensor = 0, inputs_embeds=None,
                past_key_values: Cache | None = None, return_dict: bool | None = None,
                document_ids: Tensor | None = None, output_hidden_states: bool | int | list[int] | None = None,
                output_attentions: bool | None = None, output_depth_weights: bool | None = None,
                **kwargs) -> DepthAttnCausalLMOutputWithPast:
        if inputs_embeds is not None:
            raise ValueError("DepthAttnForCausalLM takes input_ids only (inputs_embeds is not supported)")
        if input_ids is None:
            raise ValueError("input_ids is required")
        if cache is None:
            cache = past_key_values
        if document_ids is None:
            document_ids = packed_documents(input_ids, attention_mask, position_ids, cache)
        if document_ids is not None:  # packed documents: a training-time forward, without a cache
            if cache is not None or use_cache:
                raise ValueError("document_ids (or restarting position_ids: packed documents) cannot be combined "
                                 "with a cache: document masking is a training-time feature; pass use_cache=False")
            use_cache = False
        if use_cache is None:
            use_cache = self.config.use_cache if not self.training else False
        if cache is not None and not isinstance(cache, DepthAttnCache):
            if cache.get_seq_length() > 0:
                raise ValueError(f"cache must be a DepthAttnCache (got a filled {type(cache).__name__})")
            cache = None
        if cache is None and use_cache:
            cache = DepthAttnCache(self.config)
        cfg = self.model.config
        kv = None
        if cache is not None:
            B, T = input_ids.shape
            p = self.lm_head.weight
            kv = cache.core_for(cfg, B, T, p.dtype, p.device)
        shift_labels = kwargs.get("shift_labels")
        targets = shift_labels if labels is not None and shift_labels is not None else labels
        check_forward_inputs(cfg, input_ids, attention_mask, position_ids, targets, kv, document_ids)  # as the core
        asked = self._asked(output_hidden_states, output_attentions, output_depth_weights)
        record = {key: [] for key in asked} or None
        hidden = self.model(input_ids, attention_mask, position_ids, kv, validate=False, document_ids=document_ids,
                            **({} if record is None else {"record": record}))
        logits = self.lm_head(hidden)
        loss = None if labels is None else causal_lm_loss(logits, labels, attention_mask, shift_labels,
                                                          kwargs.get("num_items_in_batch"))
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            logits = logits[:, -logits_to_keep:]
        elif isinstance(logits_to_keep, Tensor):
            logits = logits[:, logits_to_keep]
        recorded = recorded_outputs(record, asked.get("hidden_states"))
        out = DepthAttnCausalLMOutputWithPast(loss=loss, logits=logits, cache=cache, **recorded)
        return out if (self.config.return_dict if return_dict is None else return_dict) else out.to_tuple()

    def _asked(self, hidden_states, attentions, depth_weights) -> dict:
        """``{name: value}`` of the outputs asked for, each by its ``output_<name>`` argument or, when that is None,
        the config attribute of that name."""
        asked = {}
        for key, value in (("hidden_states", hidden_states), ("attentions", attentions),
                           ("depth_weights", depth_weights)):
            value = getattr(self.config, f"output_{key}", False) if value is None else value
            if value is not False and value is not None:
                asked[key] = value
        return asked


def recorded_outputs(record: dict | None, hidden_states) -> dict:
    """The output fields of a ``record`` the backbone filled: tuples; ``depth_weights`` None when no layer has any
    (a method without Depth-Attention's softmax); with an ``output_hidden_states`` selection (an int or ints,
    negative from the end, as transformers reads it) the hidden states it does not select are None."""
    if record is None:
        return {}
    out = {key: tuple(values) for key, values in record.items()}
    if "depth_weights" in out and all(w is None for w in out["depth_weights"]):
        out["depth_weights"] = None
    if "hidden_states" in out and not isinstance(hidden_states, bool):
        states = out["hidden_states"]
        n = len(states)
        keep = {i % n for i in ([hidden_states] if isinstance(hidden_states, int) else hidden_states) if -n <= i < n}
        out["hidden_states"] = tuple(h if i in keep else None for i, h in enumerate(states))
    return out


def packed_documents(input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor | None,
                     cache: Cache | None) -> Tensor | None:
    """Document ids ``[B, T]`` int64 from Hugging Face's packing convention, or None: ``position_ids`` that restart
    (``DataCollatorWithFlattening``: each packed example counts from 0; a new document wherever the position does
    not grow by 1, ``functional.packed_document_ids``), read as transformers reads them: only without an
    ``attention_mask`` and before anything is cached. None when no row restarts (one device read)."""
    if position_ids is None or attention_mask is not None or (cache is not None and cache.get_seq_length() > 0):
        return None
    if not isinstance(position_ids, Tensor) or tuple(position_ids.shape) != tuple(input_ids.shape) \
            or position_ids.dtype.is_floating_point or position_ids.dtype == torch.bool:
        return None  # a bad tensor: the shape check names it
    docs = packed_document_ids(position_ids.long())
    return docs if bool(docs[:, -1].any()) else None


def causal_lm_loss(logits: Tensor, labels: Tensor, attention_mask: Tensor | None, shift_labels: Tensor | None,
                   num_items) -> Tensor:
    """The forward's loss (float32 scalar): the mean next-token loss (``next_token_loss``: ``labels`` shifted
    inside); with ``shift_labels`` ``[B, T]`` (targets already shifted, e.g. by context-parallel training) each
    position ``t`` is scored against ``shift_labels[:, t]`` as given, with -100 and padded positions (0 in
    ``attention_mask``'s last T columns) ignored, and ``labels`` unused. With ``num_items`` (the Trainer's
    ``num_items_in_batch``), the summed loss over that count (``summed_over``)."""
    if shift_labels is None:
        loss, count = next_token_loss(logits, labels, attention_mask), None
        if num_items is not None:
            count = target_count(labels, attention_mask)
    else:
        targets = shift_labels.to(device=logits.device, dtype=torch.int64)
        if attention_mask is not None:
            targets = targets.masked_fill(~attention_mask[:, -targets.shape[1]:].bool(), IGNORE_INDEX)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)
        count = (targets != IGNORE_INDEX).sum()
    return loss if num_items is None else summed_over(loss, count, num_items, logits)


def target_count(labels: Tensor, attention_mask: Tensor | None) -> Tensor:
    """How many targets ``depthattn.model.next_token_loss`` averages over (int64 scalar): the same
    ``next_token_targets``, counted instead of averaged."""
    return (next_token_targets(labels, attention_mask) != IGNORE_INDEX).sum()


def summed_over(mean_loss: Tensor, count: Tensor, num_items, logits: Tensor) -> Tensor:
    """The summed next-token loss divided by the Trainer's ``num_items_in_batch`` (the targets of all micro-batches
    of one optimizer step), so that gradient accumulation k×b makes the update and logs the loss of one k·b batch
    (transformers ``ForCausalLMLoss`` semantics). A micro-batch without targets contributes an exact zero."""
    if int(count) == 0:
        return logits.sum() * 0.0
    num_items = num_items.to(mean_loss.device) if isinstance(num_items, Tensor) else num_items
    return mean_loss * count.to(mean_loss.dtype) / num_items


def register() -> None:
    """Register ``depthattn`` with ``AutoConfig`` / ``AutoModelForCausalLM`` and for ``trust_remote_code`` export."""
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoConfig.register(DepthAttnConfig.model_type, DepthAttnConfig, exist_ok=True)
    AutoModelForCausalLM.register(DepthAttnConfig, DepthAttnForCausalLM, exist_ok=True)
    DepthAttnConfig.register_for_auto_class("AutoConfig")
    DepthAttnForCausalLM.register_for_auto_class("AutoModelForCausalLM")
