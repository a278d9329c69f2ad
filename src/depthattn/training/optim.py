"""Optimizer and learning-rate schedule: AdamW with decay on projection and embedding matrices only, linear
warm-up then cosine (default), linear, constant or warmup–stable–decay to a floor (``lr_factor``).

Recipe (spec-depth-attention.md §12, the authors' released configs): AdamW β = (0.9, 0.95), eps 1e-8, weight decay
0.1, 2 % linear warm-up, cosine decay to 0.1 × peak, gradient clipping at 1.0.

Weight-decay groups (spec-baselines.md §8, "recommendation"): a parameter decays iff it is the weight matrix of an
``nn.Linear`` or ``nn.Embedding`` (every projection incl. mHC's φ, the token embedding, the untied LM head) and its
name matches no pattern of ``no_decay_patterns()``: ``NO_DECAY_PATTERNS`` (norm gains) plus each registered
cross-layer method's ``no_decay`` names (its ``MethodRecord``). Nothing else decays, whatever its shape: RMSNorm gains
(incl. ``q_norm`` / ``k_norm`` and mHC's ``norm.weight``), DenseFormer ``alpha``, mHC ``alpha`` / ``bias`` /
``readout``, and AttnRes ``query`` (w) / ``key_gain`` (g) / ``recency_bias`` (b). AttnRes stacks w and g into
``[A, C]`` matrices, so a shape rule (``ndim >= 2``) would wrongly decay them; the rule is by module type, and the
records name the cross-layer mixing parameters as well so that a future refactor into ``nn.Linear`` cannot silently
decay them. ``param_groups`` returns the decision per name; the run folder logs it in ``param_groups.json`` with
``decay_rule``.

The authors' split (``TrainConfig.weight_decay_method_params=True``, ``method_params=True`` here): their runs used the
Hugging Face Trainer's default groups (decay every parameter except those of norm modules and those named ``*bias*``),
which weight-decays the methods' mixing parameters. With it, the parameters the records name decay as well (DWA α,
mHC α / b / readout, AttnRes w), except ``AUTHORS_EXEMPT``: AttnRes g (a norm module's gain in their code) and b
(``*bias*`` by name there). Norm gains never decay (spec-baselines.md §8; docs/authors-checkpoints.md).
"""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from .. import cross_layer
from .config import ADAMW_IMPLS, DECAY_SHAPES, LR_SCHEDULES

#: Regular expressions (``re.search`` on the parameter name) of parameters that never decay, whatever the method:
#: norm gains (spec-baselines.md §8). The methods' own names come from their records (``no_decay_patterns``).
NO_DECAY_PATTERNS: list[str] = [
    r"norm\.weight$",
]

#: The rule, as logged in ``param_groups.json``.
DECAY_RULE = ("spec-baselines.md §8: decay the weights of nn.Linear / nn.Embedding (projections, mHC phi, embedding, "
              "LM head); never norm gains, DWA alpha, mHC alpha/bias/readout, AttnRes query/key_gain/recency_bias")
#: The authors' rule (``weight_decay_method_params=True``), as logged in ``param_groups.json``.
AUTHORS_DECAY_RULE = ("the authors' split (HF Trainer default: all but norm gains and *bias* names): decay the "
                      "weights of nn.Linear / nn.Embedding and the methods' parameters (DWA alpha, mHC alpha/bias/"
                      "readout, AttnRes query); never norm gains, AttnRes key_gain/recency_bias")
#: Method parameters that stay exempt under the authors' split: AttnRes g is the gain of a norm module in their code,
#: AttnRes b is named ``*bias*`` there (HF Trainer's default split exempts both; spec-baselines.md §8).
AUTHORS_EXEMPT: list[str] = [r"(^|\.)cross_layer\.(?:key_gain|recency_bias)$"]


def method_patterns() -> list[str]:
    """For every registered cross-layer method, its record's ``no_decay`` names anchored below a ``cross_layer``
    module (DWA α, mHC α / b / readout, AttnRes w / g / b; spec-baselines.md §8)."""
    return [rf"(^|\.)cross_layer\.(?:{p})$" for r in cross_layer.records() for p in r.no_decay]


