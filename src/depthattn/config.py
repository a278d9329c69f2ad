"""Model configuration: one dataclass in the Hugging Face ``Qwen3Config`` vocabulary.

Field names follow ``transformers.Qwen3Config`` so that no mapping layer is needed. ``cross_layer`` selects the
cross-layer method (a name registered in ``depthattn.cross_layer``); method knobs carry the method's name as a
prefix. Knobs of a method that is not selected are allowed and have no effect (one set of overrides can serve every
method of a comparison).

Resolved defaults (``depth_attention_stride``) are written into the config, so a saved checkpoint never depends on a
default.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

from .cross_layer import loopable as loopable_methods, names as method_names
from .fileio import atomic_write_text, read_json


#: ``ModelConfig.qk_norm_position`` values; the first is the default (Qwen3).
QK_NORM_POSITIONS = ("before_rope", "k_after_rope")
#: ``ModelConfig.mhc_sinkhorn`` values; the first is the default.
MHC_SINKHORN_FORMS = ("log", "exp")


def _finite(v) -> bool:
    """``math.isfinite`` that says False (instead of raising ``OverflowError``) for an int beyond float's range, so
    that validation reports ``10**400`` as an invalid value."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _sci(n: int) -> str:
    """``n`` in three significant digits, also for an int beyond float's range (``10**400`` -> ``1e+400``)."""
    try:
        return f"{n:.3g}"
    except OverflowError:
        digits = str(n)
        return f"{digits[0]}.{digits[1:3]}e+{len(digits) - 1}"


#: Upper bounds checked by ``ModelConfig.validate`` before any model is built: layers (each is a few Python modules),
#: virtual layers ``num_hidden_layers × num_loops`` (each has its KV-cache slot set and its candidate list), the
#: Depth-Attention candidates summed over virtual layers (each a tensor the forward stacks per token; stride 1 makes
#: them quadratic in depth), and float32 parameter bytes (1 TiB: ~275B parameters, far beyond any machine this runs
#: on). The paper's largest configs (48 layers, a few loops, stride ≥ 1) are far below each.
MAX_LAYERS = 1 << 16
MAX_VIRTUAL_LAYERS = 1 << 16
MAX_DEPTH_CANDIDATES = 1 << 24
MAX_PARAMETER_BYTES = 1 << 40


