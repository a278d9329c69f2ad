"""Cross-layer baselines on the residual seam: DenseFormer, mHC, Attention Residuals (spec-baselines.md §9).

Tiny fp32 CPU models. Every test asserts numbers: equality with vanilla or with a reference twin, hand-written
source tables, closed-form parameter counts, cached = uncached.
"""

from __future__ import annotations

import math

import pytest
import torch

from depthattn import DecoderLM, ModelConfig, num_params
from depthattn.accounting import inflight_bytes_per_token
from depthattn.cross_layer import get as method_record
from depthattn.cross_layer.attnres import (attnres_mix, attnres_mix_ref, kimi_schedule, kimi_source_labels,
                                           recency_schedule, source_counts)
from depthattn.cross_layer.denseformer import dwa, dwa_blocks, dwa_ref, dwa_sources
from depthattn.cross_layer.mhc import sinkhorn, sinkhorn_ref

from conftest import build, padded_batch, perturb, tiny

# (cross_layer, knobs): the residual-seam methods with the small block sizes (every method: test_method_contract.py)
CASES = [
    ("none", {}),
    ("denseformer", {}),
    ("denseformer", {"denseformer_dilation": 2}),
    ("denseformer", {"denseformer_period": 2}),
    ("mhc", {}),
    ("mhc", {"mhc_num_streams": 3}),
    ("attnres", {}),
    ("attnres", {"attnres_block_size": 2}),
    ("attnres", {"attnres_block_size": 3}),
    ("attnres", {"attnres_block_size": 2, "attnres_recency_bias": 3.0}),
    ("attnres", {"attnres_block_size": 3, "attnres_recency_bias": 1.0}),
]
IDS = [m + "".join(f"-{k.split('_', 1)[1]}={v}" for k, v in kw.items()) for m, kw in CASES]


def vanilla_weights_into(model: DecoderLM, vanilla: DecoderLM) -> DecoderLM:
    """Copy the backbone weights of ``vanilla``; the method's own parameters keep their init."""
    missing, unexpected = model.load_state_dict(vanilla.state_dict(), strict=False)
    assert not unexpected and all(".cross_layer." in k for k in missing)
    return model


# ----------------------------------------------------------------------------- every method
@pytest.mark.parametrize("method,kw", [c for c in CASES if c[0] != "none"], ids=IDS[1:])
def test_gradients_reach_every_method_parameter(method, kw):
    model = build(tiny(method, **kw)).train()
    ids, _ = padded_batch(model.config.vocab_size, T=10, pads=(0, 0))
    mine = {n: p for n, p in model.named_parameters() if ".cross_layer." in n or n.startswith("model.cross_layer")}
    assert mine
    before = {n: p.detach().clone() for n, p in mine.items()}
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(2):
        opt.zero_grad()
        model(ids, labels=ids).loss.backward()
        for n, p in mine.items():
            assert p.grad is not None and torch.isfinite(p.grad).all(), n
        opt.step()
    for n, p in mine.items():  # zero-initialised ones included (AttnRes gains only get a gradient once w != 0)
        assert not torch.equal(p.detach(), before[n]), f"{n} did not move in two Adam steps"


PRESETS = ["tiny", "small", "360m", "1.5b", "3b"]


def formula(cfg: ModelConfig) -> int:
    """docs/methods.md closed forms for the default knobs (D = hidden_size, L = num_hidden_layers)."""
    D, L = cfg.hidden_size, cfg.num_hidden_layers
    if cfg.cross_layer == "denseformer":
        return L * (L + 3) // 2
    if cfg.cross_layer == "mhc":
        n = cfg.mhc_num_streams
        return 2 * L * (n * D + n * D * (n * n + 2 * n) + n * n + 2 * n + 3) + n
    if cfg.cross_layer == "attnres":
        return (2 * L + 1) * (2 * D + (cfg.attnres_recency_bias is not None))
    return 0


@pytest.mark.parametrize("preset", PRESETS)
def test_parameter_counts(preset):
    vanilla = num_params(ModelConfig.from_preset(preset))
    for method, kw in [("none", {}), ("depth_attention", {}), ("denseformer", {}), ("mhc", {}), ("attnres", {}),
                       ("attnres", {"attnres_recency_bias": 3.0})]:
        cfg = ModelConfig.from_preset(preset, cross_layer=method, **kw)
        allocated = DecoderLM(cfg, device="meta").num_params()
        assert allocated == num_params(cfg) == vanilla + formula(cfg), (preset, method, kw)


