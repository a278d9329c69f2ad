"""A model built on the meta device and materialised (``training.build``): tied stays tied (one Parameter) through
``to_empty``, initialisation, save and load; untied stays untied; the saver checks tensor identity."""

from __future__ import annotations

import pytest
import torch

from depthattn import DecoderLM, ModelConfig
from depthattn.checkpoint import load_model, load_state, save_model
from depthattn.training.build import build_on_meta, materialize


@pytest.mark.parametrize("tied", [True, False])
def test_meta_built_model_keeps_its_tying_through_save_and_load(tied, tmp_path):
    cfg = ModelConfig.from_preset("tiny", tie_word_embeddings=tied)
    model = build_on_meta(cfg)
    assert next(model.parameters()).is_meta
    torch.manual_seed(0)
    materialize(model, torch.device("cpu"))
    assert model.is_tied() is tied
    n_tensors = len(list(model.parameters()))
    assert n_tensors == len(list(DecoderLM(cfg).parameters()))  # one Parameter for the tied pair
    with torch.no_grad():  # train-like change of the head: with tying it must move the embedding too
        model.lm_head.weight.add_(0.5)
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight) is tied
    save_model(model, tmp_path / "ckpt")
    assert ("lm_head.weight" in load_state(tmp_path / "ckpt")) is not tied
    back = load_model(tmp_path / "ckpt")
    assert back.is_tied() is tied
    ids = torch.randint(0, cfg.vocab_size, (2, 9))
    torch.testing.assert_close(back(ids).logits, model.eval()(ids).logits, rtol=0, atol=0)


def test_materialize_draws_the_init_table():
    """Norm gains are ones, weights N(0, initializer_range²), RoPE tables recomputed (not to_empty garbage)."""
    cfg = ModelConfig.from_preset("tiny", num_hidden_layers=2)
    torch.manual_seed(0)
    model = materialize(build_on_meta(cfg), torch.device("cpu"))
    assert torch.equal(model.model.norm.weight, torch.ones(cfg.hidden_size))
    std = float(model.model.layers[0].mlp.up_proj.weight.detach().std())
    assert abs(std - cfg.initializer_range) < 0.1 * cfg.initializer_range
    torch.testing.assert_close(model.model.rotary_emb.inv_freq, DecoderLM(cfg).model.rotary_emb.inv_freq)


def test_saver_refuses_a_tied_config_whose_head_was_untied(tmp_path):
    model = DecoderLM(ModelConfig.from_preset("tiny", tie_word_embeddings=True), device="meta")
    model.to_empty(device="cpu")  # unties: every module gets its own new Parameter
    assert not model.is_tied()
    with pytest.raises(ValueError, match=r"^the model's config says tie_word_embeddings=true but lm_head.weight"):
        save_model(model, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()
