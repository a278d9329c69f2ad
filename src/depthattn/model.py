"""The decoder: embedding → (num_loops ×) pre-norm blocks → final RMSNorm → LM head.

Legend: B batch, T time (this call), S key slots, L virtual layers, C hidden size, V vocab.

With ``cross_layer="none"`` this is exactly Hugging Face's ``Qwen3ForCausalLM`` (same state-dict keys, same math).
Cross-layer methods enter through two seams only, both read from the method's record (``depthattn.cross_layer``):
the residual seam (the record's ``layer`` / ``model`` modules) and the value seam (its ``plan``; Depth-Attention).
One model, one cache, one generation path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .attention import Attention
from .cache import KVCache
from .checks import IGNORE_INDEX, check_forward_inputs
from .config import ModelConfig
from .cross_layer import get as method_record, source_layers
from .functional import causal_padding_mask, rope_cos_sin, rope_inv_freq
from .layers import RMSNorm, SwiGLU


@dataclass
class ModelOutput:
    """``logits`` ``[B, T, V]`` (float, model dtype); ``loss``: mean next-token cross-entropy (nats) or None."""

    logits: Tensor
    loss: Tensor | None = None


class DecoderLayer(nn.Module):
    """One Qwen3 block calling the residual seam (``cross_layer``) around attention and MLP."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, device=None):
        super().__init__()
        self.self_attn = Attention(cfg, device=device)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, device=device)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device=device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device=device)
        self.cross_layer = method_record(cfg.cross_layer).layer(cfg, layer_idx, device=device)

    def forward(self, state, sources, cos, sin, mask, cache=None, layer_idx=0, cache_start=0):
        """Returns the new residual state and this layer's (K̂, Ṽ) ``[B, K, T, D]`` for later depth sources."""
        state = self.cross_layer.prepare(state, 0)
        x = self.cross_layer.read(state, 0)
        a, kv = self.self_attn(self.input_layernorm(x), sources, cos, sin, mask, cache, layer_idx, cache_start)
        state = self.cross_layer.write(state, 0, a)
        state = self.cross_layer.prepare(state, 1)
        x = self.cross_layer.read(state, 1)
        state = self.cross_layer.write(state, 1, self.mlp(self.post_attention_layernorm(x)))
        return state, kv