def test_paper_scale_numbers_from_the_spec():
    """The [derived] figures of spec-baselines.md §3, §5, §6."""
    f = {p: {m: ModelConfig.from_preset(p, cross_layer=m) for m in ("denseformer", "mhc", "attnres")}
         for p in ("360m", "1.5b", "3b")}
    assert formula(f["360m"]["denseformer"]) == 560 and formula(f["3b"]["denseformer"]) == 1224
    assert [formula(f[p]["attnres"]) for p in f] == [133_120, 297_984, 397_312]
    assert [round(formula(f[p]["mhc"]) / 1e4) for p in f] == [656, 1475, 1966]
    assert [round(method_record("mhc").extra_flops(f[p]["mhc"]) / 1e5) for p in f] == [165, 372, 495]
    assert [round(method_record("denseformer").extra_flops(f[p]["denseformer"]) / 1e4) for p in f] == [115, 376, 501]
    assert [sum(source_counts(f[p]["attnres"])) for p in f] == [269, 529, 529]
    assert inflight_bytes_per_token(f["3b"]["attnres"], torch.bfloat16) == 18_432 * 2
    assert inflight_bytes_per_token(f["3b"]["denseformer"], torch.bfloat16) == 100_352 * 2
    assert inflight_bytes_per_token(f["3b"]["mhc"], torch.bfloat16) == 8_192 * 2


@pytest.mark.parametrize("knob,value", [
    ("mhc_num_streams", 0), ("mhc_sinkhorn_iters", 0), ("attnres_block_size", 0), ("attnres_block_size", -2),
    ("denseformer_dilation", 0), ("denseformer_period", 0), ("num_loops", 0), ("attnres_recency_bias", math.inf),
])
def test_bad_knobs_raise(knob, value):
    with pytest.raises(ValueError, match=rf"{knob}={value!r}"):
        tiny("mhc", **{knob: value})


@pytest.mark.parametrize("method", ["denseformer", "mhc", "attnres"])
def test_looping_rejected_for_residual_methods(method):
    with pytest.raises(ValueError, match=r"num_loops=2 is invalid: looped models are defined only"):
        tiny(method, num_loops=2)


# ----------------------------------------------------------------------------- DenseFormer
@pytest.mark.parametrize("k,p", [(1, 1), (2, 1), (1, 2)])
def test_denseformer_at_init_is_exactly_vanilla(k, p):
    vanilla = build(tiny(num_hidden_layers=6))
    model = vanilla_weights_into(DecoderLM(tiny("denseformer", num_hidden_layers=6, denseformer_dilation=k,
                                                denseformer_period=p)).eval(), vanilla)
    ids, mask = padded_batch(512)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, attention_mask=mask).logits, vanilla(ids, attention_mask=mask).logits,
                                   atol=0, rtol=0)
    n_dwa = sum(m.alpha is not None for m in (layer.cross_layer for layer in model.model.layers))
    assert n_dwa == 6 // p


def test_dwa_sources_and_blocks():
    assert dwa_sources(4, 1) == (0, 1, 2, 3, 4) and dwa_sources(4, 2) == (0, 2, 4) and dwa_sources(5, 2) == (1, 3, 5)
    assert dwa_sources(7, 3) == (1, 4, 7)
    for k in (1, 2, 3):
        for i in range(1, 13):
            assert len(dwa_sources(i, k)) == i // k + 1
    assert dwa_blocks(6, 1) == (1, 2, 3, 4, 5, 6) and dwa_blocks(6, 2) == (2, 4, 6) and dwa_blocks(7, 3) == (3, 6)


def test_dwa_matches_reference_and_is_exact_at_init():
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(2, 5, 16, generator=g) for _ in range(6)]
    alpha = torch.randn(6, generator=g)
    torch.testing.assert_close(dwa(alpha, xs), dwa_ref(alpha, xs), atol=1e-6, rtol=0)
    one_hot = torch.zeros(6)
    one_hot[-1] = 1.0
    assert torch.equal(dwa(one_hot, xs), xs[-1]) and torch.equal(dwa_ref(one_hot, xs), xs[-1])
    xb = [x.bfloat16() for x in xs]
    assert dwa(alpha, xb).dtype == torch.bfloat16
    torch.testing.assert_close(dwa(alpha, xb), dwa_ref(alpha, xb), atol=0, rtol=0)


