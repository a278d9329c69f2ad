"""What the cross-layer method learns, during training (``TrainConfig.log_depth_every``): mixing statistics on a
fixed probe batch and per-layer gradient norms, as flat metrics-row keys.

Legend: B probe rows, T ``seq_len``, K KV heads, N candidates (sources then self), S mHC streams.

**Probe** (``DepthProbe.statistics``): every ``log_depth_every`` steps one separate forward of the model on
``PROBE_ROWS`` validation windows (chosen once with the fixed seed ``PROBE_SEED``, the same for every run of the
data), eager (``torch.compiler.set_stance("force_eager")``: no compiled graph, no activation checkpointing, no
hook inside the training step), without gradients, in eval mode; under FSDP every rank runs it (each block's
forward all-gathers its shards). Nothing is drawn from an RNG, so the trajectory is that of a run without it.
Keys, per (virtual) layer u:

* ``depth_attention`` (``analyze.each_depth_weights``, the weights ``analyze`` reports): ``depth/L{u}/from{j}``
  the mean weight on source j (j = 0: layer 0), ``depth/L{u}/self``, ``depth/L{u}/entropy`` (the mean over
  tokens and KV heads of −Σ_n w_n ln w_n, nats: 0 = one candidate, ln N = uniform); layers without sources are
  left out. Run-level: ``depth/self`` (mean over those layers), ``depth/layer0`` (mean weight on layer 0 over the
  layers that read it).
* ``denseformer``: the DWA weights α themselves (parameters, no forward needed) after block i = u + 1:
  ``depth/L{u}/x{j}`` the weight on X_j (X_0: the embedding, X_j: block j's output), ``depth/L{u}/self``
  (α_{i,i}), for the blocks followed by a DWA.
* ``attnres``: per aggregator (``attn``, ``mlp`` of layer u, and ``final``) the mean softmax weight on each source
  (``kimi_source_labels``: ``b{m}`` a completed block sum, b0 = x_0, ``p{n}`` the partial sum; recency variant:
  ``s{m}`` snapshots, s0 = x_0, ``r`` the running residual) and the entropy: ``depth/L{u}/attn/b0``,
  ``depth/L{u}/attn/entropy``, ``depth/final/...``.
* ``mhc``: the mean over tokens of ‖Hres − I‖_F per connector: ``depth/L{u}/attn/hres_dist``,
  ``depth/L{u}/mlp/hres_dist`` (0 = the plain residual; at init 0.01·S/√(S − 1) when φ = 0).
* the others (``none``, ``value_residual``, ``depth_attention_uniform``): no probe keys (nothing input-dependent
  is mixed).

**Gradient norms** (``layer_grad_norms``): the L2 norm of the step's gradients per parameter group, taken after the
last backward and before clipping, the optimizer step and ``zero_grad`` (the point where the logged ``grad_norm``,
the norm ``clip_grad_norm_`` returns, is taken): ``grad_norm/embed`` (``model.embed_tokens``, tied LM head
included), ``grad_norm/L{i}`` (physical layer i), ``grad_norm/head`` (the final norm, the LM head, the model-level
cross-layer module). Their root-sum-square is the global ``grad_norm``. Under FSDP2 a gradient is a sharded
DTensor: its local squares are summed and all-reduced (divided by the replicas under HSDP), one all-reduce for
all groups.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch

from ..analyze import each_depth_weights

#: Validation windows in the probe batch, and the seed that picks them.
PROBE_ROWS = 4
PROBE_SEED = 0


def probe_batch(val_windows_BT1: torch.Tensor, rows: int = PROBE_ROWS, seed: int = PROBE_SEED) -> torch.Tensor:
    """``[min(rows, n), T]`` int64: the inputs of ``rows`` validation windows (``[n, T + 1]``) picked by a seeded
    permutation, in window order."""
    pick = np.sort(np.random.default_rng(seed).permutation(len(val_windows_BT1))[:rows])
    return val_windows_BT1[torch.from_numpy(pick)][:, :-1].contiguous()


def _entropy(w: torch.Tensor) -> torch.Tensor:
    """−Σ w ln w over the last dimension (0 ln 0 = 0), float64."""
    w = w.double()
    return -(w * torch.where(w > 0, w.log(), torch.zeros_like(w))).sum(-1)


# ---------------------------------------------------------------------------------------------------- per method
def depth_attention_stats(model, ids_BT: torch.Tensor) -> dict[str, float]:
    """Depth-Attention's weights per layer (module docstring), from ``analyze.each_depth_weights``."""
    sums: dict[int, torch.Tensor] = {}
    ents: dict[int, float] = {}

    def add(u: int, w_nKN: torch.Tensor) -> None:
        sums[u] = sums.get(u, 0) + w_nKN.sum(dim=(0, 1)).double()
        ents[u] = ents.get(u, 0.0) + float(_entropy(w_nKN).sum())

    n = each_depth_weights(model, ids_BT, None, add) * model.config.num_key_value_heads
    out: dict[str, float] = {}
    selfs, zeros = [], []
    for u, cands in enumerate(model.plan):
        if not cands:
            continue
        w = (sums[u] / n).tolist()
        for j, v in zip(cands, w):
            out[f"depth/L{u}/from{j}"] = v
        out[f"depth/L{u}/self"] = w[-1]
        out[f"depth/L{u}/entropy"] = ents[u] / n
        selfs.append(w[-1])
        if 0 in cands:
            zeros.append(w[cands.index(0)])
    if selfs:
        out["depth/self"] = sum(selfs) / len(selfs)
    if zeros:
        out["depth/layer0"] = sum(zeros) / len(zeros)
    return out


