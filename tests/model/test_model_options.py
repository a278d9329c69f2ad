"""Model options for the Depth-Attention authors' variants (issue 26, item 1): ``qk_norm_position`` (k_norm before or
after RoPE) and ``mhc_sinkhorn`` (log- or exp-domain Sinkhorn), through the core forward, the KV cache, compiled
decode, the HF wrapper, checkpoints, the Qwen3 export and accounting. The defaults are today's numbers (the existing
numeric tests, e.g. tests/model/test_model.py and tests/test_release_fixtures.py, stay green)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import types

import pytest
import torch

from depthattn import DecoderLM, ModelConfig, generate, naive_generate
from depthattn.accounting import num_flops, num_params
from depthattn.checkpoint import load_model, save_model
from depthattn.config import MHC_SINKHORN_FORMS, QK_NORM_POSITIONS
from depthattn.cross_layer import names as method_names
from depthattn.cross_layer.depth_attention import depth_mix
from depthattn.cross_layer.mhc import sinkhorn, sinkhorn_exp, sinkhorn_exp_ref

from conftest import cached_logits, left_padded_batch, make_model
from helpers import machine_timeout

POSITIONS = list(QK_NORM_POSITIONS)


def _perturb_k_norms(model, scale=0.5, seed=3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            w = layer.self_attn.k_norm.weight
            w.add_(scale * torch.randn(w.shape, generator=g))


# ----------------------------------------------------------------------------- qk_norm_position: the core
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("method", list(method_names()) + ["mhc:exp"])
def test_cached_decode_equals_full_forward(method, position):
    method, _, form = method.partition(":")
    model = make_model(cross_layer=method, qk_norm_position=position, mhc_sinkhorn=form or "log")
    ids, mask = left_padded_batch(512, [12, 7], seed=5)
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
    cached, _ = cached_logits(model, ids, mask, [5, 3, 1, 2, 1])
    torch.testing.assert_close(cached[mask], full[mask], atol=1e-5, rtol=0)


def _rope_vec(v, t, theta):
    """Explicit rotate-half RoPE of one head vector at position t: pairs (i, i + D/2), angle t·θ^(−2i/D)."""
    D = v.shape[0]
    out = v.clone()
    for i in range(D // 2):
        a = t * theta ** (-2.0 * i / D)
        c, s = math.cos(a), math.sin(a)
        out[i] = v[i] * c - v[i + D // 2] * s
        out[i + D // 2] = v[i + D // 2] * c + v[i] * s
    return out


def _norm_vec(v, gain, eps):
    return gain * v / torch.sqrt(v.pow(2).mean() + eps)


def _key_twin(x_BTC, attn, cfg):
    """K̂ ``[B, K, T, D]`` in float64, one head vector at a time: RoPE(k_norm(k)) or k_norm(RoPE(k))."""
    B, T, _ = x_BTC.shape
    K, D = attn.num_kv_heads, attn.head_dim
    W, gain = attn.k_proj.weight.double(), attn.k_norm.weight.double()
    out = torch.empty(B, K, T, D, dtype=torch.float64)
    for b in range(B):
        for h in range(K):
            for t in range(T):
                k = W[h * D:(h + 1) * D] @ x_BTC[b, t].double()
                if cfg.qk_norm_position == "k_after_rope":
                    out[b, h, t] = _norm_vec(_rope_vec(k, t, cfg.rope_theta), gain, cfg.rms_norm_eps)
                else:
                    out[b, h, t] = _rope_vec(_norm_vec(k, gain, cfg.rms_norm_eps), t, cfg.rope_theta)
    return out


@pytest.mark.parametrize("position", POSITIONS)
def test_keys_equal_the_slow_twin_and_are_what_the_cache_and_the_depth_mix_read(position):
    model = make_model(qk_norm_position=position)  # 5 layers, stride 2: layer 4 mixes layers 0 and 2
    _perturb_k_norms(model)
    inputs, outputs, mixed_keys = {}, {}, []
    hooks = []
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        hooks.append(attn.register_forward_pre_hook(lambda m, a, kw, i=i: inputs.__setitem__(i, a[0]),
                                                    with_kwargs=True))
        hooks.append(attn.register_forward_hook(lambda m, a, out, i=i: outputs.__setitem__(i, out[1][0])))
    model.model.layers[4].self_attn.value_mix = lambda q, keys, values: (mixed_keys.extend(keys),
                                                                         depth_mix(q, keys, values))[1]
    ids = torch.randint(1, 512, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    for i, layer in enumerate(model.model.layers):
        twin = _key_twin(inputs[i], layer.self_attn, model.config)
        torch.testing.assert_close(outputs[i].double(), twin, atol=1e-5, rtol=0)
    assert [k.data_ptr() for k in mixed_keys] == [outputs[j].data_ptr() for j in (0, 2, 4)]
    _, cache = cached_logits(model, ids, torch.ones_like(ids, dtype=torch.bool), [4, 1, 3, 1])
    for i in range(5):  # the cached key is the key the sequence attention and the depth mix used
        torch.testing.assert_close(cache.k[i], outputs[i], atol=1e-5, rtol=0)


def _logits_by_position(method, equal_gain_pairs=False):
    """``{qk_norm_position: logits at the unpadded positions}`` of one model with perturbed K-norm gains; with
    ``equal_gain_pairs`` each gain pair (i, i + D/2) is made equal first."""
    ids, mask = left_padded_batch(512, [12, 7], seed=5)
    logits = {}
    for position in POSITIONS:
        model = make_model(cross_layer=method, qk_norm_position=position)
        _perturb_k_norms(model)
        with torch.no_grad():
            for layer in model.model.layers if equal_gain_pairs else ():
                w = layer.self_attn.k_norm.weight
                half = w.shape[0] // 2
                w[half:] = w[:half]
                assert w[:half].std() > 0.1  # the gains still differ from channel to channel
            logits[position] = model(ids, attention_mask=mask).logits[mask]
    return logits


@pytest.mark.parametrize("method", ["none", "depth_attention"])
def test_k_after_rope_differs_from_before_rope_with_trained_like_gains(method):
    logits = _logits_by_position(method)
    assert (logits["before_rope"] - logits["k_after_rope"]).abs().max() > 0.05


@pytest.mark.parametrize("method", ["none", "depth_attention"])
def test_the_orders_agree_when_every_gain_pair_is_equal(method):
    """RMS is rotation-invariant, and a gain equal on (i, i + D/2) commutes with the rotation of that pair."""
    logits = _logits_by_position(method, equal_gain_pairs=True)
    assert (logits["before_rope"] - logits["k_after_rope"]).abs().max() <= 1e-6


@pytest.mark.compile
def test_compiled_decode_honours_k_after_rope():
    from depthattn.generate import CompiledDecoder, decode_one_token, prefill

    torch._dynamo.reset()
    model = make_model(num_hidden_layers=3, depth_attention_stride=1, qk_norm_position="k_after_rope")
    _perturb_k_norms(model)
    ids, mask = left_padded_batch(512, [6, 3], seed=7)
    eager = generate(model, ids, 5, temperature=0, attention_mask=mask)
    assert torch.equal(eager, naive_generate(model, ids, 5, attention_mask=mask))
    assert torch.equal(generate(model, ids, 5, temperature=0, attention_mask=mask, compile="eager"), eager)

    def steps(run_prefill, run_decode):
        cache = model.new_cache(2, ids.shape[1] + 5)
        out = [run_prefill(model, ids, mask, cache)]
        for _ in range(4):
            out.append(run_decode(model, out[-1].argmax(-1), cache))
        return torch.stack(out)

    decoder = CompiledDecoder("eager")
    torch.testing.assert_close(steps(decoder.prefill, decoder.decode_one_token), steps(prefill, decode_one_token),
                               atol=1e-5, rtol=0)
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- HF wrapper, checkpoints, export
def test_hf_wrapper_equals_the_core_and_a_checkpoint_keeps_both_options(tmp_path):
    from transformers import AutoModelForCausalLM

    from depthattn.hf import DepthAttnForCausalLM

    core = make_model(cross_layer="mhc", qk_norm_position="k_after_rope", mhc_sinkhorn="exp", vocab_size=128)
    _perturb_k_norms(core)
    ids, mask = left_padded_batch(128, [9, 5], seed=1)
    hf = DepthAttnForCausalLM.from_core(core).eval()
    with torch.no_grad():
        ref = core(ids, attention_mask=mask).logits
        assert torch.equal(hf(ids, attention_mask=mask).logits, ref)
    out = hf.generate(ids, attention_mask=mask.long(), max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(out, generate(core, ids, 5, temperature=0, attention_mask=mask))
    save_model(core, tmp_path / "ck")
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert cfg["qk_norm_position"] == "k_after_rope" and cfg["mhc_sinkhorn"] == "exp"
    back = load_model(tmp_path / "ck")
    assert back.config == core.config
    auto = AutoModelForCausalLM.from_pretrained(tmp_path / "ck").eval()
    with torch.no_grad():
        assert torch.equal(back(ids, attention_mask=mask).logits, ref)
        assert torch.equal(auto(ids, attention_mask=mask).logits, ref)
    # the copied remote code, in an interpreter that imports only transformers
    code = ("import torch; from transformers import AutoModelForCausalLM; "
            f"m=AutoModelForCausalLM.from_pretrained({str(tmp_path / 'ck')!r}, trust_remote_code=True).eval(); "
            "c=m.config.to_model_config(); print(type(m).__module__, c.qk_norm_position, c.mhc_sinkhorn); "
            "print(m(torch.arange(1, 9)[None]).logits.sum().item())")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=machine_timeout(180),
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    module, position, form, total = res.stdout.split()[-4:]
    assert module.startswith("transformers_modules") and (position, form) == ("k_after_rope", "exp")
    with torch.no_grad():
        assert float(total) == pytest.approx(core(torch.arange(1, 9)[None]).logits.sum().item(), abs=1e-4)


def test_a_config_class_without_the_fields_reads_as_the_defaults():
    """A checkpoint's copied configuration.py predating a ModelConfig field gives that field its default."""
    from depthattn.hf import DepthAttnConfig

    values = ModelConfig.from_preset("tiny").to_dict()
    for name in ("qk_norm_position", "mhc_sinkhorn"):
        values.pop(name)
    old = types.SimpleNamespace(**values)
    cfg = DepthAttnConfig.to_model_config(old)
    assert cfg == ModelConfig.from_preset("tiny") and cfg.qk_norm_position == "before_rope"


