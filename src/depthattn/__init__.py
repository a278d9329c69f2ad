"""depthattn: Depth-Attention (Zeng et al., EMNLP 2026, arXiv 2606.05014) and cross-layer baselines on a
Qwen3-exact decoder, with a vanilla-sized KV cache, generation, training and evaluation.

Citations such as "spec-depth-attention.md §3.4" in docstrings refer to the specifications in the repository's
``docs/specs/`` folder (spec-depth-attention.md, spec-baselines.md, data-sources.md, style.md).

``import depthattn`` does not import transformers. The Hugging Face bridge is ``depthattn.hf``: importing it
registers ``model_type="depthattn"`` with transformers' Auto classes."""

from .accounting import kv_cache_bytes_per_token, num_flops, num_params
from .cache import KVCache
from .config import PRESETS, ModelConfig
from .generate import generate, generate_stream, naive_generate
from .model import DecoderLM, ModelOutput

__version__ = "0.1.0"
__all__ = [
    "ModelConfig", "PRESETS", "DecoderLM", "ModelOutput", "KVCache", "generate", "generate_stream",
    "naive_generate", "num_params", "num_flops", "kv_cache_bytes_per_token", "__version__",
]
