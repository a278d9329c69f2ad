"""The authors' checkpoints (hyq718/Depth-Attention): our float64 reference of their forward, and imports against it.

Part (a) checks the reference itself (``tests/authors_reference.py``): how it resolves every fixture's switches,
its Sinkhorn's order, that the two q/k norm orders differ, that the "off" config is vanilla, and — by hand-mapping
each fixture's weights into ``DecoderLM`` where our math already equals theirs (the FlashAttention-2 norm order,
and for mHC a Sinkhorn fixed point) — that it agrees with our independent implementation to float32 rounding.
Part (b) (``test_imported_model_equals_reference``) loads every fixture folder with ``depthattn.checkpoint.
load_model`` and asserts the imported model's float32 logits equal the reference, and cached greedy decoding equals
full recompute. Fixture folders: ``tests/fixtures/authors`` (``make.py``; what each covers: its README.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from authors_reference import authors_logits, read_folder, resolve, sinkhorn_exp
from depthattn import DecoderLM, ModelConfig
from depthattn.cross_layer.mhc import sinkhorn

FIXTURES = Path(__file__).parents[1] / "fixtures" / "authors"
FOLDERS = sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").exists())
ORDER_OF_POSITION = {"k_after_rope": "sdpa", "before_rope": "fa2"}
TOL = 1e-5


def ids(vocab: int, B: int = 2, T: int = 7, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def fixture(name: str):
    return read_folder(FIXTURES / name)


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


# ----------------------------------------------------------------------------- (a) the reference itself
EXPECTED_RESOLUTION = {
    "da_old_fp32": dict(method="depth_attention", stride=2, window=0),
    "da_new_bf16": dict(method="depth_attention", stride=2, window=0),
    "da_loader_bf16": dict(method="depth_attention", stride=2, window=0),
    "da_nostride_fp32": dict(method="depth_attention", stride=1, window=0),
    "da_window_bf16": dict(method="depth_attention", stride=3, window=1),
    "da_sharded_bf16": dict(method="depth_attention", stride=2, window=1),
    "da_off_bf16": dict(method="vanilla"),
    "vanilla_bf16": dict(method="vanilla"),
    "mhc_new_bf16": dict(method="mhc", streams=4, iters=20),
    "mhc_old_fp32": dict(method="mhc", streams=2, iters=7),
    "mhc_loader_bf16": dict(method="mhc", streams=3, iters=20),
    "attnres_new_bf16": dict(method="attnres", block_size=2),
    "attnres_old_fp32": dict(method="attnres", block_size=3),
    "attnres_loader_bf16": dict(method="attnres", block_size=4),
    "denseformer_new_bf16": dict(method="denseformer", dilation=1, period=1),
    "denseformer_old_fp32": dict(method="denseformer", dilation=2, period=2),
    "denseformer_loader_bf16": dict(method="denseformer", dilation=1, period=2),
}


def test_every_fixture_has_an_expected_resolution():
    assert sorted(EXPECTED_RESOLUTION) == FOLDERS


@pytest.mark.parametrize("name", FOLDERS)
def test_switches_resolve_as_their_code_does(name):
    config, _ = fixture(name)
    assert resolve(config) == EXPECTED_RESOLUTION[name]


def test_switch_rules_fallbacks_and_conflicts():
    base = {"recurrent_model": True, "use_depth_attention": True}
    assert resolve({**base, "depth_softmax_stride": 5})["stride"] == 5  # old name as the fallback
    assert resolve({**base, "depth_softmax_stride": 5, "depth_attention_stride": 3})["stride"] == 3  # new wins
    assert resolve({**base, "depth_recent_window": 2})["window"] == 2
    assert resolve({"use_depth_attention": True})["method"] == "vanilla"  # no recurrent_model: off
    assert resolve({"recurrent_model": True, "cross_layer_mode": "depth_softmax"})["method"] == "vanilla"
    assert resolve({"recurrent_model": True, "cross_layer_pattern": "depth_attention"})["method"] == "depth_attention"
    assert resolve({**base, "baseline_mode": "mhc"})["method"] == "mhc"  # a baseline file ignores the DA switches
    assert resolve({"baseline_mode": "Block-AttnRes"})["method"] == "attnres"
    assert resolve({"baseline_mode": "none", "residual_baseline": "densetransformer"})["method"] == "denseformer"
    with pytest.raises(ValueError, match="conflicting"):
        resolve({"baseline_mode": "mhc", "residual_baseline": "attnres"})
    with pytest.raises(TypeError):  # a present but null stride is int(None) in their code too
        resolve({**base, "depth_attention_stride": None})
    for bad in ({"scale_embeds": True}, {"rope_scaling": {"type": "linear", "factor": 2.0}},
                {"pretraining_tp": 2}, {"attention_bias": True}, {**base, "cross_layer_pattern": "dense"}):
        with pytest.raises(NotImplementedError):
            resolve(bad)


def test_exp_sinkhorn_columns_exact_rows_approximate():
    """Rows then columns each round: columns sum to 1 at the end, rows only approximately. Ours (log domain,
    columns then rows) differs entry by entry; theirs is ours on the transposed logits, transposed back (up to the
    1e-12 clamps and float32 rounding): the same iteration with the roles of rows and columns swapped."""
    logits = torch.randn(64, 4, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 2.0
    m = sinkhorn_exp(logits, 20)
    cols, rows = (m.sum(-2) - 1).abs().max(), (m.sum(-1) - 1).abs().max()
    assert cols < 1e-12
    assert 1e-6 < rows < 0.5
    ours = sinkhorn(logits.float(), 20).double()
    assert (ours.sum(-1) - 1).abs().max() < 1e-5  # ours: rows exact
    assert (ours - m).abs().max() > 1e-3
    assert (sinkhorn(logits.transpose(-1, -2).float(), 20).double().transpose(-1, -2) - m).abs().max() < 1e-6


def test_norm_orders_differ_with_perturbed_gains():
    """Stride 1 (every earlier layer) with perturbed k_norm gains: k_norm after RoPE ≠ before RoPE."""
    config, state = fixture("da_nostride_fp32")
    x = ids(config["vocab_size"])
    sdpa, fa2 = authors_logits(config, state, x, "sdpa"), authors_logits(config, state, x, "fa2")
    assert max_abs(sdpa, fa2) > 1e-2


def test_norm_orders_agree_when_k_gains_are_pairwise_equal():
    """RMS is rotation-invariant: with k_norm gains equal on every pair (i, i + D/2) the two orders agree."""
    config, state = fixture("da_nostride_fp32")
    D = config["head_dim"]
    state = dict(state)
    for key in [k for k in state if k.endswith("k_norm.weight")]:
        g = state[key].clone()
        g[D // 2:] = g[:D // 2]
        state[key] = g
    x = ids(config["vocab_size"])
    assert max_abs(authors_logits(config, state, x, "sdpa"), authors_logits(config, state, x, "fa2")) < 1e-12


def test_off_config_is_vanilla():
    """use_depth_attention without recurrent_model: exactly vanilla Llama + qk-norm; with it, Depth-Attention."""
    config, state = fixture("da_off_bf16")
    x = ids(config["vocab_size"])
    off = authors_logits(config, state, x)
    assert torch.equal(off, authors_logits({**config, "use_depth_attention": False}, state, x))
    assert max_abs(off, authors_logits({**config, "recurrent_model": True}, state, x)) > 1e-3


def test_unused_lm_head_layernorm_is_ignored():
    config, state = fixture("vanilla_bf16")
    x = ids(config["vocab_size"])
    other = {**state, "lm_head_layernorm.weight": torch.zeros_like(state["lm_head_layernorm.weight"])}
    assert torch.equal(authors_logits(config, state, x), authors_logits(config, other, x))


# ----------------------------------------------------------------------------- hand mapping into DecoderLM
def our_config(config: dict, spec: dict) -> ModelConfig:
    """Our ModelConfig for their config (LlamaConfig defaults for the keys a Trainer-saved config leaves out)."""
    method = spec["method"]
    kw = dict(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"], num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=config["num_attention_heads"], num_key_value_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"], rope_theta=float(config.get("rope_theta", 10000.0)),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        cross_layer="none" if method == "vanilla" else method)
    if method == "depth_attention":
        kw.update(depth_attention_stride=spec["stride"], depth_attention_window=spec["window"])
    elif method == "mhc":
        kw.update(mhc_num_streams=spec["streams"], mhc_sinkhorn_iters=spec["iters"])
    elif method == "attnres":
        kw.update(attnres_block_size=spec["block_size"], attnres_recency_bias=3.0)
    elif method == "denseformer":
        kw.update(denseformer_dilation=spec["dilation"], denseformer_period=spec["period"])
    return ModelConfig(**kw)


def our_state(config: dict, state: dict, spec: dict) -> dict:
    """Their tensors under our names (float32): the mapping docs/methods.md records."""
    L = config["num_hidden_layers"]
    out = {k: v.float() for k, v in state.items()
           if k.startswith(("model.embed_tokens.", "model.norm.", "lm_head.weight")) or ".self_attn." in k
           or ".mlp." in k or "layernorm." in k}
    out.pop("lm_head_layernorm.weight")
    f = lambda k: state[k].float()  # noqa: E731
    if spec["method"] == "mhc":
        for i in range(L):
            for c, side in enumerate(("attn", "mlp")):
                p, q = f"model.layers.{i}.{side}_residual_connector.", f"model.layers.{i}.cross_layer.connectors.{c}."
                out[q + "norm.weight"] = f(p + "mhc_input_norm.weight")
                out[q + "phi.weight"] = f(p + "mhc_dynamic_projection.weight")
                out[q + "alpha"] = torch.stack([f(p + "alpha_pre"), f(p + "alpha_post"), f(p + "alpha_res")])
                out[q + "bias"] = torch.cat([f(p + "pre_logits"), f(p + "post_logits"),
                                             f(p + "residual_logits").flatten()])
        out["model.cross_layer.readout"] = f("model.residual_stream_projector.reduce_logits")
    elif spec["method"] == "attnres":
        groups = {f"model.layers.{i}.cross_layer.": [f"model.layers.{i}.attnres_{s}_aggregator." for s in
                                                     ("attn", "mlp")] for i in range(L)}
        groups["model.cross_layer."] = ["model.attnres_final_aggregator."]
        for ours, theirs in groups.items():
            out[ours + "query"] = torch.stack([f(p + "pseudo_query") for p in theirs])
            out[ours + "key_gain"] = torch.stack([f(p + "norm.weight") for p in theirs])
            out[ours + "recency_bias"] = torch.stack([f(p + "recency_bias") for p in theirs])
    elif spec["method"] == "denseformer":
        for i in range(L):
            alpha = f(f"model.densetransformer_dwa.alphas.{i}")
            if alpha.numel():
                out[f"model.layers.{i}.cross_layer.alpha"] = alpha
    return out


def hand_mapped(config: dict, state: dict) -> DecoderLM:
    spec = resolve(config)
    model = DecoderLM(our_config(config, spec))
    model.load_state_dict(our_state(config, state, spec), strict=True)
    return model.eval()


def sinkhorn_fixed_point(state: dict) -> dict:
    """alpha_res = 0 and residual_logits = 0: H_res is exactly 1/n in both Sinkhorn forms."""
    out = dict(state)
    for k in state:
        if k.endswith("alpha_res") or k.endswith("residual_logits"):
            out[k] = torch.zeros_like(state[k])
    return out


HAND_MAPPED = [n for n in FOLDERS if not n.startswith("mhc")]


@pytest.mark.parametrize("name", HAND_MAPPED)
def test_reference_matches_hand_mapped_model_in_our_norm_order(name):
    """Our DecoderLM (q/k norms before RoPE) equals the reference in their FlashAttention-2 order (≤ 1e-5)."""
    config, state = fixture(name)
    x = ids(config["vocab_size"])
    with torch.no_grad():
        ours = hand_mapped(config, state)(x).logits
    assert max_abs(ours, authors_logits(config, state, x, "fa2")) <= TOL


@pytest.mark.parametrize("name", [n for n in FOLDERS if n.startswith("mhc")])
def test_mhc_reference_matches_hand_mapped_model_at_a_sinkhorn_fixed_point(name):
    """mHC packing (alpha [3], bias [n²+2n], readout) checked where both Sinkhorn forms give H_res = 1/n."""
    config, state = fixture(name)
    state = sinkhorn_fixed_point(state)
    x = ids(config["vocab_size"])
    with torch.no_grad():
        ours = hand_mapped(config, state)(x).logits
    assert max_abs(ours, authors_logits(config, state, x, "fa2")) <= TOL


@pytest.mark.parametrize("name", [n for n in FOLDERS if n.startswith("mhc")])
def test_mhc_sinkhorn_form_matters_on_the_fixtures(name):
    """With the fixtures' own residual logits our log-domain form is measurably not theirs (so part (b) sees it)."""
    config, state = fixture(name)
    x = ids(config["vocab_size"])
    with torch.no_grad():
        ours = hand_mapped(config, state)(x).logits
    assert max_abs(ours, authors_logits(config, state, x, "fa2")) > 1e-3