# ----------------------------------------------------------------------------- mHC
def test_sinkhorn_matches_reference_and_is_row_stochastic():
    """The log-domain rounds equal plain float64 Sinkhorn rounds (the slow twin), at small and large logit scale."""
    g = torch.Generator().manual_seed(0)
    for n, scale in [(4, 1.0), (3, 5.0), (4, 30.0), (2, 1.0), (1, 1.0)]:
        logits = scale * torch.randn(3, n, n, generator=g)
        fast, ref = sinkhorn(logits, 20), sinkhorn_ref(logits, 20)
        torch.testing.assert_close(fast.double(), ref, atol=1e-5, rtol=0)
        assert fast.dtype == torch.float32 and (fast > 0).all()
        assert (fast.sum(-1) - 1).abs().max() <= 1e-6
    assert torch.isfinite(sinkhorn(torch.full((4, 4), -1e4).bfloat16(), 20)).all()


@pytest.mark.parametrize("n", [2, 3, 4])
def test_sinkhorn_meets_its_column_bound_at_logit_scale_30(n):
    """The bound in ``sinkhorn``'s docstring: rows within 1e-6 of 1 at any scale; columns within 1e-3 of 1 for
    logits s · N(0, 1), s <= 30, after 2000 rounds; 20 rounds (the paper's) do not reach it at s = 30."""
    g = torch.Generator().manual_seed(n)
    logits = 30.0 * torch.randn(200, n, n, generator=g)
    p = sinkhorn(logits, 2000)
    assert torch.isfinite(p).all() and (p >= 0).all()
    assert (p.sum(-2) - 1).abs().max() <= 1e-3
    assert (p.sum(-1) - 1).abs().max() <= 1e-6
    short = sinkhorn(logits, 20)
    assert (short.sum(-1) - 1).abs().max() <= 1e-6 and (short.sum(-2) - 1).abs().max() > 1e-2
    big = sinkhorn(torch.tensor([[0.0, -200.0], [-200.0, -400.0]]), 20)  # exp(-400) underflows; the log form does not
    assert torch.isfinite(big).all() and (big.sum(-1) - 1).abs().max() <= 1e-6


def _streams_and_maps(model: DecoderLM, ids: torch.Tensor):
    h0 = model.model.embed_tokens(ids)
    X = model.model.cross_layer.begin(h0)
    return model.model.layers[0].cross_layer.connectors[0].maps(X)


@torch.no_grad()
def test_mhc_maps_at_init():
    model = build(tiny("mhc"))
    ids, _ = padded_batch(512, pads=(0, 0))
    hpre, hpost, hres = _streams_and_maps(model, ids)
    n = model.config.mhc_num_streams
    assert (hres.sum(-1) - 1).abs().max() <= 1e-6
    assert (hres.sum(-2) - 1).abs().max() <= 1e-4
    # dynamic logits are α·x̃φ with α = 0.01, φ ~ N(0, 0.02²), |x̃| = √(nC): std σ ≈ 0.01·0.02·16 = 3.2e-3; we allow
    # 5σ times the sigmoid slope: σ'(logit(1/4)) = 0.1875 for Hpre, 2·σ'(0) = 0.5 for Hpost
    assert (hpre - 1 / n).abs().max() <= 5 * 3.2e-3 * 0.1875 and (hpost - 1).abs().max() <= 5 * 3.2e-3 * 0.5
    assert (torch.diagonal(hres, dim1=-2, dim2=-1) - 0.99).abs().max() <= 5 * 3.2e-3
    model.model.layers[0].cross_layer.connectors[0].phi.weight.zero_()
    hpre, hpost, hres = _streams_and_maps(model, ids)
    torch.testing.assert_close(hpre.sum(-1), torch.ones_like(hpre[..., 0]), atol=1e-6, rtol=0)
    assert torch.equal(hpost, torch.ones_like(hpost))


