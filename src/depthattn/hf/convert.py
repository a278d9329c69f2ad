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

from depthattn.checkpoint import model_from_folder, save_model_files, save_safetensors
from depthattn.checkpoint_files import write_tokenizer_config
from depthattn.config import ModelConfig, read_json_object
from depthattn.fileio import write_folder_atomically
from depthattn.folders import open_model
from depthattn.folders.base import hf_token_ids as qwen3_token_ids
from depthattn.folders.qwen3 import (SHARED_FIELDS, is_qwen3_folder, open_qwen3,
                                     qwen3_to_model_config, read_qwen3_state)
from depthattn.layout import CONFIG_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE
from depthattn.model import DecoderLM
from depthattn.outputs import MODEL_FOLDER, check_output

__all__ = [
    "SHARED_FIELDS", "TOKENIZER_FILES", "convert_from_authors", "convert_from_qwen3", "convert_to_qwen3",
    "copy_tokenizer_files", "is_qwen3_folder", "load_any_model", "load_qwen3", "model_config_to_qwen3", "open_qwen3",
    "qwen3_to_model_config", "qwen3_token_ids", "read_qwen3_state", "save_qwen3", "upgrade_checkpoint",
]

#: Tokenizer files carried over by ``convert_from_qwen3`` / ``convert_to_qwen3`` when the source has them.
TOKENIZER_FILES = (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, "special_tokens_map.json")


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


def load_qwen3(path: str | os.PathLike, **overrides: Any) -> DecoderLM:
    """Build a ``DecoderLM`` from a Hugging Face Qwen3 folder (as ``Qwen3ForCausalLM.save_pretrained`` writes it).

    ``overrides`` select the method (``cross_layer="depth_attention"``, knobs). Qwen3 tensors load 1:1 (float32
    or their stored dtype, cast to the model's float32); parameters only our method has (``*.cross_layer.*``) keep
    their vanilla-equivalent init. Raises ``ValueError`` naming the file for unknown or missing tensors or shapes
    (``depthattn.folders.qwen3.open_qwen3``).
    """
    return model_from_folder(open_qwen3(path, **overrides))


def load_any_model(path: str | os.PathLike, device: torch.device | str = "cpu",
                   dtype: torch.dtype | None = None) -> DecoderLM:
    """Open any model folder for inference, in eval mode on ``device`` (and ``dtype``): a depthattn checkpoint, a
    Hugging Face Qwen3 folder (loaded as ``cross_layer="none"``) or an authors' folder (hyq718/Depth-Attention,
    its q/k-norm order chosen per checkpoint: ``depthattn.folders.authors_config``); a sharded FSDP checkpoint is
    refused naming ``depthattn export``. Raises ``ValueError`` / ``FileNotFoundError`` naming the file."""
    return model_from_folder(open_model(path, ("depthattn", "qwen3", "authors")), device, dtype)


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
        save_safetensors(state, os.path.join(tmp, WEIGHTS_FILE))
        with open(os.path.join(tmp, CONFIG_FILE), "w", encoding="utf-8") as f:
            json.dump(values, f, indent=2, sort_keys=True)
            f.write("\n")
        if tokenizer_dir is not None:
            written[:] = copy_tokenizer_files(tokenizer_dir, tmp)
            if TOKENIZER_FILE in written and TOKENIZER_CONFIG_FILE not in written:
                write_tokenizer_config(tmp)
                written.append(TOKENIZER_CONFIG_FILE)

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
    if os.path.basename(file) != TOKENIZER_FILE:
        read_json_object(file, "tokenizer file")
        return
    from depthattn.data.tokenizer import read_tokenizer

    read_tokenizer(file)


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
        model = model_from_folder(open_model(folder, ("depthattn",)))  # a Llama folder: "use --from-authors"
        tok = folder / TOKENIZER_NAME
        save_model(model, out, tokenizer_file=tok if tok.is_file() else None)
    return model, folder


def _tokenizer_file(path: str | os.PathLike, vocab_size: int) -> Path:
    """``path`` (a ``tokenizer.json``, or a folder holding one) checked as a tokenizer of at most ``vocab_size``
    tokens (``data.tokenizer.read_tokenizer``); ``ValueError`` naming it."""
    from depthattn.data.tokenizer import read_tokenizer

    file = Path(path) / TOKENIZER_FILE if Path(path).is_dir() else Path(path)
    if not file.is_file():
        raise ValueError(f"--tokenizer {os.fspath(path)}: no tokenizer.json there")
    read_tokenizer(file, vocab_size)
    return file


def convert_from_authors(src: str | os.PathLike, out: str | os.PathLike, tokenizer: str | os.PathLike | None = None,
                         dtype: torch.dtype | None = None, qk_norm_position: str | None = None,
                         allow_vanilla: bool = False, overwrite: bool = False,
                         shard_bytes: int | None = None) -> tuple[Any, list[str]]:
    """An authors' folder (hyq718/Depth-Attention: ``config.json`` + safetensors, one file or sharded) → a depthattn
    checkpoint folder, streamed one tensor at a time (``checkpoint.save_folder_files``: no model is built, no two
    copies of the weights are held), written atomically. Returns (the opened ``ModelFolder``, whose ``notes`` say
    what was chosen and why; the tokenizer files written).

    ``tokenizer``: a ``tokenizer.json`` (or a folder with one) to ship in the folder; without it the source's
    tokenizer files are copied when it has them. ``dtype``: of the weights written (default: the source's
    ``torch_dtype``). ``qk_norm_position`` / ``allow_vanilla``: ``depthattn.folders.authors_config``.
    ``shard_bytes``: the largest safetensors shard (default ``folders.shards.DEFAULT_SHARD_BYTES``). Raises
    ``ValueError`` (one line) for anything the reader refuses and for an ``out`` :func:`_check_out` refuses."""
    from depthattn.checkpoint import save_folder_files
    from depthattn.folders.authors import open_authors
    from depthattn.folders.shards import DEFAULT_SHARD_BYTES

    out = _check_out(out, [src] + ([tokenizer] if tokenizer is not None else []), overwrite)
    folder = open_authors(src, qk_norm_position, allow_vanilla)
    tok = _tokenizer_file(tokenizer, folder.config.vocab_size) if tokenizer is not None else None
    written: list[str] = []

    def fill(tmp: str) -> None:
        if tok is None:
            written[:] = copy_tokenizer_files(src, tmp)
        save_folder_files(folder, tmp, dtype, tok, shard_bytes or DEFAULT_SHARD_BYTES)
        if tok is not None:
            written[:] = [n for n in (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE)
                          if os.path.isfile(os.path.join(tmp, n))]

    write_folder_atomically(out, fill)
    return folder, written
