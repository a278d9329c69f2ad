"""Optimizer and learning-rate schedule: AdamW with decay on projection and embedding matrices only, linear
warm-up then cosine to a floor.

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


def build_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.95),
                    eps: float = 1e-8, *,
                    method_params: bool = False) -> tuple[torch.optim.AdamW, dict[str, list[str]]]:
    """AdamW over ``param_groups(model, weight_decay, method_params)``; returns the optimizer and the group names."""
    groups, names = param_groups(model, weight_decay, method_params)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps), names


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.1) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based).

    Linear warm-up ``(step + 1) / warmup_steps`` for ``step < warmup_steps``, then cosine from 1 down to
    ``min_lr_ratio`` at ``step = total_steps - 1``: ``r + (1 - r) · ½ (1 + cos(π · p))`` with
    ``p = (step - warmup) / max(1, total - 1 - warmup)`` clipped to [0, 1].
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, max(0.0, (step - warmup_steps) / max(1, total_steps - 1 - warmup_steps)))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                    min_lr_ratio: float = 0.1) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` applying ``lr_factor``; call ``scheduler.step()`` once after every optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup_steps, total_steps, min_lr_ratio))
