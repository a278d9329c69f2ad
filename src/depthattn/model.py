"""The decoder: embedding → (num_loops ×) pre-norm blocks → final RMSNorm → LM head.

Legend: B batch, T time (this call), S key slots, L virtual layers, C hidden size, V vocab.

``Backbone`` is Hugging Face's ``Qwen3Model`` (ids → final hidden states, the forward logic lives there) and
``DecoderLM`` is ``Qwen3ForCausalLM`` (backbone + LM head + loss). With ``cross_layer="none"`` they are exactly
Hugging Face's models (same state-dict keys, same math). Cross-layer methods enter through two seams only: both read from the method's record
(``depthattn.cross_layer``): the residual seam (the record's ``layer`` / ``model`` modules) and the value seam (its
``plan``; Depth-Attention). One model, one cache, one generation path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .attention import Attention, LayerContext
from .cache import KVCache
from .checks import IGNORE_INDEX, as_index, check_forward_shapes
from .config import ModelConfig
from .cross_layer import get as method_record, source_layers
from .functional import (causal_padding_mask, document_block_mask, document_positions, document_runs, flex_serves,
                         static_padding_mask)
from .layers import RMSNorm, RotaryEmbedding, SwiGLU


@dataclass
class ModelOutput:
    """``logits`` ``[B, T, V]`` (float, model dtype); ``loss``: mean next-token cross-entropy (nats) or None."""

    logits: Tensor
    loss: Tensor | None = None


class DecoderLayer(nn.Module):
    """One Qwen3 block calling the residual seam (``cross_layer``) around attention and MLP."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, device=None):
        super().__init__()
        self.self_attn = Attention(cfg, device=device, layer_idx=layer_idx)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, device=device)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device=device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device=device)
        self.cross_layer = method_record(cfg.cross_layer).layer(cfg, layer_idx, device=device)

    def forward(self, state, sources, *, ctx: LayerContext, layer_idx: int):
        """Returns the new residual state and this layer's (K̂, Ṽ) ``[B, K, T, D]`` for later depth sources.

        ``sources``: the (K̂_j, Ṽ_j) of this layer's depth candidates; ``ctx``: RoPE tables, mask and cache of this
        call; ``layer_idx``: the virtual layer u (its cache slots)."""
        state = self.cross_layer.prepare(state, 0)
        a, kv = self.attention_sublayer(self.cross_layer.read(state, 0), sources, ctx=ctx, layer_idx=layer_idx)
        state = self.cross_layer.write(state, 0, a)
        state = self.cross_layer.prepare(state, 1)
        state = self.cross_layer.write(state, 1, self.mlp_sublayer(self.cross_layer.read(state, 1)))
        return state, kv

    def attention_sublayer(self, x: Tensor, sources, *, ctx: LayerContext, layer_idx: int):
        """Sublayer 0 without the residual seam: ``self_attn(input_layernorm(x))`` → (a ``[B, T, C]``, (K̂, Ṽ))."""
        return self.self_attn(self.input_layernorm(x), sources, ctx=ctx, layer_idx=layer_idx)

    def mlp_sublayer(self, x: Tensor) -> Tensor:
        """Sublayer 1 without the residual seam: ``mlp(post_attention_layernorm(x))`` ``[B, T, C]``."""
        return self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """ids → final hidden states (HF ``Qwen3Model``); parameters ``model.embed_tokens``, ``model.layers.{i}``,
    ``model.norm`` (+ ``model.cross_layer``) and the RoPE tables ``model.rotary_emb`` (a non-persistent buffer).

    ``forward(input_ids [B,T] int64, attention_mask [B,T] or [B,past+T] bool/int, position_ids [B,T], cache)`` →
    hidden states ``[B, T, C]`` after the final norm. Raises the ``ValueError``s of ``DecoderLM.forward``.
    ``forward(..., record=...)`` also records per-layer outputs (hidden states, attention and depth weights).
    """

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, device=device)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, device=device) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device=device)
        self.cross_layer = method_record(cfg.cross_layer).model(cfg, device=device)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, device=device)
        #: Static value-seam plan over virtual layers from the method's record (empty tuples without a value seam).
        self.plan = method_record(cfg.cross_layer).plan(cfg)
        self.sources = source_layers(self.plan)
        #: Set from outside (``parallelize.apply_activation_checkpointing``); non-reentrant, training only.
        self.activation_checkpointing = False

    def forward(self, input_ids: Tensor | None, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, cache: KVCache | None = None, *, validate: bool = True,
                document_ids: Tensor | None = None, advance_host: bool = True,
                inputs_embeds: Tensor | None = None, record: dict | None = None) -> Tensor:
        """Final hidden states for ``input_ids``; with a ``cache``, the tokens continue the cached ones at slot
        ``cache.length``, and the call advances the cache by T (``cache.advance``). ``advance_host=False`` advances
        only the device half (``cache.slot``) and leaves ``cache.length`` to the caller: a compiled static step
        (``generate.CompiledDecoder``) does so, so that its graph never reads a Python number that changes per
        token. ``validate=False`` skips ``check_forward_shapes`` for a caller that ran the checks
        already. Values are not checked here (``check_forward_inputs`` at the boundary): the forward never waits
        for the device, and makes no Python branch on tensor data. ``document_ids``: see ``DecoderLM.forward``.
        ``inputs_embeds`` ``[B, T, C]`` (floating; with ``input_ids=None``) replace ``embed_tokens(input_ids)``.

        ``record``: None (nothing is recorded; the forward is unchanged), or a dict whose keys name what to record,
        each an empty list the forward appends to, one entry per step below (L = ``num_virtual_layers``; a looped
        model's layers are its virtual layers):

        - ``"hidden_states"``: L + 1 tensors ``[B, T, C]`` (model dtype): the embedding output, then after each
          virtual layer u < L − 1 the hidden state the method's readout (``cross_layer.end``) makes of its state
          there, i.e. the input the final norm would get if the model stopped after layer u (the residual stream
          itself for the plain residual and the value-seam methods; DenseFormer's mixed output Y_u; mHC's
          read-out of its n streams; AttnRes's final depth mix over the history so far), and last the final
          hidden states after the norm (the return value), as transformers' Qwen3 returns them.
        - ``"attentions"``: L tensors ``[B, H, T, S]`` (model dtype), each layer's sequence-attention
          probabilities over the S key slots it reads (the cached ones and these T); the attention is then the
          explicit softmax (``functional.eager_attention``, equal to SDPA to rounding) instead of SDPA or
          FlexAttention (document masking uses the additive mask then).
        - ``"depth_weights"``: L entries: ``[B, K, T, N]`` float32 Depth-Attention weights
          (``cross_layer.depth_attention.depth_weights``: the softmax over the N = |C(u)| + 1 candidates
          ``plan[u] + (u,)``, self last, per KV head) for a layer with sources of a method with
          ``MethodRecord.has_depth_weights``, else None.

        Raises ``ValueError`` for another key. Activation checkpointing is off in a recording forward."""
        if record is not None:
            unknown = set(record) - {"hidden_states", "attentions", "depth_weights"}
            if unknown:
                raise ValueError(f"record: unknown key(s) {sorted(unknown)}; record 'hidden_states', "
                                 f"'attentions' or 'depth_weights'")
        if validate:
            check_forward_shapes(self.config, input_ids, attention_mask, position_ids, None, cache, document_ids,
                                 inputs_embeds)
        B, T = (input_ids if inputs_embeds is None else inputs_embeds).shape[:2]
        position_ids = as_index(position_ids)  # uint8 ... uint64 ids: widened
        new_mask = None if attention_mask is None else attention_mask[:, -T:].bool()
        h = self.embed_tokens(as_index(input_ids)) if inputs_embeds is None else inputs_embeds
        if document_ids is not None:
            eager = record is not None and "attentions" in record
            ctx, position_ids = self._document_context(new_mask, position_ids, document_ids, h.dtype, eager)
        elif cache is not None and cache.static:
            ctx, position_ids = self._static_context(new_mask, position_ids, cache, B, T, h.dtype)
        else:
            ctx, position_ids = self._dynamic_context(new_mask, position_ids, cache, T, h.dtype, h.device)
        cos, sin = self.rotary_emb(position_ids, h.dtype)
        h = self._layers(h, LayerContext(cos=cos, sin=sin, record=record, **ctx))
        if cache is not None:
            cache.advance_device(T)
            if advance_host:
                cache.advance_host(T)
        h = self.norm(h)
        if record is not None and "hidden_states" in record:
            record["hidden_states"].append(h)
        return h

    def _dynamic_context(self, new_mask, position_ids, cache, T: int, dtype, device):
        """Mask and positions when the key slots are exactly the filled ones (Python-int slicing, eager path).

        Whether a padding mask is needed is host knowledge (a mask was given now or earlier), never read from
        the data: an all-ones mask costs a mask, not a synchronisation."""
        past = cache.length if cache is not None else 0
        if cache is not None:
            cache.reserve(new_mask, T)
            key_mask = cache.key_mask[:, :past + T] if cache.has_padding else None
        else:
            key_mask = new_mask
        if position_ids is None:
            position_ids = self._positions(key_mask, past, T, device)
        mask = None
        if key_mask is not None or (past > 0 and T > 1):
            mask = causal_padding_mask(key_mask, past, T, past + T, dtype, device)
        return dict(mask=mask, cache=cache, cache_start=past), position_ids

    @staticmethod
    def _document_context(new_mask, position_ids, document_ids, dtype, eager: bool = False):
        """Mask and positions of packed documents (no cache): block-diagonal causal attention (and the padding of
        ``new_mask``), as a FlexAttention block mask on CUDA (unless ``eager``: the attention weights are asked
        for) and an additive SDPA mask elsewhere; positions restart at each document unless ``position_ids`` are
        given."""
        docs = document_runs(as_index(document_ids))
        if position_ids is None:
            position_ids = document_positions(docs, new_mask)
        T = docs.shape[1]
        if flex_serves(docs.device) and not eager:
            return dict(block_mask=document_block_mask(docs, new_mask)), position_ids
        return dict(mask=causal_padding_mask(new_mask, 0, T, T, dtype, docs.device, docs)), position_ids

    def _static_context(self, new_mask, position_ids, cache, B: int, T: int, dtype):
        """Mask and positions over all ``S`` cache slots at the device slot ``cache.slot`` (fixed shapes; the
        compiled decode step). Unfilled slots are False in ``key_mask``, so they are masked like padding."""
        slots = cache.slot + torch.arange(T, device=cache.slot.device)
        cache.reserve_at(new_mask, slots)
        if position_ids is None:  # real tokens before each one, from the whole recorded mask
            counts = cache.key_mask.long().cumsum(1)
            position_ids = (counts.gather(1, slots.expand(B, T)) - 1).clamp(min=0)
        mask = static_padding_mask(cache.key_mask, slots, dtype)
        return dict(mask=mask, cache=cache, cache_slots=slots), position_ids

    @staticmethod
    def _positions(key_mask: Tensor | None, past: int, T: int, device) -> Tensor:
        """RoPE positions ``[B, T]``, or ``[1, T]`` when every row has the same ones (no padding: then the RoPE
        tables are computed once and broadcast over the batch): the count of real tokens before each one (first
        real token at 0); pads get 0."""
        if key_mask is None:
            return torch.arange(past, past + T, device=device)[None]
        pos = key_mask.long().cumsum(1) - 1
        return pos[:, past:].clamp(min=0)

    def _layers(self, h: Tensor, ctx: LayerContext) -> Tensor:
        """Run the virtual layers u = r·L_phys + l, feeding each its static Depth-Attention sources."""
        state = self.cross_layer.begin(h)
        saved: dict[int, tuple[Tensor, Tensor]] = {}
        use_ckpt = self.activation_checkpointing and self.training and ctx.cache is None and torch.is_grad_enabled()
        hidden = None
        if ctx.record is not None:  # recording: no recomputation in the backward (it would record twice)
            use_ckpt = False
            hidden = ctx.record.get("hidden_states")
            if hidden is not None:
                hidden.append(h)  # the embedding output
        layers = self.layers
        last = len(self.plan) - 1
        for u, cands in enumerate(self.plan):
            layer = layers[u % len(layers)]
            sources = tuple(saved[j] for j in cands)
            if use_ckpt:
                state, kv = checkpoint(layer, state, sources, ctx=ctx, layer_idx=u, use_reentrant=False)
            else:
                state, kv = layer(state, sources, ctx=ctx, layer_idx=u)
            if u in self.sources:
                saved[u] = kv
            if hidden is not None and u < last:  # the last one is the normed output (Backbone.forward)
                hidden.append(self.cross_layer.end(state))
        return self.cross_layer.end(state)