def no_decay_patterns() -> list[str]:
    """``NO_DECAY_PATTERNS`` plus ``method_patterns()``: what never decays under the default rule."""
    return NO_DECAY_PATTERNS + method_patterns()


def decay_rule(method_params: bool = False) -> str:
    """The rule logged in ``param_groups.json``: ``DECAY_RULE``, or ``AUTHORS_DECAY_RULE`` with ``method_params``."""
    return AUTHORS_DECAY_RULE if method_params else DECAY_RULE


def decays(name: str, param: torch.Tensor, module: nn.Module | None, method_params: bool = False) -> bool:
    """Whether parameter ``name`` (owned directly by ``module``) gets weight decay (module docstring): the 2-D
    weight of an ``nn.Linear`` / ``nn.Embedding`` whose name matches no ``no_decay_patterns()``; with
    ``method_params`` (the authors' split) also any parameter a method's record names, whatever its shape, unless it
    matches ``NO_DECAY_PATTERNS`` (norm gains) or ``AUTHORS_EXEMPT``."""
    if method_params and any(re.search(p, name) for p in method_patterns()):
        return not any(re.search(p, name) for p in NO_DECAY_PATTERNS + AUTHORS_EXEMPT)
    if param.ndim != 2 or not isinstance(module, (nn.Linear, nn.Embedding)) or not name.endswith("weight"):
        return False
    return not any(re.search(p, name) for p in no_decay_patterns())


def param_groups(model: nn.Module, weight_decay: float,
                 method_params: bool = False) -> tuple[list[dict], dict[str, list[str]]]:
    """AdamW parameter groups ``[decay, no_decay]`` and the names in each (``{"decay": [...], "no_decay": [...]}``);
    ``method_params``: the authors' split (``decays``).

    Tied weights (the same tensor under two names) appear once.
    """
    owner = {id(p): m for m in model.modules() for p in m.parameters(recurse=False)}
    seen: set[int] = set()
    groups: dict[str, list] = {"decay": [], "no_decay": []}
    names: dict[str, list[str]] = {"decay": [], "no_decay": []}
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        key = "decay" if decays(name, p, owner.get(id(p)), method_params) else "no_decay"
        groups[key].append(p)
        names[key].append(name)
    return ([{"params": groups["decay"], "weight_decay": weight_decay},
             {"params": groups["no_decay"], "weight_decay": 0.0}], names)


def fused_adamw_supported(device: torch.device) -> bool:
    """Whether ``torch.optim.AdamW(fused=True)`` runs on ``device``'s type (torch's own list of fused-capable
    devices: CUDA, and in recent releases CPU, MPS, XPU...)."""
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices
    except ImportError:  # a private helper: an older/newer torch without it has CUDA's at least
        return device.type == "cuda"
    return device.type in _get_fused_kernels_supported_devices()


def resolve_adamw_impl(impl: str, device: torch.device) -> str:
    """The implementation a run on ``device`` uses for ``TrainConfig.adamw_impl=impl``: ``"auto"`` is ``"fused"``
    where the device has the fused kernel (``fused_adamw_supported``), else ``"foreach"``; the others are
    themselves. Raises ``ValueError`` for ``"fused"`` on a device without the kernel, or an unknown name."""
    if impl not in ADAMW_IMPLS:
        raise ValueError(f"TrainConfig.adamw_impl={impl!r} is invalid: choose one of {', '.join(ADAMW_IMPLS)}")
    if impl == "auto":
        return "fused" if fused_adamw_supported(device) else "foreach"
    if impl == "fused" and not fused_adamw_supported(device):
        raise ValueError(f"TrainConfig.adamw_impl='fused': torch {torch.__version__} has no fused AdamW on "
                         f"{device.type}; use adamw_impl=foreach (or auto)")
    return impl


def adamw_kwargs(impl: str) -> dict[str, bool | None]:
    """``torch.optim.AdamW`` keywords of a resolved implementation (``resolve_adamw_impl``)."""
    return {"fused": {"fused": True, "foreach": False}, "foreach": {"fused": False, "foreach": True},
            "plain": {"fused": False, "foreach": False}, "torch_default": {"fused": None, "foreach": None}}[impl]


