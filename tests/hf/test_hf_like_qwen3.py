"""The calls a transformers user makes on ``Qwen3ForCausalLM``, made on ``DepthAttnForCausalLM``: a compiled
forward's decode, ``resize_token_embeddings``, foreign ``config.json`` keys, ``return_dict=False`` and
``shift_labels``. With ``cross_layer="none"`` both agree numerically; every other method keeps the same contract."""

import json
import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from depthattn import ModelConfig  # noqa: E402
from depthattn.checkpoint import load_config, load_model  # noqa: E402
from depthattn.hf import DepthAttnConfig, DepthAttnForCausalLM  # noqa: E402
from depthattn.hf.convert import model_config_to_qwen3  # noqa: E402

V = 99
#: (method, extra fields): the methods with parameters of their own, Depth-Attention, and a looped model.
CASES = [("none", {}), ("depth_attention", {}), ("mhc", {}), ("attnres", {"attnres_block_size": 1}),
         ("depth_attention", {"num_loops": 2})]
IDS = [f"{m}{'-loops' + str(kw['num_loops']) if 'num_loops' in kw else ''}" for m, kw in CASES]


def tiny_config(method="none", **kw) -> ModelConfig:
    return ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, max_position_embeddings=64, cross_layer=method, **kw)


def pair(method="none", **kw):
    """Our model and, for an unlooped ``cross_layer="none"`` model, ``Qwen3ForCausalLM`` with the same weights
    (else None). Method parameters are moved off their vanilla init so that the method matters."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = tiny_config(method, **kw)
    torch.manual_seed(0)
    ours = DepthAttnForCausalLM(DepthAttnConfig.from_model_config(cfg)).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if "cross_layer" in name:
                p.add_(0.05 * torch.randn_like(p))
    if method != "none" or cfg.num_loops != 1:
        return ours, None
    q = Qwen3ForCausalLM(Qwen3Config(**model_config_to_qwen3(cfg))).eval()
    missing, unexpected = q.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return ours, q


def batch(B=2, T=6, high=V):
    g = torch.Generator().manual_seed(1)
    return torch.randint(1, high, (B, T), generator=g)


# -------------------------------------------------------------------------------- torch.compile(model.forward)
def compiled_forward(model) -> list:
    """``model.forward = torch.compile(model.forward)`` with an eager backend that records the graphs it got (the
    bug is in tracing, not in inductor); dynamo's caches are reset, so no earlier test's graphs or limits count."""
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model.forward = torch.compile(model.forward, backend=backend)
    return graphs


def greedy(model, ids):
    return model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0, output_scores=True,
                          return_dict_in_generate=True)


@pytest.mark.compile
@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_compiled_forward_decodes_the_eager_tokens_and_logits(method, kw):
    ours, q = pair(method, **kw)
    ids = batch()
    eager = greedy(ours, ids)
    graphs = compiled_forward(ours)
    compiled = greedy(ours, ids)
    assert graphs, "nothing was compiled"
    assert torch.equal(compiled.sequences, eager.sequences)
    for a, b in zip(compiled.scores, eager.scores, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    if q is not None:  # Qwen3 under the same call: the same tokens
        assert torch.equal(greedy(q, ids).sequences, eager.sequences)
        compiled_forward(q)
        assert torch.equal(greedy(q, ids).sequences, eager.sequences)
    torch._dynamo.reset()


# -------------------------------------------------------------------------------- resize_token_embeddings
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("n", [V + 8, V - 9], ids=["grow", "shrink"])
@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_resize_token_embeddings_then_forward_train_and_save(tmp_path, method, kw, n, tie):
    ours, q = pair(method, tie_word_embeddings=tie, **kw)
    models = [ours] + ([q] if q is not None else [])
    for m in models:
        torch.manual_seed(7)  # the new rows are drawn (mean resizing): the same draw for both
        m.resize_token_embeddings(n)
    assert ours.config.vocab_size == ours.model.config.vocab_size == n
    assert ours.lm_head.weight.shape == ours.model.embed_tokens.weight.shape == (n, 32)
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == tie
    ids = batch(high=n)
    ids[:, 2] = n - 1  # the last id of the new vocabulary
    logits = ours(ids).logits
    assert logits.shape == (2, 6, n)
    if q is not None:
        torch.testing.assert_close(logits, q(ids).logits, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=rf"token id {n} outside the vocabulary \[0, {n}\)"):
        ours(torch.full((1, 2), n))
    # one training step: the loss (equal to Qwen3's) falls, and the new rows get gradients
    losses = []
    for m in models:
        m.train()
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        before = m(ids, labels=ids).loss
        before.backward()
        assert m.get_input_embeddings().weight.grad[n - 1].abs().sum() > 0
        opt.step()
        losses.append(before.item())
        with torch.no_grad():
            assert m(ids, labels=ids).loss < before
        m.eval()
    if q is not None:
        assert losses[0] == pytest.approx(losses[1], abs=1e-5)
    ours.save_pretrained(tmp_path / "ck")
    back = DepthAttnForCausalLM.from_pretrained(tmp_path / "ck").eval()
    assert back.config.vocab_size == back.model.config.vocab_size == n
    assert (back.lm_head.weight is back.model.embed_tokens.weight) == tie
    torch.testing.assert_close(back(ids).logits, ours(ids).logits, atol=0, rtol=0)
    assert load_config(tmp_path / "ck").vocab_size == n
    torch.testing.assert_close(load_model(tmp_path / "ck")(ids).logits, ours(ids).logits, atol=0, rtol=0)


# -------------------------------------------------------------------------------- foreign config.json keys
FOREIGN = {"output_hidden_states": False, "problem_type": None, "my_own_attribute": {"a": [1, 2]},
           "hidden_act": "silu", "attention_bias": False}


def add_keys(folder, values):
    file = folder / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **values}))


@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_foreign_config_keys_are_kept_and_model_fields_stay_strict(tmp_path, method, kw):
    from transformers import AutoConfig, AutoModelForCausalLM

    ours, q = pair(method, **kw)
    ids = batch()
    for name, m in [("ours", ours)] + ([("q3", q)] if q is not None else []):
        m.save_pretrained(tmp_path / name)
        add_keys(tmp_path / name, FOREIGN)
        back = AutoModelForCausalLM.from_pretrained(tmp_path / name).eval()
        assert back.config.my_own_attribute == {"a": [1, 2]} and back.config.output_hidden_states is False
        torch.testing.assert_close(back(ids).logits, ours(ids).logits, atol=1e-5, rtol=0)
        back.save_pretrained(tmp_path / f"{name}-again")  # and they survive another save
        assert json.loads((tmp_path / f"{name}-again" / "config.json").read_text())["my_own_attribute"] == {
            "a": [1, 2]}
        quantized = {**json.loads((tmp_path / name / "config.json").read_text()),
                     "quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}}
        (tmp_path / f"{name}-q").mkdir()
        (tmp_path / f"{name}-q" / "config.json").write_text(json.dumps(quantized))
        assert AutoConfig.from_pretrained(tmp_path / f"{name}-q").quantization_config["load_in_8bit"] is True
    # the native readers read the fields and leave the rest
    assert load_config(tmp_path / "ours") == ours.model.config
    torch.testing.assert_close(load_model(tmp_path / "ours")(ids).logits, ours(ids).logits, atol=0, rtol=0)
    # a bad value of a field, a misspelt field and a fixed Qwen3 key with another value: one line naming it
    for values, pattern in [({"hidden_size": 0}, "hidden_size=0"),
                            ({"cross_layers": "mhc"}, "'cross_layers' looks like a misspelt ModelConfig field "
                                                      "'cross_layer'"),
                            ({"hidden_act": "gelu"}, "hidden_act='gelu'")]:
        bad = tmp_path / f"bad-{next(iter(values))}"
        ours.save_pretrained(bad)
        add_keys(bad, values)
        with pytest.raises(ValueError, match=pattern):
            AutoModelForCausalLM.from_pretrained(bad)
        with pytest.raises(ValueError, match=pattern):
            AutoConfig.from_pretrained(bad)
        if "hidden_act" not in values:  # the native reader reads ModelConfig fields (and their look-alikes) only
            with pytest.raises(ValueError, match=pattern):
                load_config(bad)


def test_no_transformers_config_key_looks_like_a_misspelt_field():
    """The misspelling guard leaves every key that transformers' own configs write alone."""
    from transformers import GPT2Config, LlamaConfig, PreTrainedConfig, Qwen3Config

    keys = set()
    for cls in (PreTrainedConfig, Qwen3Config, LlamaConfig, GPT2Config):
        keys |= set(cls().to_dict()) | set(vars(cls()))
    ModelConfig.check_extra_keys(keys | {"quantization_config", "tokenizer_class", "num_labels"}, "test")
    with pytest.raises(ValueError, match="'num_hidden_layer' looks like a misspelt ModelConfig field"):
        ModelConfig.check_extra_keys({"num_hidden_layer"}, "test")


