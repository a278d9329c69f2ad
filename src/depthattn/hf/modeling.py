"""``DepthAttnForCausalLM``: a thin ``PreTrainedModel`` + ``GenerationMixin`` shell around the core's modules.

Legend: B batch, T time (this call), S cache slots, V vocab.

No model code lives here. Like ``Qwen3ForCausalLM``, the wrapper owns the core ``Backbone`` as ``model`` (HF
``Qwen3Model``'s place) and an ``lm_head``, and its forward is ``self.model(...)`` then ``self.lm_head``, so the
state dict holds exactly the core's keys (``model.*``, ``lm_head.*``, the Hugging Face Qwen3 names) and a
``cross_layer="none"`` export is a valid Qwen3 checkpoint. ``DepthAttnModel`` is the headless model (HF
``Qwen3Model``, ``AutoModel``): the same backbone, with ``Qwen3Model``'s unprefixed keys. The RoPE frequencies live
in ``model.rotary_emb`` (a non-persistent float32 buffer, recomputed by ``_init_weights`` after ``from_pretrained``).

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
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

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
    ``static=True`` (``generate(cache_implementation="static")``) allocates ``initial_capacity`` slots and runs the
    core's fixed-shape path (``KVCache.static``: every step attends over all slots, unfilled ones masked).
    """

    is_compileable = False

    def __init__(self, config: DepthAttnConfig | None = None, initial_capacity: int = 64, static: bool = False):
        super().__init__(layers=[])
        self.config = config
        self.initial_capacity = initial_capacity
        self.static = static
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
            self.kv.static = self.static
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
            grown.static = kv.static
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


#: ``attn_implementation`` values the model runs (anything else is refused at construction).
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