def build_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.95),
                    eps: float = 1e-8, impl: str = "torch_default", *,
                    method_params: bool = False) -> tuple[torch.optim.AdamW, dict[str, list[str]]]:
    """AdamW over ``param_groups(model, weight_decay, method_params)``; returns the optimizer and the group names.
    ``impl``: a resolved ``adamw_impl`` (``resolve_adamw_impl``; the same update up to rounding,
    tests/training/test_schedules.py)."""
    groups, names = param_groups(model, weight_decay, method_params)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **adamw_kwargs(impl)), names


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.1, schedule: str = "cosine",
              decay_steps: int = 0, decay_shape: str = "linear") -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based).

    Linear warm-up ``(step + 1) / warmup_steps`` for ``step < warmup_steps``, then, with ``r = min_lr_ratio``:

    * ``"cosine"``: ``r + (1 - r) · ½ (1 + cos(π · p))``, ``p = (step - warmup) / max(1, total - 1 - warmup)``
      clipped to [0, 1]: 1 at ``step = warmup``, ``r`` at ``step = total - 1``;
    * ``"linear"``: ``r + (1 - r) · (1 - p)``, the same ``p``;
    * ``"constant"``: 1;
    * ``"wsd"`` (warmup–stable–decay; Hägele et al. 2024, arXiv 2405.18392): 1 up to ``d = total - decay_steps``,
      then ``r + (1 - r) · (1 - q)`` (``decay_shape="linear"``) or ``r + (1 - r) · (1 - √q)`` (``"1-sqrt"``) with
      ``q = (step - d) / (decay_steps - 1)`` clipped to [0, 1]: 1 at ``step = d``, ``r`` at ``total - 1``; a
      one-step decay (``q = 1``) trains its only step at ``r``.

    Raises ``ValueError`` for an unknown ``schedule`` or ``decay_shape`` (listing the choices), or a WSD decay that
    starts inside the warm-up (``total - decay_steps < warmup_steps``).
    """
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"TrainConfig.lr_schedule={schedule!r} is invalid: choose one of {', '.join(LR_SCHEDULES)}")
    if schedule == "wsd" and decay_shape not in DECAY_SHAPES:
        raise ValueError(f"TrainConfig.decay_shape={decay_shape!r} is invalid: choose one of {', '.join(DECAY_SHAPES)}")
    if schedule == "wsd" and total_steps - decay_steps < warmup_steps:
        raise ValueError(f"the WSD decay of {decay_steps} steps starts at step {total_steps - decay_steps}, inside the "
                         f"warm-up of {warmup_steps} steps (of {total_steps}); lower TrainConfig.decay_fraction or "
                         f"TrainConfig.warmup")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "wsd":
        start = total_steps - decay_steps
        if step < start:
            return 1.0
        q = min(1.0, (step - start) / (decay_steps - 1)) if decay_steps > 1 else 1.0  # one step: the floor
        return min_lr_ratio + (1.0 - min_lr_ratio) * (1.0 - (math.sqrt(q) if decay_shape == "1-sqrt" else q))
    progress = min(1.0, max(0.0, (step - warmup_steps) / max(1, total_steps - 1 - warmup_steps)))
    if schedule == "linear":
        return min_lr_ratio + (1.0 - min_lr_ratio) * (1.0 - progress)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def schedule_factor(cfg, step: int) -> float:
    """``lr_factor`` at ``step`` of a ``TrainConfig``'s schedule (its budget resolved: ``total_steps``)."""
    return lr_factor(step, cfg.warmup_steps(), cfg.total_steps(), cfg.min_lr_ratio, cfg.lr_schedule,
                     cfg.decay_steps(), cfg.decay_shape)


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                    min_lr_ratio: float = 0.1, schedule: str = "cosine", decay_steps: int = 0,
                    decay_shape: str = "linear") -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` applying ``lr_factor``; call ``scheduler.step()`` once after every optimizer step. Checks the
    schedule first (``lr_factor``'s ``ValueError``)."""
    lr_factor(0, warmup_steps, total_steps, min_lr_ratio, schedule, decay_steps, decay_shape)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup_steps, total_steps, min_lr_ratio, schedule, decay_steps,
                                          decay_shape))
