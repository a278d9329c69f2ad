"""Cross-layer methods: one file per method, each ending in its ``RECORD`` (``registry.MethodRecord``).

Two seams, one model:

* the **residual seam** (protocol and the plain ``Residual``: ``none.py``): how each sublayer's input is formed and
  how its output is written back. DenseFormer (``denseformer.py``, spec-baselines.md §3), mHC (``mhc.py``, §5) and
  Attention Residuals (``attnres.py``, §6) implement it; ``none`` is the plain residual;
* the **value seam** (``attention.py``): which V the attention uses and caches. Depth-Attention
  (``depth_attention.py``, arXiv 2606.05014) implements it with its candidate plan and depth mix; the mechanism
  controls value residual (``value_residual.py``, ResFormer) and uniform Depth-Attention
  (``depth_attention_uniform.py``) bring their own plan or mix (``MethodRecord.value_mix``).

Each method file holds its modules, its identity-at-init statement, its cost formulas, whether it loops and which of
its parameters never decay. ``config``, ``model``, ``accounting`` and ``optim`` read the records; adding a method is
one new file (and one line below), or ``register(record)`` from outside the package.
"""

from __future__ import annotations

from . import attnres, denseformer, depth_attention, depth_attention_uniform, mhc, none, value_residual
from .registry import (MethodRecord, Plan, get, loopable, names, records, register, registered, source_layers,
                       unregister)

# registration order = ``names()`` order
for _method in (none, depth_attention, denseformer, mhc, attnres, value_residual, depth_attention_uniform):
    register(_method.RECORD)
del _method

__all__ = ["MethodRecord", "Plan", "get", "loopable", "names", "records", "register", "registered", "source_layers",
           "unregister"]
