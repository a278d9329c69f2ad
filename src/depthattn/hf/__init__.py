"""Hugging Face integration: ``DepthAttnConfig``, ``DepthAttnForCausalLM``, the headless ``DepthAttnModel``
(``model_type="depthattn"``) and the
Qwen3 checkpoint converters. Importing this package registers the Auto classes (see docs/hf.md)."""

from .configuration import DepthAttnConfig
from .modeling import (DepthAttnCache, DepthAttnCausalLMOutputWithPast, DepthAttnForCausalLM, DepthAttnModel,
                       register)

register()

__all__ = ["DepthAttnConfig", "DepthAttnForCausalLM", "DepthAttnModel", "DepthAttnCache",
           "DepthAttnCausalLMOutputWithPast", "register"]
