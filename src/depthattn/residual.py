"""The residual seam: how each sublayer's input is formed and how its output is written back.

Every block has two sublayers, 0 = attention and 1 = MLP. A method provides

* a **layer module** (``DecoderLayer.cross_layer``) with ``prepare(state, sublayer) -> state`` (per-token work that
  both ``read`` and ``write`` need, e.g. mHC's dynamic maps; the identity by default), ``read(state, sublayer) -> x``
  (the sublayer's input, before the sublayer's own pre-norm) and ``write(state, sublayer, out) -> state``;
* a **model module** (``DecoderLM.model.cross_layer``) with ``begin(h0) -> state`` after the embedding and
  ``end(state) -> h`` before the final norm.

``state`` is whatever the method carries through depth for the current tokens (in-flight state, never persisted
across decode steps): a tensor ``[B, T, C]`` for the plain residual, a tuple of tensors otherwise. Methods are
registry entries; the model code is shared. Depth-Attention uses the value seam instead (``depth_attention.py``), so
it takes the plain residual.

Registered methods (spec-baselines.md): ``none`` / ``depth_attention`` (plain residual), ``denseformer``
(``denseformer.py``, §3), ``mhc`` (``mhc.py``, §5), ``attnres`` (``attnres.py``, §6).
"""

from __future__ import annotations

from typing import Any, Callable

from torch import Tensor, nn

from .attnres import AttnRes, AttnResFinal
from .config import ModelConfig
from .denseformer import DWA, DWAStart
from .mhc import MHC, MHCStreams


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


#: name -> (layer module factory, model module factory). Factories take (cfg, layer_idx, device=None) and
#: (cfg, device=None).
RESIDUAL: dict[str, tuple[Callable[[ModelConfig, int], nn.Module], Callable[[ModelConfig], nn.Module]]] = {
    "none": (lambda cfg, i, device=None: Residual(), lambda cfg, device=None: Residual()),
    "depth_attention": (lambda cfg, i, device=None: Residual(), lambda cfg, device=None: Residual()),
    "denseformer": (DWA, DWAStart),
    "mhc": (MHC, MHCStreams),
    "attnres": (AttnRes, AttnResFinal),
}
