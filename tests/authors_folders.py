"""Tiny folders in the hyq718/Depth-Attention on-disk format, built from their modelling code's names (read with
the search tool: ``modeling_llama_mhc.py`` @ 019daf9, ``modeling_llama_attnres.py`` @ b8f97c7,
``modeling_llama_depth_attention.py`` @ 3bdad70, ``loader.py`` @ 019daf9; docs/authors-checkpoints.md).

``authors_config(method, generation)`` gives a ``config.json`` object as each generation of their code (or their
training loader, ``"loader"``) writes it; ``authors_state(values)`` random tensors under their names (float32,
q/k-norm gains perturbed, their unused ``lm_head_layernorm.weight``, 0-element DenseFormer alphas for the layers
the period skips); ``write_authors_folder`` writes both, one file or ``shards`` shards with an index.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

BACKBONE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 96, "hidden_size": 32,
            "head_dim": 8, "intermediate_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 64, "initializer_range": 0.01,
            "rms_norm_eps": 1e-5, "pretraining_tp": 1, "use_cache": True, "pad_token_id": 1, "bos_token_id": 0,
            "eos_token_id": 0, "tie_word_embeddings": False, "rope_theta": 10000.0, "attention_bias": False,
            "attention_dropout": 0.0, "mlp_bias": False, "use_qk_norm": True, "scale_embeds": False,
            "torch_dtype": "float32", "transformers_version": "4.46.1"}

METHODS = {
    ("depth_attention", "new"): {"recurrent_model": True, "use_depth_attention": True, "depth_attention_stride": 2,
                                 "depth_attention_recent_window": 1},
    ("depth_attention", "old"): {"recurrent_model": True, "cross_layer_pattern": "depth_softmax",
                                 "cross_layer_mode": "depth_softmax", "depth_softmax_stride": 2,
                                 "depth_recent_window": 1},
    ("depth_attention", "loader"): {"recurrent_model": True, "cross_layer_pattern": "depth_softmax",
                                    "cross_layer_mode": "depth_softmax", "baseline_mode": None,
                                    "residual_baseline": None, "depth_softmax_stride": 2, "depth_recent_window": 1,
                                    "depth_attention_stride": 2, "depth_attention_recent_window": 1},
    ("mhc", "new"): {"baseline_mode": "mhc", "residual_baseline_num_streams": 2, "mhc_num_streams": 2,
                     "mhc_alpha_init": 0.01, "mhc_sinkhorn_iters": 7},
    ("mhc", "old"): {"residual_baseline": "mhc", "mhc_num_streams": 2, "mhc_sinkhorn_iters": 7},
    ("mhc", "loader"): {"recurrent_model": True, "cross_layer_pattern": None, "baseline_mode": "mhc",
                        "residual_baseline": None, "residual_baseline_num_streams": 2, "mhc_num_streams": 2,
                        "mhc_sinkhorn_iters": 7, "depth_softmax_stride": 1, "depth_attention_stride": 1,
                        "depth_recent_window": 0, "depth_attention_recent_window": 0},
    ("attnres", "new"): {"baseline_mode": "attnres", "attnres_block_size": 3, "attnres_recency_bias_init": 2.5},
    ("attnres", "old"): {"residual_baseline": "block_attnres", "attnres_block_size": 3},
    ("attnres", "loader"): {"recurrent_model": True, "cross_layer_pattern": None, "baseline_mode": "attnres",
                            "residual_baseline": None, "attnres_block_size": 3, "attnres_recency_bias_init": 2.5},
    ("denseformer", "new"): {"baseline_mode": "denseformer", "denseformer_dwa_dilation": 1,
                             "denseformer_dwa_period": 2},
    ("denseformer", "old"): {"residual_baseline": "densetransformer", "densetransformer_dwa_dilation": 1,
                             "densetransformer_dwa_period": 2},
    ("denseformer", "loader"): {"recurrent_model": True, "cross_layer_pattern": None, "baseline_mode": "denseformer",
                                "residual_baseline": None, "denseformer_dwa_dilation": 1,
                                "densetransformer_dwa_dilation": 1, "denseformer_dwa_period": 2,
                                "densetransformer_dwa_period": 2},
}


def authors_config(method: str, generation: str = "new", **changes) -> dict:
    return {**BACKBONE, **METHODS[(method, generation)], **changes}


def _baseline(values: dict) -> str | None:
    name = str(values.get("baseline_mode") or values.get("residual_baseline") or "").lower()
    return {"densetransformer": "denseformer", "block_attnres": "attnres"}.get(name, name) or None


def authors_state(values: dict, seed: int = 0, recency: bool = True) -> dict[str, torch.Tensor]:
    """Random tensors under their names for the model ``values`` describes (float32)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.1, base=0.0):
        return base + scale * torch.randn(shape, generator=g)

    C, V, L = values["hidden_size"], values["vocab_size"], values["num_hidden_layers"]
    D, H, K, F = values["head_dim"], values["num_attention_heads"], values["num_key_value_heads"], values[
        "intermediate_size"]
    s = {"model.embed_tokens.weight": r(V, C), "model.norm.weight": r(C, base=1.0), "lm_head.weight": r(V, C),
         "lm_head_layernorm.weight": r(C, base=1.0)}
    for i in range(L):
        p = f"model.layers.{i}."
        s.update({p + "self_attn.q_proj.weight": r(H * D, C), p + "self_attn.k_proj.weight": r(K * D, C),
                  p + "self_attn.v_proj.weight": r(K * D, C), p + "self_attn.o_proj.weight": r(C, H * D),
                  p + "self_attn.q_norm.weight": r(D, scale=0.3, base=1.0),
                  p + "self_attn.k_norm.weight": r(D, scale=0.3, base=1.0),
                  p + "mlp.gate_proj.weight": r(F, C), p + "mlp.up_proj.weight": r(F, C),
                  p + "mlp.down_proj.weight": r(C, F), p + "input_layernorm.weight": r(C, base=1.0),
                  p + "post_attention_layernorm.weight": r(C, base=1.0)})
    baseline = _baseline(values)
    if baseline == "mhc":
        n = values.get("residual_baseline_num_streams") or values.get("mhc_num_streams") or 4
        for i in range(L):
            for side in ("attn", "mlp"):
                p = f"model.layers.{i}.{side}_residual_connector."
                s.update({p + "pre_logits": r(n), p + "post_logits": r(n), p + "residual_logits": r(n, n),
                          p + "mhc_input_norm.weight": r(n * C, base=1.0),
                          p + "mhc_dynamic_projection.weight": r(n * n + 2 * n, n * C),
                          p + "alpha_pre": r(), p + "alpha_post": r(), p + "alpha_res": r()})
        s["model.residual_stream_projector.reduce_logits"] = r(n)
    elif baseline == "attnres":
        prefixes = [f"model.layers.{i}.attnres_{side}_aggregator." for i in range(L) for side in ("attn", "mlp")]
        for p in prefixes + ["model.attnres_final_aggregator."]:
            s.update({p + "pseudo_query": r(C), p + "norm.weight": r(C, base=1.0)})
            if recency:
                s[p + "recency_bias"] = r(scale=0.5, base=3.0)
    elif baseline == "denseformer":
        period = values.get("denseformer_dwa_period") or values.get("densetransformer_dwa_period") or 1
        dilation = values.get("denseformer_dwa_dilation") or values.get("densetransformer_dwa_dilation") or 1
        for i in range(L):
            depth = i + 1
            s[f"model.densetransformer_dwa.alphas.{i}"] = (r(depth // dilation + 1) if depth % period == 0
                                                           else torch.empty(0))
    return s


def write_authors_folder(folder: Path, values: dict, state: dict[str, torch.Tensor], shards: int = 1) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(values, indent=2))
    if shards == 1:
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k].contiguous() for k in names[i::shards]}
        save_file(part, str(folder / file), metadata={"format": "pt"})
        weight_map.update({k: file for k in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder
