"""Reader of Hugging Face Qwen3 folders (as ``Qwen3ForCausalLM.save_pretrained`` writes them).

Our parameter names are Qwen3's, so the tensors pass through 1:1; a method's own parameters (``*.cross_layer.*``)
are absent and keep their vanilla-equivalent initialisation when loaded (``kind="qwen3"``). Qwen3 features the core
does not implement are refused with a ``ValueError`` naming the field (:func:`qwen3_to_model_config`). transformers
is imported only to resolve the fields a ``config.json`` leaves out exactly as ``Qwen3Config`` does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..checkpoint_files import check_header_fields, check_shapes
from ..config import MAX_LAYERS, ModelConfig, read_json_object
from ..fileio import read_manifest, verify_manifest
from .authors_config import looks_like_authors
from .base import LazyTensors, ModelFolder, expected_shapes, hf_token_ids
from ..layout import CONFIG_FILE
from .native import read_safetensors
from .shards import read_tensor, stored_shapes, weight_files

#: ModelConfig fields whose Qwen3Config field has the same name and meaning.
SHARED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings",
                 "tie_word_embeddings", "initializer_range")


def read_hf_config(path: str) -> dict[str, Any]:
    """The JSON object of a Hugging Face ``config.json`` (``FileNotFoundError`` / ``ValueError`` naming it)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: not a Hugging Face checkpoint folder")
    return read_json_object(path, "Hugging Face config")


def is_qwen3_folder(path: str | os.PathLike) -> bool:
    """True when ``path/config.json`` exists and declares ``"model_type": "qwen3"``."""
    file = os.path.join(os.fspath(path), CONFIG_FILE)
    if not os.path.isfile(file):
        return False
    try:
        return read_hf_config(file).get("model_type") == "qwen3"
    except ValueError:
        return False


def is_qwen3_config(values: dict[str, Any]) -> bool:
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


def _files(path: str) -> tuple[str, dict[str, str]]:
    found = weight_files(path)
    if found is None:
        raise FileNotFoundError(f"{path} has neither model.safetensors nor model.safetensors.index.json")
    return found


def read_qwen3_state(path: str) -> dict[str, Any]:
    """Tensors of a Hugging Face folder: ``model.safetensors`` or a sharded ``model.safetensors.index.json``."""
    _, where = _files(path)
    digests = read_manifest(path)  # a folder depthattn wrote (convert --to-qwen3) has checksums.json
    state: dict[str, Any] = {}
    for file in sorted(set(where.values())):
        if digests is not None:
            verify_manifest(path, [os.path.relpath(file, path).replace(os.sep, "/")])
        state.update(read_safetensors(file))
    return state


def not_qwen3_message(path: str, file: str, values: dict[str, Any]) -> str:
    """The one line for a folder that is not Qwen3: what it says it is, and the command that reads it."""
    if looks_like_authors(values):
        hint = (" (it looks like a hyq718/Depth-Attention checkpoint: convert it with depthattn convert "
                "--from-authors)")
    elif "cross_layer" in values:
        hint = " (it looks like a depthattn checkpoint: use it as it is, or export it with --to-qwen3)"
    else:
        hint = ""
    return (f"{path} is not a Hugging Face Qwen3 folder: {file} has model_type={values.get('model_type')!r} and "
            f"architectures={values.get('architectures')!r}, expected model_type 'qwen3' or architectures "
            f"containing 'Qwen3ForCausalLM'{hint}")


def open_qwen3(path: str | os.PathLike, **overrides: Any) -> ModelFolder:
    """A Qwen3 folder as a :class:`~depthattn.folders.base.ModelFolder` (``kind="qwen3"``): the raw sizes against
    the headers (before ``Qwen3Config`` builds a list of ``num_hidden_layers`` layer types), then every shape
    against a meta-device model, before anything is allocated. ``overrides`` select the method and its knobs."""
    path = os.fspath(path)
    file = os.path.join(path, CONFIG_FILE)
    verify_manifest(path)  # a folder we wrote (convert --to-qwen3): every file before any header is parsed
    values = read_hf_config(file)
    if not is_qwen3_config(values):
        raise ValueError(not_qwen3_message(path, file, values))
    found = weight_files(path)
    stored = stored_shapes(found[1]) if found is not None else None
    if found is not None:
        check_header_fields(values, stored, file, found[0])
    cfg = qwen3_to_model_config(values, source=file, **overrides)
    if found is None:
        _files(path)  # FileNotFoundError naming the folder
    check_shapes(cfg, expected_shapes(cfg), found[0], file, stored)
    tensors = LazyTensors(stored, lambda name: read_tensor(found[1][name], name))
    return ModelFolder(Path(path), "qwen3", cfg, tensors, "qwen3", path, hf_token_ids(path))