class DepthAttnPreTrainedModel(PreTrainedModel):
    """What ``DepthAttnForCausalLM`` and ``DepthAttnModel`` share: loading, saving, init, the attention
    implementations (``ATTN_IMPLEMENTATIONS``), gradient checkpointing (the core's) and the forward's input
    preparation. Each subclass gives its ``Backbone`` through ``_backbone()``."""

    config_class = DepthAttnConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DecoderLayer"]
    _supports_sdpa = True

    def _check_and_adjust_attn_implementation(self, attn_implementation, is_init_check=False, **kwargs) -> str:
        """``attn_implementation`` (None means ``"sdpa"``) if it is one of ``ATTN_IMPLEMENTATIONS``, else
        ``ValueError`` naming it (``flash_attention_2``, ``flex_attention``, hub kernels: the core runs its own
        attention). transformers calls this in ``__init__``, so ``from_pretrained`` / ``from_config`` refuse too."""
        if attn_implementation is None:
            return "sdpa"
        if attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ValueError(f"attn_implementation={attn_implementation!r} is not supported by "
                             f"{type(self).__name__}; use one of {', '.join(map(repr, ATTN_IMPLEMENTATIONS))}")
        return attn_implementation

    @property
    def gradient_checkpointing(self) -> bool:
        """Whether the backbone recomputes each layer in the backward pass (``Backbone.activation_checkpointing``:
        non-reentrant ``torch.utils.checkpoint``, training mode without a cache only)."""
        return self._backbone().activation_checkpointing

    @gradient_checkpointing.setter
    def gradient_checkpointing(self, enable: bool) -> None:
        self._backbone().activation_checkpointing = bool(enable)

    def _set_gradient_checkpointing(self, enable: bool = True, gradient_checkpointing_func=None,
                                    every_n_layers: int = 1) -> None:
        """What ``gradient_checkpointing_enable`` / ``_disable`` (and the ``Trainer``'s
        ``gradient_checkpointing=True``) call: sets the core's own flag. Every layer is checkpointed with the
        core's non-reentrant ``checkpoint``, so ``gradient_checkpointing_kwargs`` and ``offload`` are not used;
        ``every_n_layers`` other than 1 is a ``ValueError``."""
        if enable and every_n_layers != 1:
            raise ValueError(f"every_n_layers={every_n_layers} is not supported: the core checkpoints every layer")
        self.gradient_checkpointing = enable

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

    def _run_backbone(self, input_ids, inputs_embeds, attention_mask, position_ids, cache, use_cache,
                      document_ids, labels, asked: dict):
        """The forward's inputs, checked and made ready (``_prepare_backbone``), through ``_backbone()``:
        ``(cache, hidden states [B, T, C] after the final norm, recorded)``, ``recorded`` the output fields
        ``asked`` for (``_asked``) as ``recorded_outputs`` gives them ({} when none)."""
        cache, kv, document_ids = self._prepare_backbone(input_ids, inputs_embeds, attention_mask, position_ids,
                                                         cache, use_cache, document_ids, labels)
        record = {key: [] for key in asked} or None
        hidden = self._backbone()(input_ids, attention_mask, position_ids, kv, validate=False,
                                  document_ids=document_ids, inputs_embeds=inputs_embeds,
                                  **({} if record is None else {"record": record}))
        return cache, hidden, recorded_outputs(record, asked.get("hidden_states"))

    def _prepare_backbone(self, input_ids, inputs_embeds, attention_mask, position_ids, cache, use_cache,
                          document_ids, labels):
        """The forward's inputs made ready for the ``Backbone``: ``(cache, core KVCache or None, document_ids)``, with
        every input checked (``check_forward_inputs``, as the core). Packed documents come from ``document_ids``
        or restarting ``position_ids`` (``packed_documents``); a cache is made when ``use_cache`` (default:
        ``config.use_cache`` in eval mode) unless documents are packed."""
        tokens = input_ids if inputs_embeds is None else inputs_embeds
        if tokens is None:
            raise ValueError("input_ids or inputs_embeds is required")
        if document_ids is None:
            document_ids = packed_documents(tokens, attention_mask, position_ids, cache)
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
        backbone = self._backbone()
        cfg = backbone.config
        kv = None
        if cache is not None and isinstance(tokens, Tensor) and tokens.dim() >= 2:  # else the check names it
            p = backbone.embed_tokens.weight
            kv = cache.core_for(cfg, tokens.shape[0], tokens.shape[1], p.dtype, p.device)
        check_forward_inputs(cfg, input_ids, attention_mask, position_ids, labels, kv, document_ids, inputs_embeds)
        return cache, kv, document_ids

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
    use_cache, logits_to_keep, inputs_embeds [B,T,C], document_ids [B,T], output_hidden_states, output_attentions,
    output_depth_weights)``
    → ``DepthAttnCausalLMOutputWithPast(loss, logits [B,T',V], cache, hidden_states, attentions, depth_weights)``.
    With L = ``num_virtual_layers`` (``num_hidden_layers`` × ``num_loops``: a looped model reports per virtual
    layer; exactly one of ``input_ids`` and ``inputs_embeds`` (floating, replacing ``embed_tokens(input_ids)``)),
    each output asked for by its argument or, when that is None, the config attribute of the same name
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

    def _backbone(self) -> Backbone:
        return self.model

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

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, generation_mode=None,
                                      batch_size=None, max_cache_length=None, *args, **kwargs):
        """Give ``generate()`` a ``DepthAttnCache`` instead of transformers' caches: growing for
        ``cache_implementation`` None / ``"dynamic"``, and for ``"static"`` one of ``max_cache_length`` slots
        (or ``max_cache_len``, if larger) on the core's static path; other values are a ``ValueError``."""
        if model_kwargs.get("cache") is None and model_kwargs.get("past_key_values") is None \
                and generation_config.use_cache is not False:
            impl = generation_config.cache_implementation
            if impl not in (None, "dynamic", "static"):
                raise ValueError(f"cache_implementation={impl!r} is not supported by {type(self).__name__}; "
                                 f"use 'dynamic' (the default) or 'static'")
            if impl == "static" and max_cache_length is not None:
                slots = max(max_cache_length, generation_config.max_cache_len or 0)
                model_kwargs["cache"] = DepthAttnCache(self.config, initial_capacity=slots, static=True)
            else:
                model_kwargs["cache"] = DepthAttnCache(self.config)
            return
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, generation_mode, batch_size,
                                                     max_cache_length, *args, **kwargs)

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, cache: Cache | None = None, labels: Tensor | None = None,
                use_cache: bool | None = None, logits_to_keep: int | Tensor = 0, inputs_embeds=None,
                past_key_values: Cache | None = None, return_dict: bool | None = None,
                document_ids: Tensor | None = None, output_hidden_states: bool | int | list[int] | None = None,
                output_attentions: bool | None = None, output_depth_weights: bool | None = None,
                **kwargs) -> DepthAttnCausalLMOutputWithPast:
        shift_labels = kwargs.get("shift_labels")
        targets = shift_labels if labels is not None and shift_labels is not None else labels
        asked = self._asked(output_hidden_states, output_attentions, output_depth_weights)
        cache, hidden, recorded = self._run_backbone(input_ids, inputs_embeds, attention_mask, position_ids,
                                                     past_key_values if cache is None else cache, use_cache,
                                                     document_ids, targets, asked)
        logits = self.lm_head(hidden)
        loss = None if labels is None else causal_lm_loss(logits, labels, attention_mask, shift_labels,
                                                          kwargs.get("num_items_in_batch"))
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            logits = logits[:, -logits_to_keep:]
        elif isinstance(logits_to_keep, Tensor):
            logits = logits[:, logits_to_keep]
        out = DepthAttnCausalLMOutputWithPast(loss=loss, logits=logits, cache=cache, **recorded)
        return out if (self.config.return_dict if return_dict is None else return_dict) else out.to_tuple()


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


