"""``DepthAttnForCausalLM`` for vLLM: vLLM's own Qwen3 layers with the Depth-Attention value seam before the attention.

Legend: T tokens of this engine step (all requests, flattened), H / K query / KV heads on this rank, D head dim.

Built on ``vllm.model_executor.models.qwen3`` (``Qwen3DecoderLayer``: fused QKV projection, q/k RMSNorm, vLLM's
rotary embedding, its ``Attention`` over the paged KV cache, SwiGLU MLP) and ``qwen2.Qwen2Model`` (embedding, layer
stack, final norm, the HF → vLLM weight mapping, so a checkpoint's Qwen3 key names load as for Qwen3). The only
change is in the attention step of each layer (spec-depth-attention.md §3, §7.1):

    q, K̂ = RoPE(q_norm(q)), RoPE(k_norm(k));   Ṽ = depth_mix(q, [K̂_j for j in C(u)] + [K̂], [Ṽ_j ...] + [v])
    out = self.attn(q, K̂, Ṽ)             # vLLM's attention writes K̂ and Ṽ into its paged cache

(K̂ = k_norm(RoPE(k)) for ``qk_norm_position="k_after_rope"``, as in the core), so the paged KV cache stores the
mixed value Ṽ, exactly vanilla-sized, and no attention backend changes. The depth
mix reads only the same token's (K̂_j, Ṽ_j) of earlier layers, which this forward computed itself: the model keeps
the candidate layers' (K̂, Ṽ) of this step's tokens in a local dict for the duration of one forward (no state
between steps). That is why prefix caching, chunked prefill and continuous batching stay exact (docs/serving.md):
a cached prefix contributes only its cached K̂ and Ṽ, which are what the core caches too, and tokens of different
requests never mix along depth. The mix is ``serving.mix.token_depth_mix``: the core's ``depth_mix`` math (float32
softmax over depth) in vLLM's flat ``[T, heads·D]`` layout, tested against the core's float64 reference.

Served: ``cross_layer`` ``none`` and ``depth_attention`` (any stride and window), ``num_loops=1``. Refused at load
with one ``ValueError``: the residual-seam methods (DenseFormer, mHC, AttnRes change the residual stream, which
vLLM's fused add-RMSNorm layers cannot express), looped models (one vLLM attention layer owns one cache; a loop would
need one per virtual layer), pipeline parallelism, and a head_dim the attention backend does not support.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.qwen2 import Qwen2Model
from vllm.model_executor.models.qwen3 import Qwen3DecoderLayer, Qwen3ForCausalLM
from vllm.model_executor.models.utils import AutoWeightsLoader, maybe_prefix

from ..cross_layer.depth_attention import model_plan
from .mix import token_depth_mix

SERVED_METHODS = ("none", "depth_attention")


def served_plan(hf_config) -> tuple[tuple[int, ...], ...]:
    """Each layer's depth candidates (ascending; empty for ``none``), or ``ValueError`` for what is not served."""
    cfg = hf_config.to_model_config()
    if cfg.cross_layer not in SERVED_METHODS:
        raise ValueError(f"vLLM serves depthattn checkpoints with cross_layer in {SERVED_METHODS}, not "
                         f"{cfg.cross_layer!r}: the plugin implements only Depth-Attention's value mix, and the residual-"
                         f"seam methods change the residual stream, which vLLM's Qwen3 layers (fused add + RMSNorm) "
                         f"cannot express; evaluate it with depthattn eval/generate instead")
    if cfg.num_loops != 1:
        raise ValueError(f"vLLM does not serve looped depthattn models (num_loops={cfg.num_loops}): each vLLM "
                         f"attention layer owns one KV cache, a looped model needs one per virtual layer")
    if cfg.cross_layer == "none":
        return tuple(() for _ in range(cfg.num_hidden_layers))
    return model_plan(cfg)


