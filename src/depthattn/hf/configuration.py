"""``DepthAttnConfig``: the Hugging Face view of ``depthattn.ModelConfig`` (same field names, ``model_type="depthattn"``).

The only translation anywhere (style.md, "Transformers v5 caveat"): transformers v5 stores RoPE settings as
``rope_parameters = {"rope_theta": θ, "rope_type": "default"}``; ``ModelConfig`` has a flat ``rope_theta``.
Every other field is copied unchanged, so ``DepthAttnConfig.from_model_config(cfg).to_model_config() == cfg``.
This file must import only transformers, the core config and ``fileio`` (it is copied next to ``trust_remote_code``
exports).
"""

from __future__ import annotations

import dataclasses

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

from depthattn.config import ModelConfig
from depthattn.fileio import file_states, rewrite_manifest_entries


#: Qwen3 config keys whose value is fixed in the core (read-only properties here).
FIXED = {"hidden_act": "silu", "attention_bias": False}


@strict
class DepthAttnConfig(PreTrainedConfig):
    """Configuration of ``DepthAttnForCausalLM``; field meanings are those of ``depthattn.ModelConfig``.

    ``rope_parameters`` must be ``{"rope_theta": float, "rope_type": "default"}``; any other RoPE type raises
    ``ValueError`` (only default RoPE exists in the core). ``use_cache`` (default True) is the v5 generation switch.
    Keys that are not fields (``output_hidden_states``, ``quantization_config``, a user's own) are kept as
    attributes and saved, as ``Qwen3Config`` keeps them, unless one looks like a misspelt field
    (``ModelConfig.check_extra_keys``: ``ValueError``); ``hidden_act`` / ``attention_bias`` are accepted only with
    the core's fixed values (``"silu"``, ``False``). The fields are validated by ``ModelConfig`` (``ValueError``
    naming the field).
    """

    model_type = "depthattn"
    keys_to_ignore_at_inference = ["cache"]

    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    rope_parameters: dict | None = None
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 256
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    use_cache: bool = True
    qk_norm_position: str = "before_rope"

    cross_layer: str = "none"
    num_loops: int = 1
    depth_attention_stride: int | None = None
    depth_attention_window: int = 0
    denseformer_dilation: int = 1
    denseformer_period: int = 1
    mhc_num_streams: int = 4
    mhc_alpha_init: float = 0.01
    mhc_sinkhorn_iters: int = 20
    mhc_sinkhorn: str = "log"
    attnres_block_size: int = 12
    attnres_recency_bias: float | None = None
    value_residual_lambda: float = 0.5
    value_residual_learnable: bool = False

    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        rope_theta = kwargs.pop("rope_theta", None)
        for name, fixed in FIXED.items():  # written by Qwen3 tools: accepted when they state the core's value
            value = kwargs.pop(name, fixed)
            if value != fixed:
                raise ValueError(f"DepthAttnConfig.{name}={value!r} is not supported: depthattn fixes it to {fixed!r}")
        ModelConfig.check_extra_keys(kwargs, "DepthAttnConfig")  # any other key is kept as an attribute
        if self.rope_parameters is None:
            self.rope_parameters = {"rope_theta": float(rope_theta if rope_theta is not None else 10000.0),
                                    "rope_type": "default"}
        if self.rope_parameters.get("rope_type", "default") != "default" or set(self.rope_parameters) - {
                "rope_theta", "rope_type"}:
            raise ValueError(f"DepthAttnConfig.rope_parameters={self.rope_parameters!r}: only default RoPE "
                             f"({{'rope_theta': θ, 'rope_type': 'default'}}) is supported")
        # Resolve and validate through the core config (names the bad field); writes the resolved stride back.
        self.depth_attention_stride = self.to_model_config().depth_attention_stride
        super().__post_init__(**kwargs)

    @property
    def hidden_act(self) -> str:
        """Fixed in the core (SwiGLU with SiLU); read by Qwen3 code such as vLLM's Qwen3 layers."""
        return "silu"

    @property
    def attention_bias(self) -> bool:
        """Fixed in the core (no projection bias); read by Qwen3 code such as vLLM's Qwen3 layers."""
        return False

    @property
    def rope_theta(self) -> float:
        return float(self.rope_parameters["rope_theta"])

    @rope_theta.setter
    def rope_theta(self, value: float) -> None:
        """Writes ``rope_parameters["rope_theta"]`` (tools such as vLLM set the flat v4 name)."""
        self.rope_parameters = {**(self.rope_parameters or {"rope_type": "default"}), "rope_theta": float(value)}

    def save_pretrained(self, save_directory, *args, **kwargs):
        """``PreTrainedConfig.save_pretrained``; in a folder with our ``checksums.json`` the rewritten
        ``config.json``'s entry is rewritten too (``fileio.rewrite_manifest_entries``)."""
        before = file_states(save_directory)
        out = super().save_pretrained(save_directory, *args, **kwargs)
        rewrite_manifest_entries(save_directory, before)
        return out

    def to_model_config(self) -> ModelConfig:
        """The core ``ModelConfig`` (raises ``ValueError`` naming any invalid field)."""
        # getattr with the default: a copy of this file beside an older checkpoint must survive fields added later
        values = {f.name: getattr(self, f.name, f.default) for f in dataclasses.fields(ModelConfig)
                  if f.name != "rope_theta"}
        return ModelConfig(rope_theta=self.rope_theta, **values)

    @classmethod
    def from_model_config(cls, cfg: ModelConfig, **kwargs) -> "DepthAttnConfig":
        """Wrap a core config; ``kwargs`` set HF-only fields (``eos_token_id``, ``use_cache``, ...)."""
        values = cfg.to_dict()
        theta = values.pop("rope_theta")
        return cls(rope_parameters={"rope_theta": float(theta), "rope_type": "default"}, **values, **kwargs)