def test_a_release_checkpoint_without_the_keys_loads_with_the_defaults(tmp_path):
    import shutil

    from transformers import AutoModelForCausalLM

    from depthattn.hf import DepthAttnForCausalLM  # importing it registers the model type
    from release_fixtures import FIXTURES

    src = FIXTURES / "compare" / "runs" / "depth_attention-seed0" / "checkpoints" / "step_00000006"
    assert not {"qk_norm_position", "mhc_sinkhorn"} & set(json.loads((src / "config.json").read_text()))
    shutil.copytree(src, tmp_path / "ck")
    core = load_model(tmp_path / "ck")
    assert (core.config.qk_norm_position, core.config.mhc_sinkhorn) == ("before_rope", "log")
    auto = AutoModelForCausalLM.from_pretrained(tmp_path / "ck").eval()
    assert isinstance(auto, DepthAttnForCausalLM)
    ids = torch.arange(1, 9)[None]
    with torch.no_grad():
        assert torch.equal(auto(ids).logits, core(ids).logits)


def test_export_to_qwen3_refuses_k_after_rope_in_one_line(tmp_path, capsys):
    from depthattn.cli import main
    from depthattn.hf.convert import save_qwen3

    model = make_model(cross_layer="none", qk_norm_position="k_after_rope")
    with pytest.raises(ValueError, match=r"cannot export qk_norm_position='k_after_rope' to Qwen3"):
        save_qwen3(model, tmp_path / "x")
    assert not (tmp_path / "x").exists()
    save_model(model, tmp_path / "ck")
    capsys.readouterr()
    assert main(["convert", "--to-qwen3", str(tmp_path / "ck"), "--out", str(tmp_path / "q3")]) == 2
    err = capsys.readouterr().err.strip()
    assert "qk_norm_position='k_after_rope'" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "q3").exists()
    save_qwen3(make_model(cross_layer="none"), tmp_path / "plain")  # the default order still exports
    assert (tmp_path / "plain" / "model.safetensors").is_file()