def next_token_targets(labels: Tensor, attention_mask: Tensor | None) -> Tensor:
    """The target of every position, int64 ``[B, T]``: position t is scored against ``labels[:, t + 1]``, the last
    position and ignored targets hold -100: -100 labels, and targets at or after a padded position (a target counts
    only if it and the position predicting it are real tokens in ``attention_mask``'s last T columns). Labels are
    widened to int64 first, so an unsigned dtype's token (uint8 156) is never read as -100."""
    T = labels.shape[1]
    targets = F.pad(labels.to(torch.int64)[:, 1:], (0, 1), value=IGNORE_INDEX)  # int64: cross_entropy's only type
    if attention_mask is not None:
        new_mask = attention_mask[:, -T:].bool()
        real = F.pad(new_mask[:, 1:] & new_mask[:, :-1], (0, 1), value=False)
        targets = targets.masked_fill(~real, IGNORE_INDEX)
    return targets


def next_token_loss(logits: Tensor, labels: Tensor, attention_mask: Tensor | None) -> Tensor:
    """Mean next-token cross-entropy (nats, float32) of ``logits`` ``[B, T, V]`` against ``labels`` ``[B, T]``,
    shifted inside (``next_token_targets``: -100 labels and targets at or after a padded position are ignored).

    The targets are shifted, not the logits (the last position scores against -100, as transformers'
    ``ForCausalLMLoss`` does), so the ``[B, T, V]`` logits are read in place; slicing them (``logits[:, :-1]``)
    would copy them and make the backward zero-fill and copy them again."""
    targets = next_token_targets(labels, attention_mask)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)


