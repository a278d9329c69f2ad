"""The plain residual (``cross_layer="none"``) and the residual-seam protocol every method implements.

Every block has two sublayers, 0 = attention and 1 = MLP. A method provides

* a **layer module** (``DecoderLayer.cross_layer``) with ``prepare(state, sublayer) -> state`` (per-token work that
  both ``read`` and ``write`` need, e.g. mHC's dynamic maps; the identity by default), ``read(state, sublayer) -> x``
  (the sublayer's input, before the sublayer's own pre-norm) and ``write(state, sublayer, out) -> state``;
* a **model module** (``DecoderLM.model.cross_layer``) with ``begin(h0) -> state`` after the embedding and
  ``end(state) -> h`` before the final norm.

``state`` is whatever the method carries through depth for the current tokens (in-flight state, never persisted
across decode steps): a tensor ``[B, T, C]`` for the plain residual, a tuple of tensors otherwise. Methods are
registry entries (``cross_layer.registry``); the model code is shared. Depth-Attention uses the value seam instead
(``cross_layer/depth_attention.py``), so it takes the plain residual.

**At init:** ``none`` is the plain Qwen3 decoder; it has no parameters, so there is nothing to initialise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from .registry import MethodRecord

if TYPE_CHECKING:
    from ..config import ModelConfig


class Residual(nn.Module):
    """Plain pre-norm residual (``cross_layer="none"``): ``h ← h + f(norm(h))``. No parameters."""

    def prepare(self, state: Any, sublayer: int) -> Any:
        return state

    def read(self, state: Any, sublayer: int) -> Tensor:
        return state

    def write(self, state: Any, sublayer: int, out: Tensor) -> Any:
        return state + out

    def begin(self, h0: Tensor) -> Any:
        return h0

    def end(self, state: Any) -> Tensor:
        return state

    def init_weights(self, cfg: ModelConfig) -> None:
        """Nothing to initialise."""


def residual_layer(cfg: ModelConfig, layer_idx: int, device=None) -> Residual:
    """Layer-module factory of the plain residual (for any method that keeps it)."""
    return Residual()


def residual_model(cfg: ModelConfig, device=None) -> Residual:
    """Model-module factory of the plain residual (for any method that keeps it)."""
    return Residual()


RECORD = MethodRecord(
    name="none",
    at_init="the plain Qwen3 decoder (no parameters)",
    layer=residual_layer,
    model=residual_model,
    loopable=True,
)
