"""Depth-Attention weights on held-out text: which earlier layers each layer's value mix reads.

Legend: B batch, K KV heads, T time, H query heads, D head dim, N candidates (sources then self), L virtual layers.

The weights are computed with ``depthattn.cross_layer.depth_attention.depth_weights`` on the q and K̂ the model itself produces:
forward hooks on every ``self_attn`` module capture the attention's inputs by name (its normalised input, the
sources' (K̂, Ṽ), the call's ``LayerContext`` with the RoPE tables, the virtual layer index) and its output K̂; q
comes from the module's own ``project``. Nothing of the model forward is re-implemented and nothing is added to the
model (hooks are removed afterwards).
"""

from __future__ import annotations

import inspect
import math
from typing import Callable

import torch

from .cross_layer import get as method_record
from .cross_layer.depth_attention import depth_weights


def check_depth_attention(model) -> None:
    """``ValueError`` unless ``model.config.cross_layer`` mixes by Depth-Attention's softmax (the value-seam
    controls ``value_residual`` and ``depth_attention_uniform`` have fixed weights: nothing to measure)."""
    if not method_record(model.config.cross_layer).has_depth_weights:
        raise ValueError(f"depth-attention weights need cross_layer='depth_attention', the checkpoint has "
                         f"{model.config.cross_layer!r}")


def each_depth_weights(model, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None,
                       each: Callable[[int, torch.Tensor], None]) -> int:
    """One forward of ``model`` (in eval mode, hooks removed afterwards) calling ``each(u, w_nKN)`` for every
    virtual layer u with the Depth-Attention weights of its real tokens: ``[n_real, K, N]`` (N candidates, self
    last; float32 for a float32 model). Runs under the caller's grad mode. Returns the number of real tokens.
    Raises ``ValueError`` as ``check_depth_attention``."""
    check_depth_attention(model)
    mask = None if attention_mask_BT is None else attention_mask_BT.bool()

    def hook(module, args, kwargs, output):
        call = inspect.signature(module.forward).bind(*args, **kwargs).arguments  # by name, however it was called
        x_BTC, sources, ctx, u = call["x_BTC"], call["sources"], call["ctx"], call["layer_idx"]
        q_BHTD, _, _ = module.project(x_BTC, ctx.cos, ctx.sin)
        k_self = output[1][0]
        w_BKTN = depth_weights(q_BHTD, [k for k, _ in sources] + [k_self])
        m = torch.ones(w_BKTN.shape[0], w_BKTN.shape[2], dtype=torch.bool) if mask is None else mask
        each(u, w_BKTN.permute(0, 2, 1, 3)[m.to(w_BKTN.device)])  # [n_real, K, N]

    handles = [layer.self_attn.register_forward_hook(hook, with_kwargs=True) for layer in model.model.layers]
    was_training = model.training
    model.eval()
    try:
        model(input_ids_BT, attention_mask=attention_mask_BT)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return int(mask.sum()) if mask is not None else input_ids_BT.numel()


@torch.inference_mode()
def depth_weight_means(model, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None = None) -> dict:
    """Mean Depth-Attention weight per (virtual) layer and candidate, over batch, KV heads and real tokens.

    Returns ``{"layers": [{"layer": u, "candidates": [j..., u], "weights": [...]}, ...], "num_tokens": n}``;
    the weights of a layer sum to 1 (self last). Layers without sources (layer 0, or any method other than
    depth_attention) have the single candidate self with weight 1.
    Raises ``ValueError`` if ``model.config.cross_layer`` does not mix by Depth-Attention's softmax (the value-seam
    controls ``value_residual`` and ``depth_attention_uniform`` have fixed weights: nothing to measure).
    """
    sums: dict[int, torch.Tensor] = {}

    def add(u: int, w_nKN: torch.Tensor) -> None:
        sums[u] = sums.get(u, 0) + w_nKN.sum(dim=(0, 1)).double()

    n_tokens = each_depth_weights(model, input_ids_BT, attention_mask_BT, add)
    K = model.config.num_key_value_heads
    layers = []
    for u, cands in enumerate(model.plan):
        w = (sums[u] / (n_tokens * K)).tolist()
        layers.append(dict(layer=u, candidates=list(cands) + [u], weights=w))
    return dict(layers=layers, num_tokens=n_tokens)


def heatmap_figure(result: dict, title: str = "Depth-Attention weights"):
    """The layer × source heat map as a matplotlib ``Figure`` (rows: reading layer; columns: source layer, self on
    the diagonal). The figure is at least 4.8 × 4 inches and uses constrained layout, and the token count goes on
    a second title line, so the title and labels fit for any number of layers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    L = len(result["layers"])
    grid = [[math.nan] * L for _ in range(L)]
    for row in result["layers"]:
        for j, w in zip(row["candidates"], row["weights"]):
            grid[row["layer"]][j] = w
    fig, ax = plt.subplots(figsize=(max(4.8, 1.6 + 0.35 * L), max(4.0, 1.2 + 0.35 * L)), layout="constrained")
    im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis")
    ticks = list(range(0, L, math.ceil(L / 12)))  # integer layer indices, at most 12 per axis
    ax.set_xticks(ticks)
    ax.set_yticks(ticks)
    ax.set_xlabel("source layer j (diagonal: self)")
    ax.set_ylabel("layer l")
    ax.set_title(f"{title}\n({result['num_tokens']} tokens)")
    fig.colorbar(im, ax=ax, label="mean weight")
    return fig


def heatmap(result: dict, path: str, title: str = "Depth-Attention weights") -> None:
    """Save the layer × source heat map of ``heatmap_figure`` as a PNG."""
    import matplotlib.pyplot as plt

    fig = heatmap_figure(result, title)
    fig.savefig(path, dpi=120)
    plt.close(fig)