@torch.no_grad()
def init_module_weights(module: nn.Module, cfg: ModelConfig) -> None:
    """Initialise the tensors of one module as ``DecoderLM.init_weights``'s table says (children are not
    visited: ``DecoderLM.init_weights`` and transformers' ``_init_weights`` both call this once per module,
    children before parents, so both draw the same numbers in the same order)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=cfg.initializer_range)
    elif isinstance(module, RMSNorm):
        nn.init.ones_(module.weight)
    elif isinstance(module, RotaryEmbedding):
        module.reset_parameters()
    elif callable(getattr(module, "init_weights", None)):  # the residual seam's modules
        module.init_weights(cfg)


def _children_first(module: nn.Module):
    """``module`` and its submodules, each after its children (the order transformers initialises modules in)."""
    for child in module.children():
        yield from _children_first(child)
    yield module


class DecoderLM(nn.Module):
    """Qwen3-style causal LM with an optional cross-layer method (``cfg.cross_layer``): ``Backbone`` + LM head.

    ``forward(input_ids [B,T] int64, attention_mask [B,T] or [B,past+T] bool/int, position_ids [B,T], cache,
    labels [B,T], document_ids [B,T] int)`` → ``ModelOutput``. Raises ``ValueError`` naming the argument for inputs
    of the wrong type or shape, too little cache room, more slots than ``max_position_embeddings``, or
    ``document_ids`` with a cache; values (ids in the vocabulary, 0/1 masks, position range) are checked at the
    boundary (``depthattn.checks.check_forward_inputs``).
    """

    def __init__(self, cfg: ModelConfig, device: torch.device | str | None = None):
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg, device=device)  # validates cfg
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device=device)
        self.tie_weights()
        self.init_weights()

    def tie_weights(self) -> None:
        """With ``tie_word_embeddings``, make ``lm_head.weight`` the embedding's Parameter (one tensor). Call it again
        after ``to_empty``, which gives every module its own new Parameter and so unties them."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def is_tied(self) -> bool:
        """Whether the LM head and the embedding are one Parameter (tensor identity, not the config flag)."""
        return self.lm_head.weight is self.model.embed_tokens.weight

    @property
    def plan(self) -> tuple[tuple[int, ...], ...]:
        """The backbone's static Depth-Attention plan over virtual layers (empty tuples for other methods)."""
        return self.model.plan

    @property
    def activation_checkpointing(self) -> bool:
        """Recompute each layer in the backward pass (the backbone's flag; set by ``parallelize``)."""
        return self.model.activation_checkpointing

    @activation_checkpointing.setter
    def activation_checkpointing(self, enabled: bool) -> None:
        self.model.activation_checkpointing = enabled

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise every parameter; meta-device safe. Per-parameter table (spec-baselines.md §2):

        ========================================  =============================================
        parameter                                 init
        ========================================  =============================================
        model.embed_tokens.weight                 N(0, initializer_range²)
        model.layers.*.self_attn.{q,k,v,o}_proj   N(0, initializer_range²)
        model.layers.*.mlp.{gate,up,down}_proj    N(0, initializer_range²)
        lm_head.weight (untied)                   N(0, initializer_range²)
        all RMSNorm weights (incl. q/k_norm)      ones
        *.cross_layer.*                           the method's ``init_weights(cfg)`` (cross_layer/<method>.py)
        layers.*.cross_layer.alpha (denseformer)  α_{i,i} = 1, others 0 (exactly vanilla)
        *.connectors.*.norm.weight (mhc)          ones
        *.connectors.*.phi.weight (mhc)           N(0, initializer_range²)
        *.connectors.*.alpha (mhc)                mhc_alpha_init (pre, post, res)
        *.connectors.*.bias (mhc)                 [logit(1/n)] * n, [0] * n, log(0.99 I + 0.01/(n-1) off-diag)
        model.cross_layer.readout (mhc)           zeros (mean over streams)
        *.cross_layer.query (attnres)             zeros (uniform depth weights)
        *.cross_layer.key_gain (attnres)          ones
        *.cross_layer.recency_bias (attnres)      attnres_recency_bias (recency variant only)
        model.rotary_emb.inv_freq (buffer)        rope_theta ** (-2i / head_dim)
        ========================================  =============================================

        Modules are initialised one at a time (``init_module_weights``), children before parents, in module
        order: the order in which ``DepthAttnForCausalLM`` (transformers) initialises the same modules.
        """
        for module in _children_first(self):
            if module is not self:
                init_module_weights(module, self.config)

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                cache: KVCache | None = None, labels: Tensor | None = None,
                document_ids: Tensor | None = None) -> ModelOutput:
        """Logits for ``input_ids`` (and the loss when ``labels`` are given; labels are shifted inside, -100 and
        padded positions ignored). With a ``cache``, the tokens continue the cached ones at slot ``cache.length``.

        ``document_ids`` (integer ``[B, T]``): packed documents (document masking, as torchtitan's block-causal
        FlexAttention and OLMo-core's intra-document masking). A document is a run of equal ids along a row; a token
        attends only to earlier tokens of its own document (block-diagonal causal), and RoPE positions restart at 0 at
        each document (unless ``position_ids`` are given, which are then used as they are). The depth mix of every
        method is per position, so nothing else changes: a document packed after others gets the logits it gets alone
        (tests/model/test_doc_mask.py). Combines with a left-padding ``attention_mask`` (keys must be real tokens of the
        query's document; positions count real tokens). Sequence attention is FlexAttention with a block mask on CUDA
        (``functional.document_block_mask``), SDPA with an additive ``[B, 1, T, T]`` mask elsewhere. A training-time
        feature: ``ValueError`` with a ``cache`` (no KV-cache decode of packed rows). The loss is not changed: the
        target of a document's last token is the next document's first.

        Only shapes are checked here (no device synchronisation); the values of user input are checked once at
        the boundary (``depthattn.checks.check_forward_inputs``: ``generate``, evaluation, the HF forward)."""
        check_forward_shapes(self.config, input_ids, attention_mask, position_ids, labels, cache, document_ids)
        h = self.model(input_ids, attention_mask, position_ids, cache, validate=False, document_ids=document_ids)
        logits = self.lm_head(h)
        loss = None if labels is None else next_token_loss(logits, labels, attention_mask)
        return ModelOutput(logits=logits, loss=loss)

    # ------------------------------------------------------------------ conveniences
    def new_cache(self, batch_size: int, max_seq_len: int) -> KVCache:
        """An empty cache on this model's device and dtype."""
        p = self.lm_head.weight
        return KVCache.empty(self.config, batch_size, max_seq_len, dtype=p.dtype, device=p.device)

    def num_params(self) -> int:
        """Parameters actually allocated (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters())
