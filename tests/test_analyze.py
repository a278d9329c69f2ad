"""Depth-Attention weight analysis: hook-captured weights equal an explicit recomputation; CLI writes JSON + PNG."""

import json

import pytest
import torch

from depthattn import DecoderLM, ModelConfig
from depthattn.analyze import depth_weight_means
from depthattn.checkpoint import save_model
from depthattn.functional import depth_weights, rope_cos_sin


def test_weights_match_explicit_layer_walk():
    torch.manual_seed(0)
    m = DecoderLM(ModelConfig.from_preset("tiny", cross_layer="depth_attention", num_hidden_layers=5)).eval()
    ids = torch.randint(0, 512, (2, 7))
    res = depth_weight_means(m, ids)
    # explicit twin: run the layers by hand, keeping every layer's K̂/Ṽ, and average depth_weights
    with torch.no_grad():
        h = m.model.embed_tokens(ids)
        cos, sin = rope_cos_sin(torch.arange(7).expand(2, 7), m.inv_freq, h.dtype)
        kv = {}
        for u, cands in enumerate(m.plan):
            layer = m.model.layers[u]
            x = layer.input_layernorm(h)
            q, k, _ = layer.self_attn.project(x, cos, sin)
            w = depth_weights(q, [kv[j][0] for j in cands] + [k]).mean(dim=(0, 1, 2))
            row = res["layers"][u]
            assert row["candidates"] == list(cands) + [u]
            torch.testing.assert_close(torch.tensor(row["weights"], dtype=torch.float32), w, atol=1e-6, rtol=0)
            assert sum(row["weights"]) == pytest.approx(1.0)
            h, kv[u] = layer(h, tuple(kv[j] for j in cands), cos, sin, None)
    assert res["layers"][0]["weights"] == [1.0] and len(res["layers"][4]["candidates"]) > 1


def test_cli_writes_json_and_png(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from depthattn.cli import main

    torch.manual_seed(0)
    save_model(DecoderLM(ModelConfig.from_preset("tiny", cross_layer="depth_attention")), tmp_path / "ck")
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1, "cat": 2, "sat": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "ck" / "tokenizer.json"))
    assert main(["analyze", str(tmp_path / "ck"), "--prompt", "the cat sat the cat", "--out", str(tmp_path / "a")]) == 0
    data = json.loads((tmp_path / "a" / "depth_weights.json").read_text())
    assert data["num_tokens"] == 5 and len(data["layers"]) == 4
    assert (tmp_path / "a" / "depth_weights.png").read_bytes()[:4] == b"\x89PNG"
    save_model(DecoderLM(ModelConfig.from_preset("tiny")), tmp_path / "plain")
    assert main(["analyze", str(tmp_path / "plain"), "--prompt", "x", "--tokenizer",
                 str(tmp_path / "ck" / "tokenizer.json"), "--out", str(tmp_path / "b")]) == 2
