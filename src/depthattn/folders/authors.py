"""Reader of the authors' released folders (``hyq718/Depth-Attention``: ``config.json`` with ``model_type="llama"``
and safetensors, one file or sharded with an index), their tensors renamed and packed into ours.

The backbone names are Hugging Face Llama's, which are ours (Qwen3's) with q/k-norm. Their methods' parameters map
onto our modules (their names from ``modeling_llama_mhc.py`` @ 019daf9 ~114 000–121 000 and ~150 000,
``modeling_llama_attnres.py`` @ b8f97c7 ~135 000–138 000):

* mHC, per layer ``i`` and sublayer ``c`` (0 = ``attn``, 1 = ``mlp``), from
  ``model.layers.{i}.{attn,mlp}_residual_connector.``: ``mhc_input_norm.weight`` → ``…connectors.{c}.norm.weight``;
  ``mhc_dynamic_projection.weight`` [n²+2n, nC] (rows pre, post, res) → ``phi.weight`` (the same rows);
  ``alpha_pre``, ``alpha_post``, ``alpha_res`` (0-dim each) → ``alpha`` [3]; ``pre_logits`` [n], ``post_logits``
  [n], ``residual_logits`` [n, n] → ``bias`` [n²+2n] (pre, post, res row-major);
  ``model.residual_stream_projector.reduce_logits`` [n] → ``model.cross_layer.readout``.
* AttnRes, from ``model.layers.{i}.attnres_{attn,mlp}_aggregator.``: ``pseudo_query`` [C] → ``…cross_layer.query``
  [2, C]; ``norm.weight`` [C] → ``key_gain`` [2, C]; ``recency_bias`` (0-dim, the recency variant only) →
  ``recency_bias`` [2]; ``model.attnres_final_aggregator.*`` → ``model.cross_layer.*`` (one row).
* DenseFormer: ``model.densetransformer_dwa.alphas.{i}`` → ``model.layers.{i}.cross_layer.alpha``; theirs has a
  0-element tensor where ``(i + 1) mod period ≠ 0``, where ours has none.

``lm_head_layernorm.weight`` (stored, never used by their forward) and ``rotary_emb.inv_freq`` buffers are dropped;
a 0-element DenseFormer ``alphas.{i}`` is dropped only where our model has no DWA. A folder without q/k-norm keys is
refused saying so; any other missing or extra tensor, or a shape the config does not give, is one ``ValueError``
naming the file and the tensor. Nothing is read before all of it has been checked from the headers.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import torch

from ..checkpoint_files import check_header_fields
from ..config import ModelConfig, read_json_object
from .authors_config import authors_model_config
from .base import LazyTensors, ModelFolder, expected_shapes, hf_token_ids
from ..layout import CONFIG_FILE
from .shards import read_tensor, stored_shapes, weight_files

_DROPPED = re.compile(r"(^|\.)(lm_head_layernorm\.weight|rotary_emb\.inv_freq)$")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: A source recipe: ("same" | "stack" | "flat", their tensor names).
Recipe = tuple[str, tuple[str, ...]]


def _method_recipes(cfg: ModelConfig) -> dict[str, Recipe]:
    """Our ``cross_layer`` tensor name → how it is built from theirs."""
    out: dict[str, Recipe] = {}
    if cfg.cross_layer == "mhc":
        for i in range(cfg.num_hidden_layers):
            for c, side in enumerate(("attn", "mlp")):
                p, q = f"model.layers.{i}.{side}_residual_connector.", f"model.layers.{i}.cross_layer.connectors.{c}."
                out[q + "norm.weight"] = ("same", (p + "mhc_input_norm.weight",))
                out[q + "phi.weight"] = ("same", (p + "mhc_dynamic_projection.weight",))
                out[q + "alpha"] = ("stack", (p + "alpha_pre", p + "alpha_post", p + "alpha_res"))
                out[q + "bias"] = ("flat", (p + "pre_logits", p + "post_logits", p + "residual_logits"))
        out["model.cross_layer.readout"] = ("same", ("model.residual_stream_projector.reduce_logits",))
    elif cfg.cross_layer == "attnres":
        sources = [(f"model.layers.{i}.cross_layer.", [f"model.layers.{i}.attnres_{s}_aggregator." for s in
                                                       ("attn", "mlp")]) for i in range(cfg.num_hidden_layers)]
        sources.append(("model.cross_layer.", ["model.attnres_final_aggregator."]))
        for ours, theirs in sources:
            out[ours + "query"] = ("stack", tuple(t + "pseudo_query" for t in theirs))
            out[ours + "key_gain"] = ("stack", tuple(t + "norm.weight" for t in theirs))
            if cfg.attnres_recency_bias is not None:
                out[ours + "recency_bias"] = ("stack", tuple(t + "recency_bias" for t in theirs))
    elif cfg.cross_layer == "denseformer":
        for i in range(cfg.num_hidden_layers):
            out[f"model.layers.{i}.cross_layer.alpha"] = ("same", (f"model.densetransformer_dwa.alphas.{i}",))
    return out


def recipes(cfg: ModelConfig, expected: dict[str, tuple[int, ...]], stored: dict[str, tuple[int, ...]]
            ) -> dict[str, Recipe]:
    """Every tensor of our model for ``cfg`` (``expected``: name → shape) → its recipe from their names
    (``stored``: theirs → shape; a tied head that is not stored is the embedding, left to the loader)."""
    method = _method_recipes(cfg)
    out = {name: method[name] if name in method else ("same", (name,)) for name in expected}
    if cfg.tie_word_embeddings and "lm_head.weight" not in stored:
        out.pop("lm_head.weight", None)
    return out


def _shape(op: str, shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    if op == "same":
        return shapes[0]
    if op == "stack":
        return (len(shapes), *shapes[0]) if all(s == shapes[0] for s in shapes) else None
    return (sum(math.prod(s) for s in shapes),)


def _combine(op: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    if op == "same":
        return tensors[0]
    if op == "stack":
        return torch.stack(tensors)
    return torch.cat([t.reshape(-1) for t in tensors])


def check_recipes(plan: dict[str, Recipe], stored: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]],
                  weights: str, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Refuse (one ``ValueError`` naming ``weights``) a folder that lacks a tensor ``plan`` needs, holds one no
    recipe uses (but the dropped ones and 0-element DenseFormer alphas), or whose tensors build a shape other than
    ``expected``; returns our name → shape."""
    used = {name for _, names in plan.values() for name in names}
    missing = sorted(used - set(stored))
    if missing:
        raise ValueError(f"{weights} lacks {missing[0]} ({len(missing)} missing tensor(s)), which config.json's "
                         f"model (cross_layer={cfg.cross_layer!r}) needs")
    extra = sorted(k for k in stored if k not in used and not _DROPPED.search(k)
                   and not (k.startswith("model.densetransformer_dwa.alphas.") and math.prod(stored[k]) == 0))
    if extra:
        raise ValueError(f"{weights} holds {extra[0]} ({len(extra)} unexpected tensor(s)), which config.json's model "
                         f"(cross_layer={cfg.cross_layer!r}) does not have")
    shapes = {}
    for ours, (op, names) in plan.items():
        got = _shape(op, [stored[n] for n in names])
        if got != expected[ours]:
            knob = {"mhc": f", mhc_num_streams={cfg.mhc_num_streams}", "denseformer": f", denseformer_dilation="
                    f"{cfg.denseformer_dilation}, denseformer_period={cfg.denseformer_period}"}.get(cfg.cross_layer, "")
            raise ValueError(f"{weights}: {', '.join(names)} {'give' if len(names) > 1 else 'gives'} {ours} the shape "
                             f"{got}, but config.json (hidden_size={cfg.hidden_size}, num_attention_heads="
                             f"{cfg.num_attention_heads}, num_key_value_heads={cfg.num_key_value_heads}, head_dim="
                             f"{cfg.head_dim}, intermediate_size={cfg.intermediate_size}{knob}) needs "
                             f"{expected[ours]}")
        shapes[ours] = got
    return shapes