def _full(p: torch.Tensor) -> torch.Tensor:
    """A parameter's full value (an FSDP2 DTensor: all-gathered, a collective every rank must call)."""
    return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().double().cpu()


def denseformer_stats(model, ids_BT: torch.Tensor | None = None) -> dict[str, float]:
    """DenseFormer's DWA weights α (parameters; ``ids_BT`` unused)."""
    out: dict[str, float] = {}
    for u, layer in enumerate(model.model.layers):
        dwa = layer.cross_layer
        if dwa.alpha is None:
            continue
        alpha = _full(dwa.alpha).tolist()
        for j, v in zip(dwa.sources[:-1], alpha[:-1]):
            out[f"depth/L{u}/x{j}"] = v
        out[f"depth/L{u}/self"] = alpha[-1]
    return out


def _recording(modules: dict[str, Any], method: str, record: Callable[[str, Any], None]) -> list[Any]:
    """Wrap ``module.<method>`` of every named module on the instance so each call's result goes to
    ``record(name, result)``; returns the modules (``_restore`` removes the wrappers)."""
    for name, module in modules.items():
        original = getattr(module, method)

        def wrapper(*args, _original=original, _name=name, **kwargs):
            result = _original(*args, **kwargs)
            record(_name, result)
            return result

        setattr(module, method, wrapper)
    return list(modules.values())


def _restore(modules: list[Any], method: str) -> None:
    for module in modules:
        if method in vars(module):
            delattr(module, method)


def _forward(model, ids_BT: torch.Tensor) -> None:
    was = model.training
    model.eval()
    try:
        model(ids_BT)
    finally:
        model.train(was)


def _attnres_labels(cfg) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """Source labels per sublayer aggregator and for the final one (module docstring)."""
    from ..cross_layer.attnres import kimi_source_labels, recency_schedule

    n_sub, S = 2 * cfg.num_hidden_layers, cfg.attnres_block_size
    if cfg.attnres_recency_bias is None:
        return kimi_source_labels(n_sub, S)
    per, final = recency_schedule(n_sub, S)
    return (tuple(tuple(f"s{m}" for m in range(k)) + ("r",) for k, _ in per),
            tuple(f"s{m}" for m in range(final)) + ("r",))


def attnres_stats(model, ids_BT: torch.Tensor) -> dict[str, float]:
    """AttnRes's softmax weights per aggregator, recorded from ``_Aggregators.mix`` during one forward."""
    found: dict[str, list[torch.Tensor]] = {}
    modules = {f"L{u}": layer.cross_layer for u, layer in enumerate(model.model.layers)}
    modules["final"] = model.model.cross_layer
    wrapped = _recording(modules, "mix", lambda name, res: found.setdefault(name, []).append(res[1]))
    try:
        _forward(model, ids_BT)
    finally:
        _restore(wrapped, "mix")
    per, final = _attnres_labels(model.config)
    out: dict[str, float] = {}
    for name, calls in found.items():
        if name == "final":
            targets = [("depth/final", final, calls[0])]
        else:
            u = int(name[1:])
            targets = [(f"depth/{name}/{part}", per[2 * u + s], w) for s, (part, w) in
                       enumerate(zip(("attn", "mlp"), calls))]
        for key, labels, w_BTK in targets:
            w = w_BTK.reshape(-1, w_BTK.shape[-1])
            for label, v in zip(labels, w.double().mean(0).tolist()):
                out[f"{key}/{label}"] = v
            out[f"{key}/entropy"] = float(_entropy(w).mean())
    return out