@pytest.mark.parametrize("method", list(method_names()))
def test_accounting_and_dry_run_take_both_options(method):
    from depthattn.training.config import TrainConfig
    from depthattn.training.dry_run import dry_run

    base = ModelConfig.from_preset("tiny", cross_layer=method)
    other = base.replace(qk_norm_position="k_after_rope", mhc_sinkhorn="exp")
    assert num_flops(other) == num_flops(base) and num_params(other) == num_params(base)
    assert dry_run(other, TrainConfig(steps=10, device="cpu")).params == DecoderLM(other).num_params()


# ----------------------------------------------------------------------------- mhc_sinkhorn
@pytest.mark.parametrize("scale", [0.5, 3.0, 30.0, 200.0])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_exp_sinkhorn_equals_its_float64_twin(scale, n):
    g = torch.Generator().manual_seed(n)
    logits = scale * torch.randn(3, 2, n, n, generator=g)
    for iters in (1, 3, 20):
        fast = sinkhorn_exp(logits, iters)
        assert fast.dtype == torch.float32 and torch.isfinite(fast).all() and (fast > 0).all()
        torch.testing.assert_close(fast.double(), sinkhorn_exp_ref(logits, iters), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(fast.sum(-2), torch.ones(3, 2, n), atol=1e-6, rtol=0)  # columns last: exact


def test_exp_sinkhorn_differs_from_the_log_form():
    logits = 3.0 * torch.randn(8, 4, 4, generator=torch.Generator().manual_seed(0))
    exp_form, log_form = sinkhorn_exp(logits, 3), sinkhorn(logits, 3)
    assert (exp_form - log_form).abs().max() > 1e-2
    assert (exp_form.sum(-2) - 1).abs().max() < 1e-6 < (exp_form.sum(-1) - 1).abs().max()
    assert (log_form.sum(-1) - 1).abs().max() < 1e-6 < (log_form.sum(-2) - 1).abs().max()
    # the exp form is the log form of the transposed logits, transposed: storing transposed logits would give the
    # model Hresᵀ, not Hres, which is why no weight mapping turns one form into the other
    torch.testing.assert_close(exp_form, sinkhorn(logits.transpose(-1, -2), 3).transpose(-1, -2), atol=1e-6, rtol=0)


@pytest.mark.parametrize("form", MHC_SINKHORN_FORMS)
def test_the_connector_projects_hres_with_the_chosen_form(form):
    from depthattn.cross_layer.mhc import sinkhorn_ref

    model = make_model(cross_layer="mhc", mhc_sinkhorn=form, mhc_sinkhorn_iters=3)
    conn = model.model.layers[1].cross_layer.connectors[0]
    with torch.no_grad():
        conn.bias.add_(2.0 * torch.randn(conn.bias.shape, generator=torch.Generator().manual_seed(4)))
        conn.alpha.fill_(1.0)
        C = conn.norm.weight.shape[0] // conn.n
        X = torch.randn(2, 3, conn.n, C, generator=torch.Generator().manual_seed(5))
        _, _, hres = conn.maps(X)
        x = X.reshape(2, 3, -1).double()
        x = conn.norm.weight.double() * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + conn.norm.eps)
        n = conn.n
        res = (x @ conn.phi.weight.double().T)[..., 2 * n:] * conn.alpha[2].double() + conn.bias[2 * n:].double()
        twin = (sinkhorn_exp_ref if form == "exp" else sinkhorn_ref)(res.view(2, 3, n, n), 3)
    torch.testing.assert_close(hres.double(), twin, atol=1e-5, rtol=0)


