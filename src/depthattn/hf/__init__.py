"""Hugging Face integration: ``DepthAttnConfig``, ``DepthAttnForCausalLM`` (``model_type="depthattn"``) and the
Qwen3 checkpoint converters. Importing this package registers the Auto classes (see docs/hf.md)."""

from .configuration import DepthAttnConfig
from .modeling import DepthAttnCache, DepthAttnCausalLMOutputWithPast, DepthAttnForCausalLM, register

register()

__all__ = ["DepthAttnConfig", "DepthAttnForCausalLM", "DepthAttnCache", "DepthAttnCausalLMOutputWithPast", "register"]
