"""Serving depthattn checkpoints with vLLM (docs/serving.md): the ``vllm.general_plugins`` entry point.

``register()`` is what vLLM calls in every process it starts (engine core, workers) through the entry point
``depthattn = "depthattn.serving:register"`` (pyproject.toml), so ``vllm serve CKPT`` and ``vllm.LLM(CKPT)`` find
``DepthAttnForCausalLM`` without any user code. It registers the model with the string form of
``ModelRegistry.register_model`` (the model module is imported only when a depthattn checkpoint is loaded) and
``model_type="depthattn"`` with transformers' ``AutoConfig`` (so vLLM reads ``config.json`` without
``trust_remote_code``). Nothing here is imported by ``import depthattn``.
"""

from __future__ import annotations

ARCHITECTURE = "DepthAttnForCausalLM"
MODEL_PATH = "depthattn.serving.vllm_model:DepthAttnForCausalLM"


def register() -> None:
    """Register depthattn with vLLM's ``ModelRegistry`` and transformers' ``AutoConfig`` (idempotent)."""
    from transformers import AutoConfig
    from vllm import ModelRegistry

    from ..hf.configuration import DepthAttnConfig

    AutoConfig.register(DepthAttnConfig.model_type, DepthAttnConfig, exist_ok=True)
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_PATH)
