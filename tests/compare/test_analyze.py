"""Depth-Attention weight analysis: hook-captured weights equal an explicit recomputation; CLI writes JSON + PNG."""

import json

import pytest
import torch

from depthattn import DecoderLM, ModelConfig
from depthattn.analyze import depth_weight_means
from depthattn.attention import LayerContext
from depthattn.checkpoint import save_model
from depthattn.cross_layer.depth_attention import depth_weights
from depthattn.functional import rope_cos_sin


def test_weights_match_explicit_layer_walk():
    torch.manual_seed(0)
    m = DecoderLM(ModelConfig.from_preset("tiny", cross_layer="depth_attention", num_hidden_layers=5)).eval()
    ids = torch.randint(0, 512, (2, 7))
    res = depth_weight_means(m, ids)
    # explicit twin: run the layers by hand, keeping every layer's K̂/Ṽ, and average depth_weights
    with torch.no_grad():
        h = m.model.embed_tokens(ids)
        cos, sin = rope_cos_sin(torch.arange(7).expand(2, 7), m.model.rotary_emb.inv_freq, h.dtype)
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
            h, kv[u] = layer(h, tuple(kv[j] for j in cands), ctx=LayerContext(cos, sin, None), layer_idx=u)
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


def _word_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1, "cat": 2, "sat": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))


def test_cli_accepts_a_run_folder(tmp_path, capsys):
    """As eval/generate: a run folder means its newest checkpoint (and that checkpoint's tokenizer)."""
    from depthattn.cli import main

    torch.manual_seed(0)
    for step, layers in ((10, 3), (20, 5)):
        ck = tmp_path / "run" / "checkpoints" / f"step_{step:08d}"
        save_model(DecoderLM(ModelConfig.from_preset("tiny", cross_layer="depth_attention",
                                                     num_hidden_layers=layers)), ck)
        _word_tokenizer(ck / "tokenizer.json")
    assert main(["analyze", str(tmp_path / "run"), "--prompt", "the cat sat", "--out", str(tmp_path / "a")]) == 0
    data = json.loads((tmp_path / "a" / "depth_weights.json").read_text())
    assert len(data["layers"]) == 5 and data["num_tokens"] == 3
    assert "step_00000020" in capsys.readouterr().out


@pytest.mark.parametrize("layers", [1, 4, 24])
def test_heatmap_title_and_labels_fit_in_the_figure(layers):
    from depthattn.analyze import heatmap_figure

    torch.manual_seed(0)
    m = DecoderLM(ModelConfig.from_preset("tiny", cross_layer="depth_attention", num_hidden_layers=layers)).eval()
    fig = heatmap_figure(depth_weight_means(m, torch.randint(0, 512, (1, 5))))
    try:
        renderer = fig.canvas.get_renderer()
        fig.draw(renderer)
        box = fig.bbox
        texts = [t for t in fig.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "get_window_extent"))
                 if t.get_visible() and t.get_text()]
        assert any("Depth-Attention weights" in t.get_text() for t in texts)
        for t in texts:
            e = t.get_window_extent(renderer)
            assert box.x0 <= e.x0 and e.x1 <= box.x1 and box.y0 <= e.y0 and e.y1 <= box.y1, t.get_text()
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


@pytest.mark.parametrize("argv", [["analyze", "--help"], ["data", "fetch-eval", "--help"]])
def test_help_is_plain_text(argv, capsys):
    from depthattn.cli import main

    with pytest.raises(SystemExit):
        main(argv)
    out = capsys.readouterr().out
    assert "``" not in out and len(out.splitlines()) > 5