# ----------------------------------------------------------------------------- (b) the importer
def imported_order(model) -> str:
    position = getattr(model.config, "qk_norm_position", "before_rope")
    return ORDER_OF_POSITION[position]


@pytest.mark.parametrize("name", FOLDERS)
def test_imported_model_equals_reference(name):
    """``load_model`` on one of their folders: float32 logits equal our float64 reference of their forward in the
    norm order the import chose (Depth-Attention and the Llama-file models: their SDPA order, the only one their
    Depth-Attention runs in), and cached greedy decoding equals full recompute."""
    from depthattn.checkpoint import load_model
    from depthattn.generate import generate, naive_generate

    config, state = fixture(name)
    spec = resolve(config)
    try:
        model = load_model(FIXTURES / name)
    except ValueError as e:  # a folder that resolves to vanilla may be refused, saying why, instead of loaded
        message = str(e).replace(str(FIXTURES / name), "<folder>")  # the folder's own name says "vanilla"
        assert spec["method"] == "vanilla" and ("recurrent_model" in message or "vanilla" in message), message
        return
    model = model.float().eval()
    if spec["method"] in ("depth_attention", "vanilla"):
        assert model.config.qk_norm_position == "k_after_rope"
    x = ids(config["vocab_size"])
    with torch.no_grad():
        logits = model(x).logits
    assert logits.dtype == torch.float32
    assert max_abs(logits, authors_logits(config, state, x, imported_order(model))) <= TOL
    cached = generate(model, x, max_new_tokens=8, temperature=0.0)
    assert torch.equal(cached, naive_generate(model, x, 8))