class Backbone(nn.Module):
    """Holds the HF-named parameters ``model.embed_tokens``, ``model.layers.{i}``, ``model.norm``."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, device=device)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, device=device) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device=device)
        self.cross_layer = method_record(cfg.cross_layer).model(cfg, device=device)


class DecoderLM(nn.Module):
    """Qwen3-style causal LM with an optional cross-layer method (``cfg.cross_layer``).

    ``forward(input_ids [B,T] int64, attention_mask [B,T] or [B,past+T] bool/int, position_ids [B,T], cache,
    labels [B,T])`` → ``ModelOutput``. Raises ``ValueError`` naming the argument for ids outside the vocabulary,
    positions beyond ``max_position_embeddings``, too little cache room, or a mask of the wrong shape or dtype.
    """

    def __init__(self, cfg: ModelConfig, device: torch.device | str | None = None):
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.model = Backbone(cfg, device=device)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device=device)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        #: Static value-seam plan over virtual layers from the method's record (empty tuples without a value seam).
        self.plan = method_record(cfg.cross_layer).plan(cfg)
        self.sources = source_layers(self.plan)
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta, device=device), persistent=False)
        #: Set from outside (``parallelize.apply_activation_checkpointing``); non-reentrant, training only.
        self.activation_checkpointing = False
        self.init_weights()

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
        inv_freq (buffer)                         rope_theta ** (-2i / head_dim)
        ========================================  =============================================
        """
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        for module in self.modules():
            if module is not self and hasattr(module, "init_weights"):
                module.init_weights(self.config)
        self.inv_freq.copy_(rope_inv_freq(self.config.head_dim, self.config.rope_theta, device=self.inv_freq.device))

    def _apply(self, fn, recurse=True):
        """``.to()`` / ``.cuda()`` / ``.bfloat16()`` move the RoPE frequencies but keep them float32 (a bf16
        ``inv_freq`` would turn position 3000's angles by up to half a radian)."""
        super()._apply(fn, recurse)
        self._buffers["inv_freq"] = rope_inv_freq(self.config.head_dim, self.config.rope_theta,
                                                  device=self.inv_freq.device)
        return self

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                cache: KVCache | None = None, labels: Tensor | None = None) -> ModelOutput:
        """Logits for ``input_ids`` (and the loss when ``labels`` are given; labels are shifted inside, -100 and
        padded positions ignored). With a ``cache``, the tokens continue the cached ones at slot ``cache.length``."""
        cfg = self.config
        check_forward_inputs(cfg, input_ids, attention_mask, position_ids, labels, cache)
        past = cache.length if cache is not None else 0
        B, T = input_ids.shape
        device = input_ids.device
        new_mask = None if attention_mask is None else attention_mask[:, -T:].bool()
        if cache is not None:
            if attention_mask is not None and attention_mask.shape[1] == past + T and past > 0 and not torch.equal(
                    attention_mask[:, :past].bool(), cache.key_mask[:, :past]):
                raise ValueError("attention_mask's first past columns disagree with the cached padding mask")
            cache.reserve(new_mask if new_mask is not None else torch.ones(B, T, dtype=torch.bool, device=device))
            key_mask = cache.key_mask[:, :past + T]
        else:
            key_mask = new_mask
        if position_ids is None:
            # Derived positions never exceed the slot index, so only a long enough history needs a look at values.
            position_ids = self._positions(key_mask, past, B, T, device)
            if past + T > cfg.max_position_embeddings and int(position_ids.max()) >= cfg.max_position_embeddings:
                if cache is not None:
                    cache.crop(past)
                raise ValueError(f"the sequence reaches position {int(position_ids.max())}, beyond "
                                 f"max_position_embeddings={cfg.max_position_embeddings}")
        h = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(position_ids, self.inv_freq, h.dtype)
        padded = key_mask is not None and not bool(key_mask.all())
        mask = None
        if padded or (past > 0 and T > 1):
            mask = causal_padding_mask(key_mask, past, T, past + T, h.dtype, device)
        h = self._layers(h, cos, sin, mask, cache, past)
        if cache is not None:
            cache.advance(T)
        logits = self.lm_head(self.model.norm(h))
        loss = None
        if labels is not None:
            targets = labels[:, 1:]
            if new_mask is not None:  # a target counts only if it and the position predicting it are real tokens
                targets = targets.masked_fill(~(new_mask[:, 1:] & new_mask[:, :-1]), IGNORE_INDEX)
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)
        return ModelOutput(logits=logits, loss=loss)

    @staticmethod
    def _positions(key_mask: Tensor | None, past: int, B: int, T: int, device) -> Tensor:
        """RoPE positions: the count of real tokens before each one (first real token at 0); pads get 0."""
        if key_mask is None:
            return torch.arange(past, past + T, device=device).expand(B, T)
        pos = key_mask.long().cumsum(1) - 1
        return pos[:, past:].clamp(min=0)

    def _layers(self, h: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, cache: KVCache | None,
                past: int) -> Tensor:
        """Run the virtual layers u = r·L_phys + l, feeding each its static Depth-Attention sources."""
        state = self.model.cross_layer.begin(h)
        saved: dict[int, tuple[Tensor, Tensor]] = {}
        use_ckpt = self.activation_checkpointing and self.training and cache is None and torch.is_grad_enabled()
        layers = self.model.layers
        for u, cands in enumerate(self.plan):
            layer = layers[u % len(layers)]
            sources = tuple(saved[j] for j in cands)
            if use_ckpt:
                state, kv = checkpoint(layer, state, sources, cos, sin, mask, None, u, past, use_reentrant=False)
            else:
                state, kv = layer(state, sources, cos, sin, mask, cache, u, past)
            if u in self.sources:
                saved[u] = kv
        return self.model.cross_layer.end(state)

    # ------------------------------------------------------------------ conveniences
    def new_cache(self, batch_size: int, max_seq_len: int) -> KVCache:
        """An empty cache on this model's device and dtype."""
        p = self.lm_head.weight
        return KVCache.empty(self.config, batch_size, max_seq_len, dtype=p.dtype, device=p.device)

    def num_params(self) -> int:
        """Parameters actually allocated (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters())
