"""The contract every registered cross-layer method keeps, one test parametrised over the methods and their knobs:
cached decode (token by token and in uneven chunks, left-padded) equals the full forward and greedy cached generation
equals the cache-free reference; activation checkpointing leaves every gradient unchanged."""

from __future__ import annotations

import pytest
import torch

from depthattn.cross_layer import names

from conftest import assert_cache_matches_full, build, padded_batch, perturb, tiny
from test_controls import CONTROLS
from test_residual import CASES as RESIDUAL_CASES

#: Every method: the residual-seam cases of test_residual.py (small block sizes, strides), Depth-Attention's, and
#: the controls of test_controls.py (loops included).
CASES = [RESIDUAL_CASES[0], ("depth_attention", {}), ("depth_attention", {"depth_attention_stride": 1}),
         *RESIDUAL_CASES[1:], *CONTROLS]
IDS = [m + "".join(f"-{k}={v}" for k, v in kw.items()) for m, kw in CASES]


def test_cases_cover_every_registered_method():
    assert {m for m, _ in CASES} == set(names())


@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_cached_decode_equals_full_forward(method, kw):
    assert_cache_matches_full(perturb(build(tiny(method, **kw))))


@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_activation_checkpointing_gives_same_gradients(method, kw):
    model = perturb(build(tiny(method, **kw))).train()
    ids, mask = padded_batch(model.config.vocab_size, T=8)
    grads = []
    for ckpt in (False, True):
        model.zero_grad()
        model.activation_checkpointing = ckpt
        model(ids, attention_mask=mask, labels=ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], atol=1e-6, rtol=0, msg=n)