@pytest.mark.parametrize("n", [4, 3, 1])
def test_mhc_with_zero_phi_equals_vanilla(n):
    vanilla = build(tiny())
    model = vanilla_weights_into(DecoderLM(tiny("mhc", mhc_num_streams=n)).eval(), vanilla)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("phi.weight"):
                p.zero_()
        ids, mask = padded_batch(512)
        a, b = model(ids, attention_mask=mask).logits, vanilla(ids, attention_mask=mask).logits
    torch.testing.assert_close(a[mask], b[mask], atol=2e-5, rtol=0)


@torch.no_grad()
def test_mhc_default_init_is_near_vanilla():
    """The dynamic logits α·x̃φ have std α·σ·√(nC) = 0.01·0.02·16 = 3.2e-3 at tiny scale (spec §5), which perturbs
    Hpre/Hpost/Hres — and hence each residual update — by a relative ~1e-3. Measured (seed 5): max |Δlogit| 6.3e-4,
    RMS(Δ)/RMS(logits) 6.6e-4 with logits of std 0.16. We allow 5e-3 absolute and 5e-3 relative RMS."""
    vanilla = build(tiny())
    model = vanilla_weights_into(build(tiny("mhc"), seed=5), vanilla)
    ids, mask = padded_batch(512)
    a, b = model(ids, attention_mask=mask).logits[mask], vanilla(ids, attention_mask=mask).logits[mask]
    diff = (a - b)
    assert diff.abs().max() < 5e-3
    assert diff.pow(2).mean().sqrt() / b.pow(2).mean().sqrt() < 5e-3
    assert diff.abs().max() > 0  # the default φ really is not zero


def test_mhc_bf16_autocast_has_no_nan():
    model = perturb(build(tiny("mhc")), scale=2.0).train()
    ids, _ = padded_batch(512, pads=(0, 0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids, labels=ids)
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.logits).all()
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# ----------------------------------------------------------------------------- Attention Residuals
def _expand(blocks: list[tuple[int, int]]) -> tuple[tuple[str, ...], ...]:
    """Hand table by block ranges: sublayer g of block n (1-based) reads b0..b(n-1), plus p(n) unless g is first."""
    out = []
    for n, (first, last) in enumerate(blocks, start=1):
        for g in range(first, last + 1):
            out.append(tuple(f"b{m}" for m in range(n)) + (() if g == first else (f"p{n}",)))
    return tuple(out)


KIMI_TABLES = {
    (4, 2): ((("b0",), ("b0", "p1"), ("b0", "b1"), ("b0", "b1", "p2"), ("b0", "b1", "b2"), ("b0", "b1", "b2", "p3"),
              ("b0", "b1", "b2", "b3"), ("b0", "b1", "b2", "b3", "p4")), ("b0", "b1", "b2", "b3", "b4")),
    (4, 3): ((("b0",), ("b0", "p1"), ("b0", "p1"), ("b0", "b1"), ("b0", "b1", "p2"), ("b0", "b1", "p2"),
              ("b0", "b1", "b2"), ("b0", "b1", "b2", "p3")), ("b0", "b1", "b2", "b3")),
    (32, 12): (_expand([(0, 11), (12, 23), (24, 35), (36, 47), (48, 59), (60, 63)]),
               ("b0", "b1", "b2", "b3", "b4", "b5", "b6")),
    (48, 12): (_expand([(0, 11), (12, 23), (24, 35), (36, 47), (48, 59), (60, 71), (72, 83), (84, 95)]),
               ("b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8")),
}