def mhc_stats(model, ids_BT: torch.Tensor) -> dict[str, float]:
    """mHC's mean ‖Hres − I‖_F per connector, recorded from ``Connector.maps`` during one forward."""
    found: dict[str, torch.Tensor] = {}

    def record(name: str, maps) -> None:
        hres = maps[2].double()
        eye = torch.eye(hres.shape[-1], dtype=hres.dtype, device=hres.device)
        found[name] = torch.linalg.matrix_norm(hres - eye).mean()

    modules = {f"L{u}/{part}": layer.cross_layer.connectors[s] for u, layer in enumerate(model.model.layers)
               for s, part in enumerate(("attn", "mlp"))}
    wrapped = _recording(modules, "maps", record)
    try:
        _forward(model, ids_BT)
    finally:
        _restore(wrapped, "maps")
    return {f"depth/{name}/hres_dist": float(v) for name, v in found.items()}


#: ``cross_layer`` → its probe statistics (methods not listed have none).
METHOD_STATS: dict[str, Callable[..., dict[str, float]]] = {
    "depth_attention": depth_attention_stats, "denseformer": denseformer_stats, "attnres": attnres_stats,
    "mhc": mhc_stats}


@torch.no_grad()
def method_statistics(model, ids_BT: torch.Tensor) -> dict[str, float]:
    """The probe keys of ``model``'s method on ``ids_BT`` ``[B, T]`` (module docstring), from an eager no-grad
    forward in eval mode; ``{}`` for a method without any."""
    stats = METHOD_STATS.get(model.config.cross_layer)
    if stats is None:
        return {}
    with torch.compiler.set_stance("force_eager"):
        return stats(model, ids_BT)


# ---------------------------------------------------------------------------------------------------- gradients
def grad_group(name: str) -> str:
    """The gradient-norm group of a parameter name: ``embed``, ``L{i}`` or ``head``."""
    if name.startswith("model.embed_tokens."):
        return "embed"
    if name.startswith("model.layers."):
        return "L" + name.split(".")[2]
    return "head"


def _replicas(g) -> int:
    """How many ranks hold each element of a DTensor (its mesh's Replicate dimensions)."""
    return math.prod(g.device_mesh.size(i) for i, p in enumerate(g.placements) if p.is_replicate())


@torch.no_grad()
def layer_grad_norms(model: torch.nn.Module) -> dict[str, float]:
    """``{"grad_norm/<group>": L2 norm}`` of the current gradients per ``grad_group`` (module docstring); groups
    without gradients are left out. Under FSDP2 a collective: every rank must call it."""
    groups: dict[str, list[torch.Tensor]] = {}
    sharded = False
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad
        if hasattr(g, "to_local"):
            sharded = True
            sq = g.to_local().float().pow(2).sum() / _replicas(g)
        else:
            sq = g.float().pow(2).sum()
        groups.setdefault(grad_group(name), []).append(sq)
    if not groups:
        return {}
    names = list(groups)
    sums = torch.stack([torch.stack(groups[n]).sum() for n in names]).double()
    if sharded and torch.distributed.is_initialized():
        torch.distributed.all_reduce(sums)
    return {f"grad_norm/{n}": v for n, v in zip(names, sums.sqrt().tolist())}


# ---------------------------------------------------------------------------------------------------- the trainer's
class DepthProbe:
    """The trainer's periodic statistics: ``due(step)`` every ``every`` steps; ``statistics(model)`` the probe keys
    on the fixed ``probe_ids_BT`` (on ``device``); ``grad_norms(model)`` the per-layer gradient norms. A periodic
    job of the trainer (``training.periodic.Periodic``: ``run`` is ``statistics``, never abandoned)."""

    phase = None

    def __init__(self, every: int, probe_ids_BT: torch.Tensor, device: torch.device):
        self.every = every
        self.ids = probe_ids_BT.to(device)

    @classmethod
    def for_run(cls, every: int, val_windows_BT1: torch.Tensor, device: torch.device) -> "DepthProbe | None":
        """None when ``every`` is 0 (off)."""
        return cls(every, probe_batch(val_windows_BT1), device) if every else None

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def statistics(self, model) -> dict[str, float]:
        return method_statistics(model, self.ids)

    def run(self, step: int, model, abandon: Callable[[], bool] | None = None) -> dict[str, float]:
        return self.statistics(model)

    def grad_norms(self, model) -> dict[str, float]:
        return layer_grad_norms(model)
