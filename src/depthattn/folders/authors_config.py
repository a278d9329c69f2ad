"""The authors' ``config.json`` (``hyq718/Depth-Attention``: a modified transformers ≤ 4.46 Llama) → a
``ModelConfig``.

Their switches are resolved exactly as their modelling code resolves them (read at the commits the search index
serves; character offsets approximate, docs/authors-checkpoints.md):

* **Depth-Attention** (``modeling_llama_depth_attention.py`` @ 3bdad70, ``LlamaModel.__init__`` / ``forward``,
  ~108 000–112 000): on iff ``recurrent_model`` and (``use_depth_attention`` or ``cross_layer_pattern`` in
  ``("depth_attention", "depth_softmax")``); stride ``depth_attention_stride``, else ``depth_softmax_stride``,
  else 1 (every earlier layer); window ``depth_attention_recent_window``, else ``depth_recent_window``, else 0;
  a stride ≤ 1 selects every earlier layer and a window ≤ 0 none, as their selection loop does. The older file
  (019daf9) reads only ``cross_layer_pattern="depth_softmax"`` and the ``depth_softmax_*`` names; both resolve the
  same here. Their training loader (``loader.py`` @ 019daf9) writes both generations into a saved config.
* **Baselines** (``modeling_llama_mhc.py`` @ 019daf9 ~108 000–152 000; ``modeling_llama_attnres.py`` @ b8f97c7):
  ``baseline_mode``, else the legacy ``residual_baseline`` (both given and different: refused, as theirs raises),
  aliases ``denseformer``/``densetransformer``, ``attnres``/``block_attnres``/``block-attnres``/
  ``attention_residual``/``attention-residual``, ``mhc``; mHC streams ``residual_baseline_num_streams``, else
  ``mhc_num_streams``, else the environment variable ``MHC_NUM_STREAMS``, else 4; ``mhc_sinkhorn_iters`` (20);
  ``attnres_block_size`` (12); the AttnRes recency variant (a ``recency_bias`` per aggregator in the weights)
  starts from ``attnres_recency_bias_init`` (3.0); DenseFormer ``denseformer_dwa_dilation`` /
  ``densetransformer_dwa_dilation`` and ``…_period`` (1).

Missing backbone fields take transformers 4.46's ``LlamaConfig`` defaults (:data:`LLAMA_DEFAULTS`). What the core
does not implement, or a switch value their code would not run, is refused with one ``ValueError`` naming the file,
the key and the value. A config that resolves to no method (their code then runs vanilla Llama + q/k-norm) is
refused unless ``allow_vanilla``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..config import QK_NORM_POSITIONS, ModelConfig

MODEL_TYPE = "llama"
#: ``config.json`` keys only their modified Llama reads: a ``llama`` folder with any of them looks like theirs.
AUTHOR_KEYS = frozenset({
    "use_qk_norm", "recurrent_model", "use_depth_attention", "cross_layer_pattern", "cross_layer_mode",
    "depth_softmax_stride", "depth_recent_window", "depth_attention_stride", "depth_attention_recent_window",
    "baseline_mode", "residual_baseline", "scale_embeds", "residual_baseline_num_streams", "mhc_num_streams",
    "attnres_block_size", "attnres_recency_bias_init", "denseformer_dwa_period", "denseformer_dwa_dilation"})
#: transformers 4.46 ``LlamaConfig`` defaults of the fields we read (``head_dim``: hidden / heads).
LLAMA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 2048, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "pretraining_tp": 1,
    "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
    "attention_dropout": 0.0, "mlp_bias": False}
_NONE = (None, "", "none", "null", False)
_BASELINES = {"denseformer": "denseformer", "densetransformer": "denseformer", "attnres": "attnres",
              "block_attnres": "attnres", "block-attnres": "attnres", "attention_residual": "attnres",
              "attention-residual": "attnres", "mhc": "mhc"}
_DEPTH_PATTERNS = ("depth_attention", "depth_softmax")
_MODES = (None, "", "residual", "depth_softmax", "depth_attention")
#: Where their 3B recipes (``examples/released_models/train_3b_*_qknorm_gqa4x.yaml``) were read.
RECIPE_COMMITS = {"mhc": "bfe1df4", "attnres": "749d983", "denseformer": "bfe1df4"}


def looks_like_authors(values: Mapping[str, Any]) -> bool:
    """A ``model_type="llama"`` config with any key only the authors' modified Llama reads, and none of ours
    (``cross_layer``: some of their keys, ``mhc_num_streams``, ``attnres_block_size``, are ``ModelConfig`` fields)."""
    return values.get("model_type") == MODEL_TYPE and bool(AUTHOR_KEYS & set(values)) and "cross_layer" not in values


def _flag(values: Mapping[str, Any], key: str, source: str, default: bool = False) -> bool:
    value = values.get(key, default)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"{source}: {key}={value!r} is not true or false")
    return value


def _integer(values: Mapping[str, Any], key: str, source: str) -> int:
    value = values[key]
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
        raise ValueError(f"{source}: {key}={value!r} is not an integer")
    return int(value)


def _real(values: Mapping[str, Any], key: str, source: str, default: float) -> float:
    """``values[key]`` as a float (``default`` when absent or null); a ``ValueError`` naming ``source``, the key and
    the value for anything but a number."""
    value = values.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{source}: {key}={value!r} is not a number")
    return float(value)


def _first_int(values: Mapping[str, Any], keys: tuple[str, ...], default: int, source: str,
               skip_empty: bool = False) -> tuple[int, str]:
    """(the value of the first of ``keys`` the config has, its key); ``default`` and ``"default"`` without any.
    ``skip_empty``: a null or empty value counts as absent (their ``_positive_config_int_any``)."""
    for key in keys:
        if key in values and not (skip_empty and values[key] in (None, "")):
            return _integer(values, key, source), key
    return default, "default"


def _baseline(values: Mapping[str, Any], source: str) -> str | None:
    """Their ``_normalize_residual_baseline``: ``baseline_mode`` over the legacy ``residual_baseline``."""
    def one(key: str) -> str | None:
        value = values.get(key)
        if value in _NONE or str(value).strip().lower() in _NONE:
            return None
        name = str(value).strip().lower()
        if name not in _BASELINES:
            raise ValueError(f"{source}: {key}={value!r} is not a baseline their code runs "
                             f"(one of {sorted(_BASELINES)} or null)")
        return _BASELINES[name]

    mode, legacy = one("baseline_mode"), one("residual_baseline")
    if mode is not None and legacy is not None and mode != legacy:
        raise ValueError(f"{source}: baseline_mode={values['baseline_mode']!r} and residual_baseline="
                         f"{values['residual_baseline']!r} conflict (their code refuses two baselines)")
    return mode or legacy


def _depth_attention(values: Mapping[str, Any], source: str) -> tuple[bool, list[str]]:
    """(whether Depth-Attention is on, why not when off) as their ``LlamaModel`` decides."""
    pattern, mode = values.get("cross_layer_pattern"), values.get("cross_layer_mode")
    if pattern not in (None, *_DEPTH_PATTERNS):
        raise ValueError(f"{source}: cross_layer_pattern={pattern!r} is not a switch depthattn imports "
                         f"(only {_DEPTH_PATTERNS[1]!r} / {_DEPTH_PATTERNS[0]!r} for Depth-Attention, or null)")
    if mode not in _MODES:
        raise ValueError(f"{source}: cross_layer_mode={mode!r} is not a switch depthattn imports "
                         f"(only 'depth_softmax' for Depth-Attention, or 'residual' / null)")
    recurrent = _flag(values, "recurrent_model", source)
    asked = _flag(values, "use_depth_attention", source) or pattern in _DEPTH_PATTERNS
    if recurrent and asked:
        return True, []
    why = [] if asked else ["neither use_depth_attention nor cross_layer_pattern asks for Depth-Attention"]
    if not recurrent:
        why.append("recurrent_model is " + ("absent" if "recurrent_model" not in values else "false"))
    return False, why


def _refuse_unsupported(values: Mapping[str, Any], source: str) -> None:
    def refuse(key: str, why: str) -> None:
        raise ValueError(f"{source}: {key}={values.get(key)!r} is not supported ({why})")

    if values.get("model_type") != MODEL_TYPE:
        refuse("model_type", "a hyq718/Depth-Attention folder is a 'llama' one")
    if values.get("scale_embeds") not in (None, False):
        refuse("scale_embeds", "the core does not scale the embeddings")
    if values.get("rope_scaling") is not None:
        refuse("rope_scaling", "only default RoPE is implemented")
    tp = values.get("pretraining_tp", 1)
    if not isinstance(tp, int) or isinstance(tp, bool) or tp > 1:
        refuse("pretraining_tp", "only pretraining_tp=1 is implemented")
    for key in ("attention_bias", "mlp_bias"):
        if values.get(key):
            refuse(key, "the core's projections have no bias")
    if values.get("hidden_act", "silu") != "silu":
        refuse("hidden_act", "the core's MLP is SwiGLU with SiLU")
    for key in ("rope_theta", "rms_norm_eps", "initializer_range"):  # numbers (null: LlamaConfig's default)
        _real(values, key, source, 0.0)
    if _real(values, "attention_dropout", source, 0.0) != 0.0:
        refuse("attention_dropout", "the core has no attention dropout")
    if not _flag(values, "use_qk_norm", source, default=True):
        refuse("use_qk_norm", "depthattn imports their q/k-norm models only")
    if values.get("no_residual"):
        refuse("no_residual", "the core always adds the residual")
    if values.get("layer_kv_reuse_map"):
        refuse("layer_kv_reuse_map", "their cross-layer K/V reuse is not Depth-Attention")


def _backbone(values: Mapping[str, Any]) -> dict[str, Any]:
    v = {**LLAMA_DEFAULTS, **{k: values[k] for k in LLAMA_DEFAULTS if values.get(k) is not None}}
    heads = v["num_attention_heads"]
    return {"vocab_size": v["vocab_size"], "hidden_size": v["hidden_size"],
            "intermediate_size": v["intermediate_size"], "num_hidden_layers": v["num_hidden_layers"],
            "num_attention_heads": heads, "num_key_value_heads": v["num_key_value_heads"] or heads,
            "head_dim": v["head_dim"] or (v["hidden_size"] // heads if isinstance(heads, int) and heads else 0),
            "rope_theta": float(v["rope_theta"]), "rms_norm_eps": float(v["rms_norm_eps"]),
            "max_position_embeddings": v["max_position_embeddings"],
            "tie_word_embeddings": v["tie_word_embeddings"], "initializer_range": float(v["initializer_range"])}


def _method(values: Mapping[str, Any], source: str, stored: Mapping[str, Any]
            ) -> tuple[str, dict[str, Any], list[str]]:
    """(cross_layer, its ModelConfig fields, reasons it is off) of their switches."""
    baseline = _baseline(values, source)
    depth, off = _depth_attention(values, source)
    if baseline is not None and depth:
        raise ValueError(f"{source}: baseline_mode={values.get('baseline_mode')!r} and Depth-Attention are both on "
                         f"(their --patch_method picks which modelling file runs): cannot tell which model it is")
    if depth:
        stride, _ = _first_int(values, ("depth_attention_stride", "depth_softmax_stride"), 1, source)
        window, _ = _first_int(values, ("depth_attention_recent_window", "depth_recent_window"), 0, source)
        return "depth_attention", {"depth_attention_stride": max(1, stride),
                                   "depth_attention_window": max(0, window)}, []
    if baseline == "mhc":
        streams, key = _first_int(values, ("residual_baseline_num_streams", "mhc_num_streams"), 0, source, True)
        if key == "default":
            env = os.environ.get("MHC_NUM_STREAMS")
            if env in (None, ""):
                streams = 4
            elif env.strip().isdigit():
                streams = int(env)
            else:
                raise ValueError(f"{source}: the environment variable MHC_NUM_STREAMS={env!r} (their stream count "
                                 f"when the config has none) is not an integer")
        iters, _ = _first_int(values, ("mhc_sinkhorn_iters",), 20, source, True)
        alpha = _real(values, "mhc_alpha_init", source, 0.01)
        return "mhc", {"mhc_num_streams": max(1, streams), "mhc_sinkhorn_iters": max(1, iters),
                       "mhc_alpha_init": alpha, "mhc_sinkhorn": "exp"}, []
    if baseline == "attnres":
        block, _ = _first_int(values, ("attnres_block_size",), 12, source, True)
        recency = "model.attnres_final_aggregator.recency_bias" in stored
        init = _real(values, "attnres_recency_bias_init", source, 3.0) if recency else None
        return "attnres", {"attnres_block_size": max(1, block), "attnres_recency_bias": init}, []
    if baseline == "denseformer":
        keys = ("denseformer_dwa_dilation", "densetransformer_dwa_dilation")
        dilation, _ = _first_int(values, keys, 1, source, True)
        period, _ = _first_int(values, tuple(k.replace("dilation", "period") for k in keys), 1, source, True)
        return "denseformer", {"denseformer_dilation": max(1, dilation), "denseformer_period": max(1, period)}, []
    return "none", {}, off


def _norm_order(method: str, given: str | None) -> tuple[str, str]:
    """(qk_norm_position, why) for a checkpoint of ``method``."""
    if given is not None:
        if given not in QK_NORM_POSITIONS:
            raise ValueError(f"--qk-norm-position {given!r} is not one of {QK_NORM_POSITIONS}")
        return given, "as --qk-norm-position asks"
    if method == "depth_attention":
        return "k_after_rope", ("their Depth-Attention runs only in their SDPA attention class (their "
                                "FlashAttention-2 class refuses cross-layer K/V), which applies k_norm after RoPE")
    if method != "none":
        return "before_rope", (f"their 3B recipe examples/released_models/train_3b_{method}_qknorm_gqa4x.yaml"
                               f"@{RECIPE_COMMITS[method]} trains with flash_attn: fa2, whose attention class applies "
                               f"q_norm and k_norm before RoPE (their default SDPA loading applies k_norm after "
                               f"RoPE: --qk-norm-position k_after_rope runs it that way)")
    return "k_after_rope", ("their vanilla 3B recipe examples/released_models/train_3b_vanilla_qknorm_gqa4x.yaml"
                            "@adb36f2 trains with flash_attn: sdpa, whose attention class (their default loading) "
                            "applies k_norm after RoPE")


def authors_model_config(values: Mapping[str, Any], source: str, stored: Mapping[str, Any],
                         qk_norm_position: str | None = None, allow_vanilla: bool = False
                         ) -> tuple[ModelConfig, list[str]]:
    """(the ``ModelConfig`` of their ``config.json`` object ``values``, the lines saying what was chosen and why).

    ``stored``: their tensor names (→ shapes), which tell the AttnRes recency variant from the older form.
    ``qk_norm_position``: None picks per checkpoint (:func:`_norm_order`). Raises ``ValueError`` naming ``source``,
    the key and the value for anything refused (see the module docstring)."""
    _refuse_unsupported(values, source)
    method, fields, off = _method(values, source, stored)
    notes = []
    if method == "none":
        if not allow_vanilla:
            raise ValueError(f"{source}: its switches resolve to no cross-layer method ({'; '.join(off)}), so their "
                             f"code runs it as vanilla Llama + q/k-norm; pass --allow-vanilla to import it so "
                             f"(cross_layer='none')")
        notes.append(f"importing as vanilla (cross_layer='none'): {'; '.join(off)}")
    if (method == "depth_attention" and values.get("cross_layer_pattern") in _DEPTH_PATTERNS
            and values.get("cross_layer_mode") in (None, "residual") and "use_depth_attention" not in values):
        notes.append(f"read as Depth-Attention, as their newest code (3bdad70) runs it: cross_layer_pattern="
                     f"{values['cross_layer_pattern']!r} with cross_layer_mode={values.get('cross_layer_mode')!r}; "
                     f"their older code (019daf9) mixes only with cross_layer_mode='depth_softmax' "
                     f"(docs/authors-checkpoints.md)")
    order, why = _norm_order(method, qk_norm_position)
    notes.append(f"qk_norm_position={order}: {why}")
    try:
        cfg = ModelConfig.from_dict({**_backbone(values), "cross_layer": method, **fields,
                                     "qk_norm_position": order})
    except (ValueError, TypeError) as e:
        raise ValueError(f"{source}: {e}") from e
    return cfg, notes