# -------------------------------------------------------------------------------- return_dict=False
@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_return_dict_false_returns_a_tuple_loss_first(method, kw):
    ours, q = pair(method, **kw)
    ids = batch()
    ref = ours(ids, labels=ids)
    for m in [ours] + ([q] if q is not None else []):
        out = m(ids, labels=ids, return_dict=False)
        assert isinstance(out, tuple) and len(out) == 3  # loss, logits, cache
        torch.testing.assert_close(out[0], ref.loss, atol=1e-5, rtol=0)
        torch.testing.assert_close(out[1], ref.logits, atol=1e-5, rtol=0)
        no_labels = m(ids, return_dict=False, use_cache=False)
        assert len(no_labels) == 1
        torch.testing.assert_close(no_labels[0], ref.logits, atol=1e-5, rtol=0)
    # config.return_dict=False too (transformers' own contract; Qwen3ForCausalLM 5.24 then fails in its forward)
    ours.config.return_dict = False
    assert isinstance(ours(ids), tuple) and not isinstance(ours(ids, return_dict=True), tuple)


# -------------------------------------------------------------------------------- shift_labels
@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_shift_labels_are_the_targets_as_given(method, kw):
    ours, q = pair(method, **kw)
    ids = batch()
    g = torch.Generator().manual_seed(4)
    shift = torch.randint(0, V, ids.shape, generator=g)
    shift[0, 2], shift[1, -1] = -100, -100
    logits = ours(ids).logits
    expected = F.cross_entropy(logits.flatten(0, 1), shift.flatten(), ignore_index=-100)
    loss = ours(ids, labels=ids, shift_labels=shift).loss
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=0)
    n_items = torch.tensor(17)
    summed = ours(ids, labels=ids, shift_labels=shift, num_items_in_batch=n_items).loss
    torch.testing.assert_close(summed, expected * 10 / 17, atol=1e-6, rtol=0)  # 10 targets of 12
    # labels shifted by hand are the labels' own loss
    by_hand = F.pad(ids[:, 1:], (0, 1), value=-100)
    torch.testing.assert_close(ours(ids, labels=ids, shift_labels=by_hand).loss, ours(ids, labels=ids).loss,
                               atol=1e-6, rtol=0)
    # padded positions score nothing, as with labels
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    masked = shift.clone()
    masked[0, :2] = -100
    torch.testing.assert_close(ours(ids, attention_mask=mask, labels=ids, shift_labels=shift).loss,
                               ours(ids, attention_mask=mask, labels=ids, shift_labels=masked).loss, atol=0, rtol=0)
    if q is not None:
        torch.testing.assert_close(loss, q(ids, labels=ids, shift_labels=shift).loss, atol=1e-6, rtol=0)
        torch.testing.assert_close(summed, q(ids, labels=ids, shift_labels=shift, num_items_in_batch=n_items).loss,
                                   atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="labels"):
        ours(ids, labels=ids, shift_labels=torch.full_like(ids, V))
