"""Mechanism controls (issue 14): value residual (ResFormer) and Depth-Attention with uniform weights.

Each is decode-exact (cached decode = full forward with left padding and chunked prefill), its gradients reach the
mixed layers, and it reduces to what it claims: value residual with λ = 1 is the plain decoder exactly, the uniform
control's depth weights are exactly 1/N and ignore queries and keys.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from depthattn import num_flops, num_params
from depthattn.attention import Attention
from depthattn.cli import main
from depthattn.cross_layer import get as method_record
from depthattn.cross_layer.depth_attention import model_plan
from depthattn.cross_layer.depth_attention_uniform import uniform_mix
from depthattn.cross_layer.value_residual import residual_mix
from depthattn.training.optim import param_groups

from conftest import build, padded_batch, perturb, tiny

CONTROLS = [
    ("value_residual", {}),
    ("value_residual", {"value_residual_lambda": 0.2}),
    ("value_residual", {"value_residual_learnable": True}),
    ("depth_attention_uniform", {}),
    ("depth_attention_uniform", {"depth_attention_stride": 1}),
    ("depth_attention_uniform", {"depth_attention_window": 2, "depth_attention_stride": 3}),
    ("depth_attention_uniform", {"num_loops": 2}),
]
IDS = [m + "".join(f"-{k}={v}" for k, v in kw.items()) for m, kw in CONTROLS]


def captured_values(model, ids, mask=None):
    """(raw v, value the attention used) per virtual layer, by wrapping ``Attention.project`` and the mix."""
    raw, used = {}, {}
    originals, hooks = [], []
    for layer in model.model.layers:
        attn = layer.self_attn
        project, mix = attn.project, attn.value_mix

        def proj(x, cos, sin, _p=project, _a=attn):
            q, k, v = _p(x, cos, sin)
            raw.setdefault(id(_a), []).append(v)
            return q, k, v

        def mixed(q, keys, values, _m=mix, _a=attn):
            out = _m(q, keys, values)
            used.setdefault(id(_a), []).append(out)
            return out

        originals.append((attn, project, mix))
        attn.project = proj
        if isinstance(mix, nn.Module):  # a mix with parameters: read its output with a hook
            hooks.append(mix.register_forward_hook(
                lambda mod, args, out, _a=attn: used.setdefault(id(_a), []).append(out)))
        else:
            attn.value_mix = mixed
    try:
        model(ids, attention_mask=mask)
    finally:
        for attn, project, mix in originals:
            del attn.project
            if not isinstance(mix, nn.Module):
                attn.value_mix = mix
        for h in hooks:
            h.remove()
    order = [id(layer.self_attn) for layer in model.model.layers]
    return [raw[i][0] for i in order], [used[i][0] if i in used else None for i in order]


# ----------------------------------------------------------------------------- both controls
@pytest.mark.parametrize("method,kw", CONTROLS, ids=IDS)
def test_accounting_matches_the_model(method, kw):
    cfg = tiny(method, **kw)
    model = build(cfg)
    assert sum(p.numel() for p in model.parameters()) == num_params(cfg)
    assert num_flops(cfg, 64).extra > 0
    assert method_record(method).at_init


@pytest.mark.parametrize("method,kw", CONTROLS, ids=IDS)
def test_gradients_reach_the_mixed_layers(method, kw):
    """Layer 0's value projection gets a gradient through the later layers' mixed values: it differs from the one
    of the plain decoder with the same weights; learnable λ get finite gradients and move."""
    torch.manual_seed(0)
    cfg = tiny(method, **kw)
    model = perturb(build(cfg)).train()
    vanilla = build(cfg.replace(cross_layer="none")).train()
    vanilla.load_state_dict(model.state_dict(), strict=False)
    ids, _ = padded_batch(cfg.vocab_size, T=10, pads=(0, 0))
    grads = []
    for m in (model, vanilla):
        m.zero_grad()
        m(ids, labels=ids).loss.backward()
        grads.append(m.model.layers[0].self_attn.v_proj.weight.grad.clone())
    assert torch.isfinite(grads[0]).all() and not torch.allclose(grads[0], grads[1], atol=1e-6)
    lams = [p for n, p in model.named_parameters() if n.endswith("value_mix.lam")]
    assert len(lams) == (cfg.num_hidden_layers - 1 if cfg.value_residual_learnable else 0)
    for p in lams:
        assert p.grad is not None and torch.isfinite(p.grad) and p.grad != 0


# ----------------------------------------------------------------------------- value residual
def test_value_residual_at_lambda_one_is_exactly_vanilla():
    ids, mask = padded_batch(512)
    vanilla = build(tiny("none"))
    for kw in ({}, {"value_residual_learnable": True}):
        model = build(tiny("value_residual", value_residual_lambda=1.0, **kw))
        model.load_state_dict(vanilla.state_dict(), strict=False)
        assert torch.equal(model(ids, attention_mask=mask).logits, vanilla(ids, attention_mask=mask).logits)


@pytest.mark.parametrize("kw", [{}, {"value_residual_lambda": 0.0}, {"value_residual_learnable": True}])
def test_value_residual_mixes_layer_zeros_value(kw):
    """Layer l >= 1 uses λ_l·v_l + (1 − λ_l)·v_0 (float64 reference); layer 0 is plain."""
    model = perturb(build(tiny("value_residual", **kw)))
    assert model.plan == ((), (0,), (0,), (0,))
    ids, mask = padded_batch(512)
    with torch.no_grad():
        raw, used = captured_values(model, ids, mask)
    assert used[0] is None
    for layer, (v, out) in enumerate(zip(raw, used)):
        if layer == 0:
            continue
        mix = model.model.layers[layer].self_attn.value_mix
        lam = float(mix.lam.detach()) if isinstance(mix, nn.Module) else mix.lam
        ref = lam * v.double() + (1 - lam) * raw[0].double()
        torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=0)


def test_value_residual_mix_gradcheck_and_exact_at_one():
    g = torch.Generator().manual_seed(0)
    v, v0 = (torch.randn(2, 2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    lam = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: residual_mix(a, b, c), (lam, v, v0))
    x, x0 = torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g)
    assert torch.equal(residual_mix(1.0, x, x0), x) and torch.equal(residual_mix(0.0, x, x0), x0)
    assert residual_mix(0.5, x.bfloat16(), x0.bfloat16()).dtype == torch.bfloat16


def test_learnable_lambdas_are_counted_and_never_decay():
    cfg = tiny("value_residual", value_residual_learnable=True)
    model = build(cfg)
    names = [n for n, _ in model.named_parameters() if "value_mix" in n]
    assert names == [f"model.layers.{i}.self_attn.value_mix.lam" for i in (1, 2, 3)]
    assert all(float(p.detach()) == 0.5 for n, p in model.named_parameters() if "value_mix" in n)
    _, groups = param_groups(model, 0.1)
    assert set(names) <= set(groups["no_decay"])
    assert num_params(cfg) == num_params(tiny("none")) + 3


@pytest.mark.parametrize("value", [1.5, -0.1, float("nan"), "half", True])
def test_bad_lambda_is_one_clear_error(value):
    with pytest.raises(ValueError, match=r"value_residual_lambda=.* is invalid: must be a number in \[0, 1\]"):
        tiny("value_residual", value_residual_lambda=value)


def test_bad_lambda_at_the_cli_is_one_line(capsys):
    assert main(["train", "--preset", "tiny", "--cross-layer", "value_residual", "--set",
                 "value_residual_lambda=1.5", "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "value_residual_lambda=1.5" in err[0] and "[0, 1]" in err[0]


def test_value_residual_does_not_loop():
    with pytest.raises(ValueError, match="num_loops=2 is invalid"):
        tiny("value_residual", num_loops=2)


# ----------------------------------------------------------------------------- uniform Depth-Attention
def test_uniform_weights_are_exactly_uniform_and_ignore_scores():
    g = torch.Generator().manual_seed(0)
    values = [torch.randn(2, 2, 5, 8, generator=g, dtype=torch.float64) for _ in range(3)]
    keys = [torch.randn(2, 2, 5, 8, generator=g, dtype=torch.float64) for _ in range(3)]
    q = torch.randn(2, 4, 5, 8, generator=g, dtype=torch.float64)
    out = uniform_mix(q, keys, values)
    torch.testing.assert_close(out, torch.stack(values).mean(0), atol=1e-15, rtol=0)
    assert torch.equal(out, uniform_mix(100 * q, [-k for k in keys], values))  # queries and keys do not matter
    # one-hot values read the weights off directly: each is exactly 1/3 in float32
    onehot = [torch.zeros(1, 1, 1, 3).index_fill_(-1, torch.tensor([i]), 1.0) for i in range(3)]
    w = uniform_mix(torch.zeros(1, 2, 1, 3), onehot, onehot)
    assert torch.equal(w, torch.full((1, 1, 1, 3), 1.0 / 3))
    v = torch.randn(2, 2, 5, 8, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: uniform_mix(q, keys[:2] + [keys[2]], values[:2] + [a]), (v,))


def test_uniform_control_uses_depth_attentions_plan_and_mixes_the_mean():
    for kw in ({}, {"depth_attention_stride": 1}, {"depth_attention_window": 2, "depth_attention_stride": 3}):
        cfg = tiny("depth_attention_uniform", **kw)
        model = build(cfg)
        assert model.plan == model_plan(cfg) == build(tiny("depth_attention", **kw)).plan
    cfg = tiny("depth_attention_uniform", depth_attention_stride=1)
    model = build(cfg)
    ids, mask = padded_batch(512)
    with torch.no_grad():
        raw, used = captured_values(model, ids, mask)
    # with stride 1 every earlier layer is a candidate: Ṽ_l is the running mean of the earlier Ṽ and v_l
    mixed = [raw[0].double()]
    for layer in range(1, cfg.num_hidden_layers):
        ref = (sum(mixed) + raw[layer].double()) / (layer + 1)
        torch.testing.assert_close(used[layer].double(), ref, atol=1e-6, rtol=0)
        mixed.append(ref)


def test_the_value_mix_is_the_records():
    cfg = tiny("depth_attention_uniform")
    assert Attention(cfg).value_mix is uniform_mix
    from depthattn.cross_layer.depth_attention import depth_mix
    assert Attention(tiny("depth_attention")).value_mix is depth_mix