class DepthAttnDecoderLayer(Qwen3DecoderLayer):
    """vLLM's ``Qwen3DecoderLayer`` whose attention step takes depth sources and returns this layer's (K̂, Ṽ), with
    k_norm before or after RoPE as the checkpoint's ``qk_norm_position`` says (absent: before, Qwen3's order)."""

    def __init__(self, *, config, **kwargs):
        super().__init__(config=config, **kwargs)
        self.k_after_rope = getattr(config, "qk_norm_position", "before_rope") == "k_after_rope"

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None,
                sources=(), keep: bool = False):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states, kv = self.attend(positions, hidden_states, sources, keep)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual, kv

    def attend(self, positions: torch.Tensor, x: torch.Tensor, sources, keep: bool):
        """``Qwen3Attention.forward`` with the value seam: returns (output ``[T, C]``, (K̂, Ṽ) or None)."""
        a = self.self_attn
        qkv, _ = a.qkv_proj(x)
        q, k, v = qkv.split([a.q_size, a.kv_size, a.kv_size], dim=-1)
        q = a.q_norm(q.reshape(*q.shape[:-1], -1, a.head_dim)).reshape(q.shape)
        if not self.k_after_rope:
            k = a.k_norm(k.reshape(*k.shape[:-1], -1, a.head_dim)).reshape(k.shape)
        q, k = a.rotary_emb(positions, q, k)  # in place on CPU/GPU custom ops
        if self.k_after_rope:
            k = a.k_norm(k.reshape(*k.shape[:-1], -1, a.head_dim)).reshape(k.shape)
        if sources:
            v = token_depth_mix(q, [kj for kj, _ in sources] + [k], [vj for _, vj in sources] + [v], a.num_heads,
                                a.num_kv_heads, a.head_dim)
        # our own copies: later layers read them, and nothing vLLM does to q/k/v in place may change them
        kv = (k.clone(), v.clone()) if keep else None
        out, _ = a.o_proj(a.attn(q, k, v))
        return out, kv


@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": -1, "intermediate_tensors": 0,
                                         "inputs_embeds": 0})
class DepthAttnModel(Qwen2Model):
    """``Qwen2Model`` (as ``Qwen3Model`` is) with ``DepthAttnDecoderLayer`` and a forward that hands each layer its
    candidates' (K̂, Ṽ) of this step's tokens."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        if get_pp_group().world_size > 1:
            raise ValueError("depthattn's vLLM model does not support pipeline parallelism (the depth mix reads "
                             "earlier layers' keys and values of the same step)")
        self.plan = served_plan(vllm_config.model_config.hf_config)
        super().__init__(vllm_config=vllm_config, prefix=prefix, decoder_layer_type=DepthAttnDecoderLayer)
        self.kept = frozenset(j for cands in self.plan for j in cands)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors=None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        hidden = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        residual = None
        kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # this forward only
        for idx, layer in enumerate(self.layers):
            sources = [kept[j] for j in self.plan[idx]]
            hidden, residual, kv = layer(positions, hidden, residual, sources, idx in self.kept)
            if kv is not None:
                kept[idx] = kv
        hidden, _ = self.norm(hidden, residual)
        return hidden


class DepthAttnForCausalLM(nn.Module):
    """vLLM text-generation model for ``architectures: ["DepthAttnForCausalLM"]`` checkpoints (shaped like vLLM's
    ``Qwen3ForCausalLM``: ``model``, ``lm_head`` tied as the config says, ``logits_processor``)."""

    packed_modules_mapping = Qwen3ForCausalLM.packed_modules_mapping
    hf_to_vllm_mapper = Qwen2Model.hf_to_vllm_mapper

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.model = DepthAttnModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        backend = self.model.layers[0].self_attn.attn.attn_backend
        if not backend.supports_head_size(config.head_dim):
            raise ValueError(f"head_dim={config.head_dim} is not supported by vLLM's {backend.get_name()} attention "
                             f"backend on this device (supported: {backend.get_supported_head_sizes()}); train with "
                             f"a supported head_dim to serve with vLLM")
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, quant_config=vllm_config.quant_config,
                                      prefix=maybe_prefix(prefix, "lm_head"))
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors=None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        ignore = ["lm_head."] if self.config.tie_word_embeddings else None  # the embedding is the head
        return AutoWeightsLoader(self, ignore_unexpected_prefixes=ignore).load_weights(weights)