def _require_qk_norm(stored: dict[str, tuple[int, ...]], weights: str) -> None:
    for which in ("q_norm", "k_norm"):
        if not any(k.endswith(f".self_attn.{which}.weight") for k in stored):
            raise ValueError(f"{weights} is a Llama checkpoint without q/k-norm (no model.layers.N.self_attn.{which}"
                             f".weight): depthattn imports the hyq718/Depth-Attention q/k-norm models only")


def stored_dtype(values: dict) -> torch.dtype:
    """The dtype their ``config.json`` records (``torch_dtype``; float32 when absent or another)."""
    return _DTYPES.get(str(values.get("torch_dtype") or values.get("dtype") or "float32"), torch.float32)


def open_authors(path: str | os.PathLike, qk_norm_position: str | None = None,
                 allow_vanilla: bool = False) -> ModelFolder:
    """An authors' folder as a :class:`~depthattn.folders.base.ModelFolder` in our names (``kind="checkpoint"``):
    config resolved (:func:`~depthattn.folders.authors_config.authors_model_config`), every tensor and shape
    checked from the headers, nothing read yet. ``notes`` say which q/k-norm order was chosen and why."""
    path = os.fspath(path)
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file} not found: not a Hugging Face checkpoint folder")
    values = read_json_object(file, "Hugging Face config")
    found = weight_files(path)
    if found is None:
        raise FileNotFoundError(f"{path} has neither model.safetensors nor model.safetensors.index.json")
    weights, where = found
    stored = stored_shapes(where)
    _require_qk_norm(stored, weights)
    check_header_fields(values, {k: v for k, v in stored.items() if not _DROPPED.search(k)}, file, weights)
    cfg, notes = authors_model_config(values, file, stored, qk_norm_position, allow_vanilla)
    expected = expected_shapes(cfg)
    plan = recipes(cfg, expected, stored)
    shapes = check_recipes(plan, stored, expected, weights, cfg)

    def load(name: str) -> torch.Tensor:
        op, names = plan[name]
        return _combine(op, [read_tensor(where[n], n) for n in names])

    return ModelFolder(Path(path), "authors", cfg, LazyTensors(shapes, load), "checkpoint", weights,
                       hf_token_ids(path), notes, stored_dtype(values))
