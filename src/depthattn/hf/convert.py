"""Hugging Face Qwen3 checkpoints in and out.

Our parameter names are Hugging Face Qwen3's (``model.embed_tokens``, ``model.layers.{i}.self_attn.{q,k,v,o}_proj``,
``…{q,k}_norm``, ``…mlp.{gate,up,down}_proj``, ``…input_layernorm``, ``…post_attention_layernorm``, ``model.norm``,
``lm_head``), so conversion is a config mapping plus a strict 1:1 copy of tensors:

* **in** (any ``cross_layer``): Depth-Attention adds no parameters, so a Qwen3 checkpoint loads exactly; methods
  with parameters (``*.cross_layer.*``) keep their vanilla-equivalent initialisation from ``DecoderLM.init_weights``.
* **out** (``cross_layer="none"``, ``num_loops=1``, ``qk_norm_position="before_rope"`` only): a folder that
  ``Qwen3ForCausalLM.from_pretrained`` loads.

The tokenizer travels with the weights: ``convert_from_qwen3`` copies the source's ``TOKENIZER_FILES`` that exist
(``tokenizer.json`` is what depthattn itself loads), ``convert_to_qwen3`` copies the checkpoint's, and writes a
minimal ``tokenizer_config.json`` (``PreTrainedTokenizerFast``) when the checkpoint has none (one of the previous
format), so that
``AutoTokenizer.from_pretrained(OUT)`` loads ``tokenizer.json`` (without it, transformers would pick the Qwen2
tokenizer class from ``model_type`` and misread a depthattn tokenizer). Both refuse an existing ``out`` unless
``overwrite=True``; the output folder is always written atomically.

Qwen3 features the core does not implement are refused with a ``ValueError`` naming the field: attention bias,
sliding-window layers, RoPE scaling (``rope_type`` other than ``"default"``), an activation other than SiLU,
attention dropout, and head layouts the core cannot express (``num_attention_heads`` not a multiple of
``num_key_value_heads``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from depthattn.accounting import check_model_fits
from depthattn.checkpoint import (expected_shapes, load_model, load_weights_into, read_safetensors, save_model_files,
                                  save_safetensors)
from depthattn.checkpoint_files import check_header_fields, check_shapes, safetensors_shapes, write_tokenizer_config
from depthattn.config import MAX_LAYERS, ModelConfig, read_json_object
from depthattn.fileio import read_manifest, verify_manifest, write_folder_atomically
from depthattn.model import DecoderLM
from depthattn.outputs import MODEL_FOLDER, check_output

#: ModelConfig fields whose Qwen3Config field has the same name and meaning.
SHARED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings",
                 "tie_word_embeddings", "initializer_range")

#: Tokenizer files carried over by ``convert_from_qwen3`` / ``convert_to_qwen3`` when the source has them.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: not a Hugging Face checkpoint folder")
    return read_json_object(path, "Hugging Face config")


def is_qwen3_folder(path: str | os.PathLike) -> bool:
    """True when ``path/config.json`` exists and declares ``"model_type": "qwen3"``."""
    file = os.path.join(os.fspath(path), "config.json")
    if not os.path.isfile(file):
        return False
    try:
        return _read_json(file).get("model_type") == "qwen3"
    except ValueError:
        return False


def _is_qwen3_config(values: dict[str, Any]) -> bool:
    architectures = values.get("architectures") or []
    return values.get("model_type") == "qwen3" or (isinstance(architectures, list)
                                                   and "Qwen3ForCausalLM" in architectures)


def qwen3_to_model_config(values: dict[str, Any], source: str = "Qwen3 config", **overrides: Any) -> ModelConfig:
    """Map a Qwen3 ``config.json`` dict (v4 ``rope_theta`` or v5 ``rope_parameters`` form) to a ``ModelConfig``.

    ``overrides`` set depthattn-only fields (``cross_layer``, method knobs). Raises ``ValueError`` naming the field
    for any Qwen3 feature the core does not implement.
    """
    def refuse(field: str, why: str) -> None:
        raise ValueError(f"{source}: {field}={values.get(field)!r} is not supported ({why})")

    if values.get("model_type", "qwen3") != "qwen3":
        refuse("model_type", "expected 'qwen3'")
    if values.get("attention_bias", False):
        refuse("attention_bias", "the core's projections have no bias")
    if values.get("use_sliding_window", False):
        refuse("use_sliding_window", "the core uses full causal attention in every layer")
    layer_types = values.get("layer_types")
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        refuse("layer_types", "only 'full_attention' layers exist in the core")
    if values.get("hidden_act", "silu") != "silu":
        refuse("hidden_act", "the core's MLP is SwiGLU with SiLU")
    if float(values.get("attention_dropout", 0.0) or 0.0) != 0.0:
        refuse("attention_dropout", "the core has no attention dropout")
    if values.get("rope_scaling"):
        refuse("rope_scaling", "only default RoPE is implemented")
    rope = values.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" or set(rope) - {"rope_theta", "rope_type"}:
        refuse("rope_parameters", "only {'rope_theta': θ, 'rope_type': 'default'} is implemented")
    layers = values.get("num_hidden_layers")
    if isinstance(layers, int) and layers > MAX_LAYERS:  # before Qwen3Config builds a list of that many layer types
        refuse("num_hidden_layers", f"more than {MAX_LAYERS} layers (depthattn.config.MAX_LAYERS) cannot be built")
    # Every field the dict leaves out takes exactly the value transformers.Qwen3Config resolves (head_dim 128,
    # vocab_size 151936, max_position_embeddings 32768, num_key_value_heads, rope_theta, ...), not our own defaults.
    from transformers import Qwen3Config
    try:
        qwen3 = Qwen3Config(**values)
    except Exception as e:  # huggingface_hub's strict-dataclass validation errors, TypeError, ValueError
        raise ValueError(f"{source}: not a valid Qwen3Config: {e}") from e
    rope = dict(qwen3.rope_parameters or {})
    if rope.get("rope_type", "default") != "default" or set(rope) - {"rope_theta", "rope_type"}:
        refuse("rope_parameters", "only {'rope_theta': θ, 'rope_type': 'default'} is implemented")
    if any(t != "full_attention" for t in (qwen3.layer_types or ())):
        refuse("layer_types", "only 'full_attention' layers exist in the core")
    theta = rope.get("rope_theta", 10000.0)
    fields: dict[str, Any] = {name: getattr(qwen3, name) for name in SHARED_FIELDS}
    heads, kv = fields.get("num_attention_heads"), fields.get("num_key_value_heads")
    if heads is not None and kv is not None and (kv < 1 or heads % kv):
        refuse("num_key_value_heads", f"num_attention_heads={heads} must be a multiple of it (GQA layout)")
    fields["rope_theta"] = float(theta)
    fields.update(overrides)
    return ModelConfig.from_dict(fields)


def model_config_to_qwen3(cfg: ModelConfig) -> dict[str, Any]:
    """The ``Qwen3Config`` keyword arguments for a ``cross_layer="none"``, unlooped ``ModelConfig``.

    Raises ``ValueError`` for any other method (Qwen3 has no cross-layer mixing), ``num_loops > 1`` or
    ``qk_norm_position`` other than ``"before_rope"`` (Qwen3's order).
    """
    if cfg.cross_layer != "none":
        raise ValueError(f"cannot export cross_layer={cfg.cross_layer!r} to Qwen3: only cross_layer='none' models are "
                         f"plain Qwen3 (Qwen3ForCausalLM has no cross-layer mixing); share it as a depthattn "
                         f"checkpoint or with DepthAttnForCausalLM.save_pretrained instead")
    if cfg.num_loops != 1:
        raise ValueError(f"cannot export num_loops={cfg.num_loops} to Qwen3: a looped model reuses its layers, "
                         f"which Qwen3ForCausalLM cannot express")
    if cfg.qk_norm_position != "before_rope":
        raise ValueError(f"cannot export qk_norm_position={cfg.qk_norm_position!r} to Qwen3: Qwen3ForCausalLM applies "
                         f"k_norm before RoPE, and no weight mapping turns one order into the other; share it as a "
                         f"depthattn checkpoint instead")
    values = {name: getattr(cfg, name) for name in SHARED_FIELDS}
    values.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_act="silu", attention_bias=False,
                  attention_dropout=0.0, use_sliding_window=False, use_cache=True,
                  rope_parameters={"rope_theta": float(cfg.rope_theta), "rope_type": "default"})
    return values


def read_qwen3_state(path: str) -> dict[str, torch.Tensor]:
    """Tensors of a Hugging Face folder: ``model.safetensors`` or a sharded ``model.safetensors.index.json``."""
    single = os.path.join(path, "model.safetensors")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(single):
        files = [single]
    elif os.path.isfile(index):
        files = [os.path.join(path, f) for f in sorted(set(_read_json(index).get("weight_map", {}).values()))]
    else:
        raise FileNotFoundError(f"{path} has neither model.safetensors nor model.safetensors.index.json")
    digests = read_manifest(path)  # a folder depthattn wrote (convert --to-qwen3) has checksums.json
    state: dict[str, torch.Tensor] = {}
    for file in files:
        if digests is not None:
            verify_manifest(path, [os.path.relpath(file, path).replace(os.sep, "/")])
        state.update(read_safetensors(file))
    return state


def _qwen3_header(path: str, values: dict[str, Any], file: str) -> tuple[str, dict[str, tuple[int, ...]]] | None:
    """The raw ``config.json`` sizes against the safetensors header(s) (``check_header_fields``), before
    ``Qwen3Config`` (which builds a list of ``num_hidden_layers`` layer types) or a model is built; returns (the
    weights file named in errors, name → shape of every stored tensor), None without weights."""
    single = os.path.join(path, "model.safetensors")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(single):
        weights, stored = single, safetensors_shapes(single)
    elif os.path.isfile(index):
        weights, stored = index, {}
        for name in sorted(set(_read_json(index).get("weight_map", {}).values())):
            stored.update(safetensors_shapes(os.path.join(path, name)))
    else:
        return None
    check_header_fields(values, stored, file, weights)
    return weights, stored


def load_qwen3(path: str | os.PathLike, **overrides: Any) -> DecoderLM:
    """Build a ``DecoderLM`` from a Hugging Face Qwen3 folder (as ``Qwen3ForCausalLM.save_pretrained`` writes it).

    ``overrides`` select the method (``cross_layer="depth_attention"``, knobs). Qwen3 tensors load 1:1 (float32
    or their stored dtype, cast to the model's float32); parameters only our method has (``*.cross_layer.*``) keep
    their vanilla-equivalent init. Raises ``ValueError`` naming the file for unknown or missing tensors or shapes.
    """
    path = os.fspath(path)
    file = os.path.join(path, "config.json")
    verify_manifest(path)  # a folder we wrote (convert --to-qwen3): every file before any header is parsed
    values = _read_json(file)
    if not _is_qwen3_config(values):
        hint = (" (it looks like a depthattn checkpoint: use it as it is, or export it with --to-qwen3)"
                if "cross_layer" in values else "")
        raise ValueError(f"{path} is not a Hugging Face Qwen3 folder: {file} has model_type="
                         f"{values.get('model_type')!r} and architectures={values.get('architectures')!r}, "
                         f"expected model_type 'qwen3' or architectures containing 'Qwen3ForCausalLM'{hint}")
    header = _qwen3_header(path, values, file)
    cfg = qwen3_to_model_config(values, source=file, **overrides)
    if header is not None:  # every shape against a meta-device model, before the real one is allocated
        check_shapes(cfg, expected_shapes(cfg), header[0], file, header[1])
    check_model_fits(cfg, "cpu", torch.float32, path)
    state = read_qwen3_state(path)
    model = DecoderLM(cfg)
    load_weights_into(model, state, path, kind="qwen3")
    return model.eval()


def load_any_model(path: str | os.PathLike, device: torch.device | str = "cpu",
                   dtype: torch.dtype | None = None) -> DecoderLM:
    """Open any model folder for inference, in eval mode on ``device`` (and ``dtype``): a depthattn checkpoint
    (``depthattn.checkpoint.load_model``) or a Hugging Face Qwen3 folder (``"model_type": "qwen3"``, loaded as
    ``cross_layer="none"`` by ``load_qwen3``). Raises ``ValueError`` / ``FileNotFoundError`` naming the file."""
    if not is_qwen3_folder(path):
        return load_model(path, device=device, dtype=dtype)
    model = load_qwen3(path).to(device=device)
    if dtype is not None:
        model.to(dtype=dtype)
    return model.eval()


def save_qwen3(model: DecoderLM, path: str | os.PathLike,
               tokenizer_dir: str | os.PathLike | None = None) -> list[str]:
    """Write ``model`` (``cross_layer="none"``) as a Hugging Face Qwen3 folder, atomically.

    Writes ``config.json`` (``model_type="qwen3"``, v5 ``rope_parameters``, and the ``eos_token_id`` /
    ``pad_token_id`` of ``tokenizer_dir``'s ``config.json`` / ``generation_config.json`` when it has them) and
    ``model.safetensors`` (tied ``lm_head`` stored once, as transformers does). With ``tokenizer_dir``, its
    ``TOKENIZER_FILES`` are copied too (plus a minimal ``tokenizer_config.json`` when it has ``tokenizer.json`` only). Returns the tokenizer files
    written. Raises ``ValueError`` for models Qwen3 cannot express.
    """
    values = model_config_to_qwen3(model.config)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    dtype = next(iter(state.values())).dtype
    values["dtype"] = str(dtype).removeprefix("torch.")
    token_ids = qwen3_token_ids(tokenizer_dir) if tokenizer_dir is not None else None
    values.update(token_ids or {})  # the checkpoint's EOS / padding ids, so generate() stops there too

    written: list[str] = []

    def fill(tmp: str) -> None:
        save_safetensors(state, os.path.join(tmp, "model.safetensors"))
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(values, f, indent=2, sort_keys=True)
            f.write("\n")
        if tokenizer_dir is not None:
            written[:] = copy_tokenizer_files(tokenizer_dir, tmp)
            if "tokenizer.json" in written and "tokenizer_config.json" not in written:
                write_tokenizer_config(tmp)
                written.append("tokenizer_config.json")

    write_folder_atomically(path, fill)
    return written


def copy_tokenizer_files(src: str | os.PathLike, dst: str | os.PathLike) -> list[str]:
    """Copy those of ``TOKENIZER_FILES`` that exist in folder ``src`` into folder ``dst``; returns their names.
    Each is parsed first (``tokenizer.json`` by ``tokenizers``, the others as JSON objects), so a truncated or
    corrupt file raises ``ValueError`` naming it instead of being copied into a folder that looks valid."""
    copied = []
    for name in TOKENIZER_FILES:
        file = os.path.join(os.fspath(src), name)
        if os.path.isfile(file):
            _check_tokenizer_file(file)
            shutil.copyfile(file, os.path.join(os.fspath(dst), name))
            copied.append(name)
    return copied


def _check_tokenizer_file(file: str) -> None:
    if os.path.basename(file) != "tokenizer.json":
        read_json_object(file, "tokenizer file")
        return
    from depthattn.data.tokenizer import read_tokenizer

    read_tokenizer(file)


def qwen3_token_ids(path: str | os.PathLike) -> dict[str, int | None] | None:
    """``bos``/``eos``/``pad_token_id`` of a Hugging Face folder: ``generation_config.json`` over ``config.json``
    (``generate`` stops at the former's); None when neither names any (the tokenizer's EOS is used then). A missing
    ``pad_token_id`` is the EOS id."""
    ids: dict[str, int | None] = {}
    for name in ("config.json", "generation_config.json"):
        file = os.path.join(os.fspath(path), name)
        if os.path.isfile(file):
            values = read_json_object(file, "Hugging Face config")
            ids.update({k: values[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                        if values.get(k) is not None})
    if ids and "pad_token_id" not in ids and isinstance(ids.get("eos_token_id"), int):
        ids["pad_token_id"] = ids["eos_token_id"]
    return ids or None


def _check_out(out: str | os.PathLike, sources: list[str | os.PathLike], overwrite: bool) -> Path:
    """The folder to write for ``out`` (:func:`depthattn.outputs.check_output`: not a source, not inside or around
    one; an existing one only with ``overwrite`` and only a model folder we wrote)."""
    return check_output(out, sources, MODEL_FOLDER, overwrite)


def convert_from_qwen3(src: str | os.PathLike, out: str | os.PathLike, overwrite: bool = False,
                       **overrides: Any) -> tuple[DecoderLM, list[str]]:
    """Qwen3 folder → depthattn checkpoint folder (weights, ``config.json`` and the source's tokenizer files),
    written atomically; returns (model, tokenizer files copied). Raises ``ValueError`` if ``src`` is not a Qwen3
    folder, or if ``out`` exists and not ``overwrite`` (or is not a model folder we wrote, or is, holds or lies inside
    ``src``)."""
    out = _check_out(out, [src], overwrite)
    model = load_qwen3(src, **overrides)

    def fill(tmp: str) -> None:
        copied[:] = copy_tokenizer_files(src, tmp)  # verbatim, before save_model_files completes the tokenizer
        save_model_files(model, tmp, token_ids=qwen3_token_ids(src))

    copied: list[str] = []
    write_folder_atomically(out, fill)
    return model, copied


def convert_to_qwen3(ckpt: str | os.PathLike, out: str | os.PathLike,
                     overwrite: bool = False) -> tuple[DecoderLM, Path, list[str]]:
    """depthattn checkpoint (or run folder: its newest checkpoint; a Qwen3 folder is re-exported) → Hugging Face
    Qwen3 folder with the checkpoint's tokenizer; returns (model, checkpoint folder used, tokenizer files written). Raises
    ``ValueError`` for a method Qwen3 cannot express, or for an ``out`` :func:`_check_out` refuses."""
    from depthattn.checkpoint import open_checkpoint

    with open_checkpoint(ckpt) as folder:  # a run folder: its newest checkpoint, under a shared lock
        out = _check_out(out, [ckpt, folder], overwrite)
        model = load_any_model(folder)
        return model, folder, save_qwen3(model, out, tokenizer_dir=folder)


def upgrade_checkpoint(ckpt: str | os.PathLike, out: str | os.PathLike, overwrite: bool = False) -> tuple[DecoderLM, Path]:
    """Re-write a depthattn checkpoint (or a run folder's newest; any format this version reads, e.g. the flat
    ``config.json`` written before checkpoints were Hugging Face folders) as a Hugging Face model folder with its
    ``tokenizer.json``; returns (model, checkpoint folder used). Raises ``ValueError`` for an ``out``
    :func:`_check_out` refuses."""
    from depthattn.checkpoint import TOKENIZER_NAME, open_checkpoint, save_model

    with open_checkpoint(ckpt) as folder:  # a run folder: its newest checkpoint, under a shared lock
        out = _check_out(out, [ckpt, folder], overwrite)
        model = load_model(folder)
        tok = folder / TOKENIZER_NAME
        save_model(model, out, tokenizer_file=tok if tok.is_file() else None)
    return model, folder
