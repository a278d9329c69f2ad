"""The method registry: one frozen ``MethodRecord`` per ``cross_layer`` value.

Everything that depends on the method reads its record: ``ModelConfig`` validation (``names``, ``loopable``), model
construction (``layer``, ``model``, ``plan``), cost accounting (``extra_params``, ``extra_flops``,
``inflight_elements``) and the optimizer's weight-decay groups (``no_decay``). A method's record lives in its own file
next to its modules; the built-in records are registered by ``depthattn.cross_layer`` in a fixed order. A test (or a
user) registers a further method with ``register(record)`` and removes it with ``unregister(name)``, or uses
``registered(record)`` as a context manager.

This module imports nothing else of the package at run time (``ModelConfig`` only for type checking), so
``config.py`` can import the registry.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    from torch import nn

    from ..config import ModelConfig

#: A static candidate plan over virtual layers: the earlier layers whose (K̂, Ṽ) layer u reads, ascending.
Plan = tuple[tuple[int, ...], ...]


def no_extra_params(cfg: ModelConfig) -> int:
    """No added parameters."""
    return 0


def no_extra_flops(cfg: ModelConfig) -> float:
    """No added forward FLOPs."""
    return 0.0


def residual_stream_elements(cfg: ModelConfig) -> int:
    """One residual stream: ``hidden_size`` elements per token."""
    return cfg.hidden_size


def empty_plan(cfg: ModelConfig) -> Plan:
    """No value-seam sources for any virtual layer."""
    return ((),) * cfg.num_virtual_layers


def source_layers(plan: Plan) -> frozenset[int]:
    """S = ∪_l C(l): the layers whose (K̂, Ṽ) some later layer reads."""
    return frozenset(j for cands in plan for j in cands)


@dataclass(frozen=True)
class MethodRecord:
    """Everything the package needs to know about one cross-layer method.

    Attributes:
        name: the ``cross_layer`` value.
        at_init: the parameter-free / identity-at-init statement (house rule 4), as tested.
        layer: residual-seam layer module factory ``(cfg, layer_idx, device=None) -> nn.Module`` with
            ``prepare`` / ``read`` / ``write`` (``DecoderLayer.cross_layer``; see ``cross_layer.none.Residual``).
        model: residual-seam model module factory ``(cfg, device=None) -> nn.Module`` with ``begin`` / ``end``
            (``DecoderLM.model.cross_layer``).
        extra_params: parameters added to the vanilla model, ``cfg -> int``.
        extra_flops: forward FLOPs per token added to the vanilla model (multiply-add = 2), ``cfg -> float``.
        inflight_elements: residual-state elements one token carries through depth, ``cfg -> int``.
        loopable: whether ``num_loops > 1`` is defined for the method (spec-depth-attention.md §11).
        no_decay: regular expressions, each matched in full against a parameter's name below a ``cross_layer``
            module (per layer or per model), of the method's parameters that never get weight decay even when
            they are the weight of an ``nn.Linear`` / ``nn.Embedding`` (``optim.decays``).
        value_plan: the value seam: ``cfg -> Plan``, the static candidate plan over virtual layers whose values the
            attention mixes; None for a method that does not use the value seam.
        value_mix: the value seam's mix, a factory ``(cfg, layer_idx, device=None) -> mix`` called once per
            physical layer by ``Attention``; ``mix(q_BHTD, keys, values) -> v_BKTD`` takes the layer's queries
            ``[B, H, T, D]`` and the candidates' keys and values ``[B, K, T, D]`` each (plan order, **self last**)
            and returns the value the attention reads and the cache stores. A mix with parameters is an
            ``nn.Module`` (registered under ``self_attn.value_mix``). None (the default) is Depth-Attention's
            softmax mix over depth (``cross_layer.depth_attention.depth_mix``).
    """

    name: str
    at_init: str
    layer: Callable[..., nn.Module]
    model: Callable[..., nn.Module]
    extra_params: Callable[[ModelConfig], int] = no_extra_params
    extra_flops: Callable[[ModelConfig], float] = no_extra_flops
    inflight_elements: Callable[[ModelConfig], int] = residual_stream_elements
    loopable: bool = False
    no_decay: tuple[str, ...] = ()
    value_plan: Callable[[ModelConfig], Plan] | None = None
    value_mix: Callable[..., Callable] | None = None

    @property
    def has_value_seam(self) -> bool:
        """Whether the method mixes values along depth (the attention's value seam)."""
        return self.value_plan is not None

    @property
    def has_depth_weights(self) -> bool:
        """Whether the method mixes values by Depth-Attention's softmax over depth (``depth_mix``), so that each
        layer with sources has depth weights to report (``depth_attention``; the value-seam controls bring a mix
        with fixed weights, and the residual-seam methods have none)."""
        return self.has_value_seam and self.value_mix is None

    def plan(self, cfg: ModelConfig) -> Plan:
        """The value-seam plan the model runs: ``value_plan(cfg)``, or empty tuples without a value seam."""
        return empty_plan(cfg) if self.value_plan is None else self.value_plan(cfg)


_RECORDS: dict[str, MethodRecord] = {}


def register(record: MethodRecord) -> MethodRecord:
    """Add ``record`` under ``record.name``. Raises ``ValueError`` if the name is taken or not a non-empty str."""
    if not isinstance(record.name, str) or not record.name:
        raise ValueError(f"a cross-layer method needs a non-empty name, got {record.name!r}")
    if record.name in _RECORDS:
        raise ValueError(f"cross-layer method {record.name!r} is already registered")
    _RECORDS[record.name] = record
    return record


def unregister(name: str) -> MethodRecord:
    """Remove and return the record of ``name``. Raises ``KeyError`` naming it if it is not registered."""
    if name not in _RECORDS:
        raise KeyError(f"cross-layer method {name!r} is not registered")
    return _RECORDS.pop(name)


@contextlib.contextmanager
def registered(record: MethodRecord) -> Iterator[MethodRecord]:
    """Register ``record`` for the duration of a ``with`` block, then unregister it."""
    register(record)
    try:
        yield record
    finally:
        unregister(record.name)


def get(name: str) -> MethodRecord:
    """The record of ``name``. Raises ``ValueError`` listing the registered names if there is none."""
    try:
        return _RECORDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown cross_layer {name!r}; choose one of {names()}") from None


def names() -> tuple[str, ...]:
    """Every registered ``cross_layer`` value, in registration order."""
    return tuple(_RECORDS)


def loopable() -> tuple[str, ...]:
    """The registered methods for which ``num_loops > 1`` is defined, in registration order."""
    return tuple(name for name, record in _RECORDS.items() if record.loopable)


def records() -> tuple[MethodRecord, ...]:
    """Every registered record, in registration order."""
    return tuple(_RECORDS.values())
