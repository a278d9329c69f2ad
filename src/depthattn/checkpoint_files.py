"""The Hugging Face side of a checkpoint folder: ``config.json`` (``model_type="depthattn"``),
``generation_config.json``, ``tokenizer_config.json``, the ``trust_remote_code`` modules, and the safetensors-header
shape check.

Every checkpoint folder depthattn writes is a Hugging Face model folder (docs/hf.md): ``config.json`` is exactly
what ``DepthAttnConfig.save_pretrained`` writes (the ``ModelConfig`` fields with RoPE in the transformers-v5 form
``rope_parameters = {"rope_theta": θ, "rope_type": "default"}``, plus ``model_type``, ``architectures``,
``auto_map``, ``dtype`` and the special-token ids), and the folder carries ``configuration.py`` / ``modeling.py``
(``depthattn/hf``'s own files) so that ``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)``
works in a process that imports only transformers. This module does not import transformers (``import depthattn``
must not); it writes JSON by hand and a test checks it against ``DepthAttnConfig``.

``config.json`` of the previous format (the flat ``ModelConfig`` dict, no ``model_type``) still reads.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import layout
from .config import ModelConfig
from .data.tokenizer import EOS_TOKEN, read_tokenizer
from .fileio import atomic_write_json, loads_json

MODEL_TYPE = "depthattn"
ARCHITECTURE = "DepthAttnForCausalLM"
GENERATION_CONFIG_NAME = layout.GENERATION_CONFIG_FILE
TOKENIZER_NAME = layout.TOKENIZER_FILE
TOKENIZER_CONFIG_NAME = layout.TOKENIZER_CONFIG_FILE
#: ``depthattn/hf`` modules copied into each folder for ``trust_remote_code`` (``auto_map`` points at them).
REMOTE_CODE_FILES = layout.REMOTE_CODE_FILES
AUTO_MAP = {"AutoConfig": "configuration.DepthAttnConfig", "AutoModelForCausalLM": "modeling.DepthAttnForCausalLM"}
SPECIAL_TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _transformers_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return None


def hf_config_dict(cfg: ModelConfig, dtype: str = "float32", token_ids: dict[str, int | None] | None = None
                   ) -> dict[str, Any]:
    """The ``config.json`` object of a checkpoint: ``DepthAttnConfig(cfg).to_dict()`` without importing transformers.

    ``dtype`` is the stored weights' dtype name (``"float32"``, ``"bfloat16"``); ``token_ids`` maps
    ``bos_token_id`` / ``eos_token_id`` / ``pad_token_id`` to ids (missing ones are null).
    """
    values = cfg.to_dict()
    theta = values.pop("rope_theta")
    values.update(model_type=MODEL_TYPE, architectures=[ARCHITECTURE], auto_map=dict(AUTO_MAP), dtype=dtype,
                  use_cache=True, rope_parameters={"rope_theta": float(theta), "rope_type": "default"})
    values.update({k: (token_ids or {}).get(k) for k in SPECIAL_TOKEN_KEYS})
    version = _transformers_version()
    if version:
        values["transformers_version"] = version
    return dict(sorted(values.items()))


def model_config_from_json(values: dict[str, Any], source: str) -> ModelConfig:
    """The ``ModelConfig`` of a checkpoint's ``config.json`` object (``source`` names the file in errors).

    Accepts the Hugging Face form (``model_type="depthattn"``) and the previous flat form (no ``model_type``). In
    the Hugging Face form only the ``ModelConfig`` fields are read (and validated); other keys (Hugging Face's
    ``use_cache``, ``output_hidden_states``, a user's own) are not the native model's and are skipped, except that
    a key that looks like a misspelt field is refused (``ModelConfig.check_extra_keys``). The flat form takes fields
    only. Raises ``ValueError`` naming ``source`` for a Qwen3 folder (with the command that converts it), another
    ``model_type``, a RoPE type other than default, a misspelt field or an invalid field.
    """
    model_type = values.get("model_type")
    if model_type == "qwen3":
        folder = os.path.dirname(source)
        raise ValueError(f"{folder} is a Hugging Face Qwen3 folder, not a depthattn checkpoint: open it with "
                         f"depthattn.hf.convert.load_any_model, or convert it with depthattn convert --from-qwen3")
    if model_type is not None and model_type != MODEL_TYPE:
        raise ValueError(f"{source}: model_type={model_type!r} is not a depthattn checkpoint (expected "
                         f"{MODEL_TYPE!r}, or a Hugging Face 'qwen3' folder for depthattn convert --from-qwen3)")
    if model_type is None:  # the previous format: the flat ModelConfig dict
        try:
            return ModelConfig.from_dict(values)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{source}: {e}") from e
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    ModelConfig.check_extra_keys(values, source)  # other keys are Hugging Face's or a user's: left to DepthAttnConfig
    fields = {k: v for k, v in values.items() if k in names}
    rope = values.get("rope_parameters") or {}
    if not isinstance(rope, dict) or rope.get("rope_type", "default") != "default" or set(rope) - {
            "rope_theta", "rope_type"}:
        raise ValueError(f"{source}: rope_parameters={rope!r} is not supported (only {{'rope_theta': θ, "
                         f"'rope_type': 'default'}})")
    if "rope_theta" in rope:
        fields["rope_theta"] = float(rope["rope_theta"])
    try:
        return ModelConfig.from_dict(fields)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from e


def tokenizer_token_ids(tokenizer_file: str | os.PathLike) -> dict[str, int | None]:
    """``eos_token_id`` and ``pad_token_id`` (both ``<|endoftext|>``, as training pads) of a ``tokenizer.json``;
    empty when it has no ``<|endoftext|>``."""
    eos = read_tokenizer(tokenizer_file).token_to_id(EOS_TOKEN)
    return {} if eos is None else {"eos_token_id": eos, "pad_token_id": eos}


def write_tokenizer_config(folder: str | os.PathLike, max_length: int | None = None) -> None:
    """A ``tokenizer_config.json`` so that ``AutoTokenizer.from_pretrained(folder)`` loads ``tokenizer.json`` as it is
    (``PreTrainedTokenizerFast``; without it transformers would pick a tokenizer class from ``model_type``), with
    ``<|endoftext|>`` as EOS and padding token when the tokenizer has it."""
    values: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    if read_tokenizer(os.path.join(os.fspath(folder), TOKENIZER_NAME)).token_to_id(EOS_TOKEN) is not None:
        values.update(eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)
    if max_length is not None:
        values["model_max_length"] = int(max_length)
    atomic_write_json(os.path.join(os.fspath(folder), TOKENIZER_CONFIG_NAME), values)


def write_hf_files(folder: str | os.PathLike, cfg: ModelConfig, dtype: str,
                   token_ids: dict[str, int | None] | None) -> None:
    """``config.json``, ``generation_config.json`` and the ``trust_remote_code`` modules into ``folder``."""
    folder = os.fspath(folder)
    token_ids = {k: v for k, v in (token_ids or {}).items() if k in SPECIAL_TOKEN_KEYS and v is not None}
    atomic_write_json(os.path.join(folder, layout.CONFIG_FILE), hf_config_dict(cfg, dtype, token_ids))
    generation = {"_from_model_config": True, **token_ids, "output_attentions": False, "output_hidden_states": False,
                  "use_cache": True}
    version = _transformers_version()
    if version:
        generation["transformers_version"] = version
    atomic_write_json(os.path.join(folder, GENERATION_CONFIG_NAME), generation)
    here = Path(__file__).parent / "hf"
    for name in REMOTE_CODE_FILES:
        shutil.copyfile(here / name, os.path.join(folder, name))


def safetensors_shapes(file: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape from a safetensors file's header only (no tensor is read). Raises ``ValueError`` naming
    the file if the header is truncated or not safetensors."""
    try:
        with open(file, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100_000_000:
                raise ValueError(f"header length {n}")
            header = loads_json(f.read(n), os.fspath(file))
            if not isinstance(header, dict) or not all(
                    isinstance(v, dict) and isinstance(v.get("shape"), list) for k, v in header.items()
                    if k != "__metadata__"):
                raise ValueError("not a safetensors header (expected {name: {dtype, shape, data_offsets}})")
    except (OSError, struct.error, ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read weights {os.fspath(file)} (truncated or corrupt?): {e}") from e
    return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def _layer_count(stored: dict[str, tuple[int, ...]]) -> int:
    """1 + the highest ``model.layers.{i}.`` index among the tensor names (0 without layers)."""
    indices = [int(m.group(1)) for m in map(_LAYER_KEY.match, stored) if m]
    return max(indices) + 1 if indices else 0


_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")


def check_header_fields(values: Mapping[str, Any], stored: dict[str, tuple[int, ...]], config_file: str | os.PathLike,
                        weights: str | os.PathLike) -> None:
    """Refuse a ``config.json`` object (``values``, raw: before any ``ModelConfig`` or model is built) whose sizes
    disagree with the tensors of its weights (``stored``: name → shape from the safetensors header):
    ``num_hidden_layers`` against the layers stored and ``vocab_size`` / ``hidden_size`` against
    ``model.embed_tokens.weight`` -- the sizes that decide how much even a meta-device model costs to build; the
    other shapes are left to :func:`check_shapes`. Fields the object lacks (Qwen3 defaults) are skipped. One
    ``ValueError`` naming the file and field.

    A ``config.json`` edited to ``num_hidden_layers = 10**9`` is refused here, in microseconds, instead of building
    layers until memory runs out."""
    def need(field: str, wanted: int, found: str) -> None:
        value = values.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value != wanted:
            raise ValueError(f"{os.fspath(config_file)}: {field}={value} disagrees with {os.fspath(weights)}, which "
                             f"holds {found}; fix {field} (or use the weights written with this config)")

    layers = _layer_count(stored)
    if layers or "model.embed_tokens.weight" in stored:
        need("num_hidden_layers", layers, f"{layers} layers (model.layers.0 … model.layers.{layers - 1})"
             if layers else "no layers")
    embed = stored.get("model.embed_tokens.weight")
    if embed is not None and len(embed) == 2:
        need("vocab_size", embed[0], f"model.embed_tokens.weight of shape {tuple(embed)}")
        need("hidden_size", embed[1], f"model.embed_tokens.weight of shape {tuple(embed)}")


def check_shapes(cfg: ModelConfig, expected: dict[str, tuple[int, ...]], file: str | os.PathLike,
                 config_file: str | os.PathLike, stored: dict[str, tuple[int, ...]] | None = None
                 ) -> dict[str, tuple[int, ...]]:
    """Refuse a weights file whose header shapes disagree with the shapes ``cfg`` needs (``expected``: name → shape
    of the model ``cfg`` builds); run before the model is built. One ``ValueError`` naming both files. ``stored``:
    the header's shapes when already read (else read from ``file``). Returns the stored shapes (keys one side lacks are left to the strict loader)."""
    stored = safetensors_shapes(file) if stored is None else stored
    for key, shape in expected.items():
        if key in stored and tuple(stored[key]) != tuple(shape):
            raise ValueError(f"{os.fspath(config_file)} disagrees with {os.fspath(file)}: {key} is stored with shape "
                             f"{tuple(stored[key])}, but the config (hidden_size={cfg.hidden_size}, vocab_size="
                             f"{cfg.vocab_size}, intermediate_size={cfg.intermediate_size}, num_attention_heads="
                             f"{cfg.num_attention_heads}, num_key_value_heads={cfg.num_key_value_heads}, head_dim="
                             f"{cfg.head_dim}) needs {tuple(shape)}")
    return stored