class DepthAttnModel(DepthAttnPreTrainedModel):
    """The headless model (HF ``Qwen3Model``'s place, ``AutoModel``): ids or embeddings → final hidden states.

    ``forward(input_ids [B,T] int64 | inputs_embeds [B,T,C], attention_mask, position_ids, cache, use_cache,
    document_ids, output_hidden_states, output_attentions)`` → ``BaseModelOutputWithPast(last_hidden_state [B,T,C]
    after the final norm, cache, hidden_states, attentions)``, with the inputs, outputs, checks and errors of
    ``DepthAttnForCausalLM.forward``. Its state dict holds ``Qwen3Model``'s keys
    (``embed_tokens.*``, ``layers.*``, ``norm.*``, + ``cross_layer.*``), so ``AutoModel.from_pretrained`` of a
    causal-LM folder loads it (the ``model.`` prefix is ``base_model_prefix``; ``lm_head`` is left out).

    It runs a core ``Backbone`` whose submodules are its own (one ``_modules`` dict, so a module replaced on either,
    e.g. by ``resize_token_embeddings``, is replaced on both); the backbone itself is not a submodule, so no key
    gets a prefix. ``DepthAttnForCausalLM.model`` stays a plain ``Backbone`` (``from_core`` shares a
    ``DecoderLM``'s).
    """

    def __init__(self, config: DepthAttnConfig):
        super().__init__(config)
        core = Backbone(config.to_model_config())
        object.__setattr__(self, "_core", core)  # not registered: its children are ours
        self._modules = core._modules
        self.post_init()

    def _backbone(self) -> Backbone:
        return self._core

    def train(self, mode: bool = True):
        self._core.training = mode  # the core reads its own flag (activation checkpointing)
        return super().train(mode)

    def get_input_embeddings(self):
        return self._core.embed_tokens

    def set_input_embeddings(self, value):
        self._core.embed_tokens = value
        self._core.config = self._core.config.replace(vocab_size=value.num_embeddings)

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, cache: Cache | None = None, inputs_embeds: Tensor | None = None,
                use_cache: bool | None = None, past_key_values: Cache | None = None, return_dict: bool | None = None,
                document_ids: Tensor | None = None, output_hidden_states: bool | int | list[int] | None = None,
                output_attentions: bool | None = None, **kwargs) -> BaseModelOutputWithPast:
        asked = self._asked(output_hidden_states, output_attentions, False)
        cache, hidden, recorded = self._run_backbone(input_ids, inputs_embeds, attention_mask, position_ids,
                                                     past_key_values if cache is None else cache, use_cache,
                                                     document_ids, None, asked)
        out = BaseModelOutputWithPast(last_hidden_state=hidden, cache=cache, **recorded)
        return out if (self.config.return_dict if return_dict is None else return_dict) else out.to_tuple()


def packed_documents(tokens: Tensor, attention_mask: Tensor | None, position_ids: Tensor | None,
                     cache: Cache | None) -> Tensor | None:
    """Document ids ``[B, T]`` int64 from Hugging Face's packing convention, or None: ``position_ids`` that restart
    (``DataCollatorWithFlattening``: each packed example counts from 0; a new document wherever the position does
    not grow by 1, ``functional.packed_document_ids``), read as transformers reads them: only without an
    ``attention_mask`` and before anything is cached. None when no row restarts (one device read). ``tokens``:
    ``input_ids`` ``[B, T]`` or ``inputs_embeds`` ``[B, T, C]`` (only its shape is read)."""
    if position_ids is None or attention_mask is not None or (cache is not None and cache.get_seq_length() > 0):
        return None
    if not isinstance(tokens, Tensor) or not isinstance(position_ids, Tensor) \
            or tuple(position_ids.shape) != tuple(tokens.shape[:2]) \
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
    """Register ``depthattn`` with ``AutoConfig`` / ``AutoModelForCausalLM`` / ``AutoModel`` and for
    ``trust_remote_code`` export."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    AutoConfig.register(DepthAttnConfig.model_type, DepthAttnConfig, exist_ok=True)
    AutoModelForCausalLM.register(DepthAttnConfig, DepthAttnForCausalLM, exist_ok=True)
    AutoModel.register(DepthAttnConfig, DepthAttnModel, exist_ok=True)
    DepthAttnConfig.register_for_auto_class("AutoConfig")
    DepthAttnForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    DepthAttnModel.register_for_auto_class("AutoModel")