@dataclass
class ModelConfig:
    """Architecture of a Qwen3-style decoder with an optional cross-layer method.

    Raises:
        ValueError: on construction, naming the field and the value, for any impossible setting (see ``validate``).
    """

    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 256
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    # Where q_norm / k_norm sit relative to RoPE: "before_rope" (Qwen3: both before) or "k_after_rope" (q_norm
    # before, k_norm after RoPE: the SDPA attention class of hyq718/Depth-Attention; docs/authors-checkpoints.md).
    qk_norm_position: str = "before_rope"

    cross_layer: str = "none"
    num_loops: int = 1
    # Depth-Attention (arXiv 2606.05014); stride None resolves to max(1, L_virtual // 2).
    depth_attention_stride: int | None = None
    depth_attention_window: int = 0
    # DenseFormer (arXiv 2402.02622): dilation k, period p.
    denseformer_dilation: int = 1
    denseformer_period: int = 1
    # mHC (arXiv 2512.24880).
    mhc_num_streams: int = 4
    mhc_alpha_init: float = 0.01
    mhc_sinkhorn_iters: int = 20
    # "log": log domain, columns then rows each round (ours); "exp": exp domain with 1e-12 clamps, rows then columns
    # each round (hyq718/Depth-Attention's modeling_llama_mhc.py).
    mhc_sinkhorn: str = "log"
    # Attention Residuals (arXiv 2603.15031); block size counted in sublayers; recency None = Kimi form.
    attnres_block_size: int = 12
    attnres_recency_bias: float | None = None
    # Value residual (ResFormer, arXiv 2410.17897): v_l ← λ v_l + (1 − λ) v_0; learnable = one λ per layer l >= 1.
    value_residual_lambda: float = 0.5
    value_residual_learnable: bool = False

    def __post_init__(self) -> None:
        if self.depth_attention_stride is None and isinstance(self.num_hidden_layers, int) and isinstance(
            self.num_loops, int
        ):
            self.depth_attention_stride = max(1, (self.num_hidden_layers * max(self.num_loops, 1)) // 2)
        self.validate()

    # ------------------------------------------------------------------ derived quantities
    @property
    def num_virtual_layers(self) -> int:
        """Layers applied per forward: ``num_hidden_layers * num_loops`` (spec §11)."""
        return self.num_hidden_layers * self.num_loops

    @property
    def group_size(self) -> int:
        """GQA group size g = H / H_kv."""
        return self.num_attention_heads // self.num_key_value_heads

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Reject impossible values with one ``ValueError`` naming the field and the value."""

        def is_int(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def need(ok: bool, name: str, why: str) -> None:
            if not ok:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} is invalid: {why}")

        for name in (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings",
        ):
            value = getattr(self, name)
            need(is_int(value) and value >= 1, name,
                 "must be an integer >= 1")
        need(self.head_dim % 2 == 0, "head_dim", "RoPE needs an even head_dim")
        need(self.num_attention_heads % self.num_key_value_heads == 0, "num_attention_heads",
             f"must be divisible by num_key_value_heads={self.num_key_value_heads}")
        for name in ("rope_theta", "initializer_range"):
            v = getattr(self, name)
            need(isinstance(v, (int, float)) and _finite(v) and v > 0, name, "must be a finite number > 0")
        need(isinstance(self.rms_norm_eps, (int, float)) and _finite(self.rms_norm_eps)
             and self.rms_norm_eps >= 0, "rms_norm_eps", "must be a finite number >= 0")
        need(isinstance(self.tie_word_embeddings, bool), "tie_word_embeddings", "must be true or false")
        need(self.qk_norm_position in QK_NORM_POSITIONS, "qk_norm_position",
             f"must be one of {QK_NORM_POSITIONS}")
        need(self.mhc_sinkhorn in MHC_SINKHORN_FORMS, "mhc_sinkhorn", f"must be one of {MHC_SINKHORN_FORMS}")
        methods, loopable = method_names(), loopable_methods()  # from the registry; "none" is the plain Qwen3
        need(self.cross_layer in methods, "cross_layer", f"must be one of {methods}")
        need(is_int(self.num_loops) and self.num_loops >= 1,
             "num_loops", "must be an integer >= 1")
        need(self.num_loops == 1 or self.cross_layer in loopable, "num_loops",
             f"looped models are defined only for cross_layer in {loopable}, "
             f"not {self.cross_layer!r} (docs/specs/spec-depth-attention.md §11)")
        for name, minimum in (("depth_attention_stride", 1), ("depth_attention_window", 0),
                              ("denseformer_dilation", 1), ("denseformer_period", 1), ("mhc_num_streams", 1),
                              ("mhc_sinkhorn_iters", 1), ("attnres_block_size", 1)):
            need(is_int(getattr(self, name)) and getattr(self, name) >= minimum, name,
                 f"must be an integer >= {minimum}")
        need(isinstance(self.mhc_alpha_init, (int, float)) and not isinstance(self.mhc_alpha_init, bool)
             and _finite(self.mhc_alpha_init), "mhc_alpha_init", "must be a finite number")
        need(is_int(self.attnres_block_size) and self.attnres_block_size >= 1,
             "attnres_block_size", "must be an integer >= 1 (counted in sublayers)")
        need(self.attnres_recency_bias is None or (isinstance(self.attnres_recency_bias, (int, float))
                                                   and _finite(self.attnres_recency_bias)),
             "attnres_recency_bias", "must be null (Kimi form) or a finite number")
        need(isinstance(self.value_residual_lambda, (int, float)) and not isinstance(self.value_residual_lambda, bool)
             and 0.0 <= self.value_residual_lambda <= 1.0, "value_residual_lambda",
             "must be a number in [0, 1] (λ·v_l + (1 − λ)·v_0; 1 = vanilla)")
        need(isinstance(self.value_residual_learnable, bool), "value_residual_learnable", "must be true or false")
        self._check_size()

    def _check_size(self) -> None:
        """Refuse a config whose model could not be built: more than ``MAX_LAYERS`` layers (each is Python
        modules), or parameters above ``MAX_PARAMETER_BYTES`` in float32 -- before anything is allocated (a hostile
        or mistyped ``config.json``, e.g. ``num_hidden_layers = 10**9``, would otherwise build until memory runs
        out)."""
        if self.num_hidden_layers > MAX_LAYERS:
            raise ValueError(f"ModelConfig.num_hidden_layers={self.num_hidden_layers} is invalid: more than "
                             f"{MAX_LAYERS} layers (depthattn.config.MAX_LAYERS) cannot be built")
        if self.num_virtual_layers > MAX_VIRTUAL_LAYERS:
            raise ValueError(f"ModelConfig.num_loops={self.num_loops} is invalid: num_hidden_layers="
                             f"{self.num_hidden_layers} × num_loops={self.num_loops} = {_sci(self.num_virtual_layers)} "
                             f"virtual layers, more than {MAX_VIRTUAL_LAYERS} (depthattn.config.MAX_VIRTUAL_LAYERS)")
        if self.cross_layer.startswith("depth_attention"):  # the plan Depth-Attention and its control build
            from .cross_layer.depth_attention import candidate_count

            n = candidate_count(self.num_virtual_layers, self.depth_attention_stride, self.depth_attention_window)
            if n > MAX_DEPTH_CANDIDATES:
                raise ValueError(f"ModelConfig.depth_attention_stride={self.depth_attention_stride} is invalid with "
                                 f"depth_attention_window={self.depth_attention_window} over "
                                 f"{self.num_virtual_layers} virtual layers: {_sci(n)} depth candidates in all, more "
                                 f"than {MAX_DEPTH_CANDIDATES} (depthattn.config.MAX_DEPTH_CANDIDATES); raise the "
                                 f"stride or shrink the window")
        C, H, K, D, F = (self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim,
                         self.intermediate_size)
        per_layer = C * H * D + 2 * C * K * D + H * D * C + 2 * D + 3 * C * F + 2 * C  # = accounting.layer_params
        embed = self.vocab_size * C * (1 if self.tie_word_embeddings else 2)
        params = embed + self.num_hidden_layers * per_layer + C
        if params * 4 <= MAX_PARAMETER_BYTES:  # the method's extras are small next to the backbone: add them
            from .cross_layer import get as method_record

            params += method_record(self.cross_layer).extra_params(self)
        if params * 4 > MAX_PARAMETER_BYTES:
            raise ValueError(f"ModelConfig is too large to build: {_sci(params)} parameters take {_sci(params * 4)} bytes "
                             f"in float32, above the bound of {MAX_PARAMETER_BYTES:.3g} bytes "
                             f"(depthattn.config.MAX_PARAMETER_BYTES = 1 TiB); check vocab_size={self.vocab_size}, "
                             f"hidden_size={C}, intermediate_size={F}, num_hidden_layers={self.num_hidden_layers}, "
                             f"num_attention_heads={H}, num_key_value_heads={K}, head_dim={D}")

    # ------------------------------------------------------------------ presets and overrides
    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "ModelConfig":
        """Build a named preset (``tiny``, ``small``, ``360m``, ``1.5b``, ``3b``, ``authors-3b``) with field overrides.

        Raises:
            ValueError: unknown preset name or unknown field name.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        values = dict(PRESETS[name])
        values.update(overrides)
        return cls.from_dict(values)

    def replace(self, **overrides: Any) -> "ModelConfig":
        """A copy with some fields changed; re-resolves the default stride if depth changes and no stride is given."""
        values = self.to_dict()
        check_keys(overrides, "ModelConfig override")
        if ("num_hidden_layers" in overrides or "num_loops" in overrides) and "depth_attention_stride" not in overrides:
            values["depth_attention_stride"] = None
        values.update(overrides)
        return ModelConfig(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "ModelConfig":
        """Build from a mapping; unknown keys raise ``ValueError`` naming them."""
        check_keys(values, "ModelConfig")
        return cls(**dict(values))

    @staticmethod
    def check_extra_keys(keys, source: str) -> None:
        """Refuse a key that is not a field but looks like a misspelt one (``cross_layers``, ``num_hidden_layer``):
        ``ValueError`` naming ``source``, the key and the field it resembles. Keys that resemble no field pass (a
        Hugging Face ``config.json`` keeps foreign keys, e.g. ``output_hidden_states`` or a user's own, as
        attributes); ``depthattn.hf.DepthAttnConfig`` and the native ``config.json`` reader both call this."""
        names = [f.name for f in dataclasses.fields(ModelConfig)]
        for key in sorted(set(keys) - set(names)):
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=MISSPELT_CUTOFF)
            if close:
                raise ValueError(f"{source}: unknown key {key!r} looks like a misspelt ModelConfig field "
                                 f"{close[0]!r}; rename it")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def save_json(self, path: str | os.PathLike) -> None:
        """Write the config as JSON atomically (temp file, then rename)."""
        atomic_write_text(path, self.to_json() + "\n")

    @classmethod
    def load_json(cls, path: str | os.PathLike) -> "ModelConfig":
        """Read a config written by ``save_json``. Raises ``ValueError`` naming the file if it is not valid."""
        return cls.from_dict(read_json_object(path, "model config"))


#: ``difflib`` similarity at which ``ModelConfig.check_extra_keys`` reads a foreign key as a misspelt field; the
#: keys of ``PreTrainedConfig``, ``Qwen3Config``, ``LlamaConfig`` and ``GPT2Config`` all stay below it (at most 0.75).
MISSPELT_CUTOFF = 0.8


#: Where a user finds the keys ``--set`` and a config file's tables take (``depthattn train --list-keys``).
LIST_KEYS_HINT = "`depthattn train --list-keys` lists the ModelConfig and TrainConfig keys"


def did_you_mean(key: str, keys) -> str:
    """``" (did you mean eval_windows?)"`` for the one of ``keys`` closest to ``key`` (``difflib`` similarity
    >= 0.6), else ``""``."""
    close = difflib.get_close_matches(str(key), sorted(keys), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def check_keys(values: Mapping[str, Any], what: str) -> None:
    """Raise ``ValueError`` naming any key of ``values`` that is not a ``ModelConfig`` field (and the field it
    resembles)."""
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"unknown {what} key(s) {unknown}{did_you_mean(unknown[0], names)}; {LIST_KEYS_HINT}")


def read_json_object(path: str | os.PathLike, what: str = "file") -> dict[str, Any]:
    """Read a JSON object; ``ValueError`` naming ``what`` and the file if it is unreadable, too large or too deeply
    nested (``fileio.read_json``), or not an object."""
    try:
        values = read_json(path, what)
    except OSError as e:
        raise ValueError(f"cannot read {what} {os.fspath(path)!r}: {e}") from e
    if not isinstance(values, dict):
        raise ValueError(f"{what} {os.fspath(path)!r} must hold a JSON object")
    return values


# Paper-scale shapes come from spec-depth-attention.md §12 (the authors' released configs).
PRESETS: dict[str, dict[str, Any]] = {
    # Tests: 4 layers, GQA group 2, stride 2 (layer 3 reads layers 0 and 2).
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                 rms_norm_eps=1e-6, initializer_range=0.02, tie_word_embeddings=False),
    # CPU main job: ~11M parameters at vocab 8192.
    "small": dict(vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=8,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                  rms_norm_eps=1e-6, initializer_range=0.02, tie_word_embeddings=False),
    "360m": dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=32,
                 num_attention_heads=16, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
                 rope_theta=10000.0, rms_norm_eps=1e-6, initializer_range=0.02, tie_word_embeddings=False),
    "1.5b": dict(vocab_size=50304, hidden_size=1536, intermediate_size=4096, num_hidden_layers=48,
                 num_attention_heads=24, num_key_value_heads=6, head_dim=64, max_position_embeddings=2048,
                 rope_theta=10000.0, rms_norm_eps=1e-5, initializer_range=0.01, tie_word_embeddings=False),
    "3b": dict(vocab_size=50304, hidden_size=2048, intermediate_size=6912, num_hidden_layers=48,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=2048,
               rope_theta=10000.0, rms_norm_eps=1e-5, initializer_range=0.01, tie_word_embeddings=False),
    # The authors' released Depth-Attention 3B (zeng123/3b-ds-s24-qknorm-gqa-4x; hyq718/Depth-Attention
    # llama_config/released/3b_depth_attention_qknorm_gqa4x/config.json@749d983): the 3b shape, stride 24, no recent
    # window, k_norm after RoPE (their SDPA attention class). vocab_size 50,304 is the GPT-NeoX-20B tokenizer's
    # 50,277 tokens padded; train takes the data tokenizer's unless --set vocab_size=50304
    # (docs/authors-checkpoints.md).
    "authors-3b": dict(vocab_size=50304, hidden_size=2048, intermediate_size=6912, num_hidden_layers=48,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=2048,
                       rope_theta=10000.0, rms_norm_eps=1e-5, initializer_range=0.01, tie_word_embeddings=False,
                       cross_layer="depth_attention", depth_attention_stride=24, depth_attention_window=0,
                       qk_norm_position="k_after_rope"),
}