def test_mhc_logits_depend_on_the_sinkhorn_form():
    ids, mask = left_padded_batch(512, [12, 7], seed=5)
    logits = {}
    for form in MHC_SINKHORN_FORMS:
        model = make_model(cross_layer="mhc", mhc_sinkhorn=form, mhc_sinkhorn_iters=3)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("connectors.0.bias") or name.endswith("connectors.1.bias"):
                    p.add_(2.0 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
            logits[form] = model(ids, attention_mask=mask).logits[mask]
    assert (logits["log"] - logits["exp"]).abs().max() > 1e-3


# ----------------------------------------------------------------------------- against the authors' forward
def _authors_fixtures():
    from test_authors_reference import FOLDERS

    return FOLDERS


@pytest.mark.parametrize("name", _authors_fixtures())
@pytest.mark.parametrize("position", POSITIONS)
def test_the_options_compute_the_authors_forward_on_their_fixtures(name, position):
    """Their tiny folders (tests/fixtures/authors), hand-mapped into a DecoderLM with ``mhc_sinkhorn="exp"`` and
    ``qk_norm_position``, equal the float64 reference of their forward (tests/authors_reference.py) in the matching
    attention class: k_after_rope ↔ their SDPA class, before_rope ↔ their FlashAttention-2 class; and not the other."""
    from test_authors_reference import (TOL, authors_logits, fixture, ids, max_abs, our_config, our_state,
                                        resolve)

    config, state = fixture(name)
    spec = resolve(config)
    model = DecoderLM(our_config(config, spec).replace(qk_norm_position=position, mhc_sinkhorn="exp"))
    model.load_state_dict(our_state(config, state, spec), strict=True)
    x = ids(config["vocab_size"])
    with torch.no_grad():
        logits = model.eval()(x).logits
    order, other = ("sdpa", "fa2") if position == "k_after_rope" else ("fa2", "sdpa")
    assert max_abs(logits, authors_logits(config, state, x, order)) <= TOL
    assert max_abs(logits, authors_logits(config, state, x, other)) > 0.1