@pytest.mark.parametrize("L,S", list(KIMI_TABLES))
def test_attnres_source_lists_match_hand_tables(L, S):
    per, final = kimi_source_labels(2 * L, S)
    assert (per, final) == KIMI_TABLES[(L, S)]
    closes = [g for g, (_, _, c) in enumerate(kimi_schedule(2 * L, S)) if c]
    assert closes == [min(b * S, 2 * L) - 1 for b in range(1, -(-2 * L // S) + 1)]


def test_recency_schedule():
    per, final = recency_schedule(96, 12)  # L = 48, S = 12: a snapshot every 6 blocks
    assert [g for g, (_, s) in enumerate(per) if s] == list(range(11, 96, 12))
    assert max(k for k, _ in per) + 1 == 9 and final + 1 == 10  # sources incl. the current r (spec §6.2)
    per, final = recency_schedule(8, 3)  # L = 4, S = 3: counter reaches 3 at g = 2, snapshot after MLP g = 3
    assert per == ((1, False), (1, False), (1, False), (1, True), (2, False), (2, False), (2, False), (2, True))
    assert final == 3


def test_attnres_mix_matches_reference():
    g = torch.Generator().manual_seed(0)
    srcs = [torch.randn(2, 5, 16, generator=g) * (k + 1) for k in range(4)]
    w, gain = torch.randn(16, generator=g), 1 + 0.1 * torch.randn(16, generator=g)
    for bias in (None, torch.tensor(2.5)):
        out, a = attnres_mix(srcs, w, gain, 1e-6, bias)
        out_ref, a_ref = attnres_mix_ref(srcs, w, gain, 1e-6, bias)
        torch.testing.assert_close(a, a_ref, atol=1e-6, rtol=0)
        torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=0)


def _record_weights(model: DecoderLM, ids: torch.Tensor) -> list[torch.Tensor]:
    """Run a forward, recording each aggregator's softmax weights (sublayers in order, then the final one)."""
    rec = []
    for layer in model.model.layers:
        m = layer.cross_layer
        m.read = (lambda orig, m: lambda state, s: (rec.append(m.mix_weights(state, s)), orig(state, s))[1])(m.read, m)
    fin = model.model.cross_layer
    fin.end = (lambda orig: lambda state: (rec.append(fin.mix_weights(state)), orig(state))[1])(fin.end)
    with torch.no_grad():
        model(ids)
    return rec


@pytest.mark.parametrize("S", [2, 3, 12])
def test_attnres_weights_uniform_at_init(S):
    model = build(tiny("attnres", attnres_block_size=S))
    rec = _record_weights(model, padded_batch(512, pads=(0, 0))[0])
    counts = source_counts(model.config)
    assert [w.shape[-1] for w in rec] == list(counts)
    for w in rec:
        torch.testing.assert_close(w, torch.full_like(w, 1 / w.shape[-1]), atol=1e-7, rtol=0)


@pytest.mark.parametrize("S", [2, 3, 12])
def test_attnres_with_zero_eps_equals_vanilla(S):
    vanilla = build(tiny(rms_norm_eps=0.0))
    model = vanilla_weights_into(DecoderLM(tiny("attnres", rms_norm_eps=0.0, attnres_block_size=S)).eval(), vanilla)
    ids, mask = padded_batch(512)
    with torch.no_grad():
        a, b = model(ids, attention_mask=mask).logits, vanilla(ids, attention_mask=mask).logits
    torch.testing.assert_close(a[mask], b[mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize("S,b", [(2, 3.0), (3, 3.0), (4, 0.5)])
def test_attnres_recency_current_weight_at_init(S, b):
    model = build(tiny("attnres", attnres_block_size=S, attnres_recency_bias=b))
    rec = _record_weights(model, padded_batch(512, pads=(0, 0))[0])
    per, final = recency_schedule(2 * model.config.num_hidden_layers, S)
    others = [k for k, _ in per] + [final]
    assert [w.shape[-1] for w in rec] == [k + 1 for k in others]
    for w, k in zip(rec, others):
        expected = math.exp(b) / (math.exp(b) + k)
        torch.testing.assert_close(w[..., -1], torch.full_like(w[..., -1], expected), atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- inspect and docs
def test_inspect_tables_in_docs_are_current(capsys):
    """docs/methods.md holds the output of ``depthattn inspect`` for 360m, 1.5b and 3b (regenerate if this fails)."""
    from pathlib import Path

    from depthattn.cli import main

    doc = (Path(__file__).resolve().parents[2] / "docs" / "methods.md").read_text(encoding="utf-8")
    for preset in ("360m", "1.5b", "3b"):
        assert main(["inspect", "--preset", preset, "--cross-layer", "all", "--prompt-len", "2048"]) == 0
        table = capsys.readouterr().out.splitlines()[1:]
        assert len(table) == 2 + 7 and "\n".join(table) in doc, preset
    assert main(["inspect", "--preset", "tiny", "--cross-layer", "mhc", "--loops", "2"]) == 2
    assert "num_loops=2" in capsys.readouterr().err
