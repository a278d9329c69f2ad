"""``output_hidden_states``, ``output_attentions`` and ``output_depth_weights`` on ``DepthAttnForCausalLM``, made as on
``Qwen3ForCausalLM``: with ``cross_layer="none"`` the numbers are Qwen3's (eager attention); every method and a looped
model keep the contract (counts, shapes, the explicit-softmax forward equal to SDPA with padding and a cache, each
intermediate hidden state equal to the final one of the model stopped there); the depth weights are what
``depthattn analyze`` reads; ``generate`` (greedy and prompt-lookup assisted) returns them per step."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from depthattn import ModelConfig  # noqa: E402
from depthattn.analyze import check_depth_attention, each_depth_weights  # noqa: E402
from depthattn.cross_layer import get as method_record, loopable, names  # noqa: E402
from depthattn.hf import DepthAttnConfig, DepthAttnForCausalLM  # noqa: E402
from depthattn.hf.convert import model_config_to_qwen3  # noqa: E402

V, L = 99, 3
#: (method, extra fields): every registered method, and every loopable one looped twice.
CASES = [(m, {}) for m in names()] + [(m, {"num_loops": 2}) for m in loopable() if m != "none"]
IDS = [m + ("-loops2" if kw else "") for m, kw in CASES]


def tiny_config(method="none", **kw) -> ModelConfig:
    values = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=L, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=64, cross_layer=method,
                  depth_attention_stride=1, attnres_block_size=1)
    values.update(kw)
    return ModelConfig(**values)


def ours(method="none", **kw) -> DepthAttnForCausalLM:
    """Our model, its method parameters moved off their vanilla init so that the method matters."""
    torch.manual_seed(0)
    model = DepthAttnForCausalLM(DepthAttnConfig.from_model_config(tiny_config(method, **kw))).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "cross_layer" in name:
                p.add_(0.05 * torch.randn_like(p))
    return model


def qwen3(model: DepthAttnForCausalLM):
    """``Qwen3ForCausalLM`` (eager attention: SDPA returns no weights) with ``model``'s weights."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    q = Qwen3ForCausalLM(Qwen3Config(**model_config_to_qwen3(model.model.config))).eval()
    missing, unexpected = q.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    q.set_attn_implementation("eager")
    return q


def batch(B=2, T=6):
    g = torch.Generator().manual_seed(1)
    return torch.randint(1, V, (B, T), generator=g)


def left_padded():
    """ids ``[2, 6]`` whose second row has two pads on the left, its mask, and the positions both models get."""
    ids = batch()
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def close(a, b, atol=1e-5):
    torch.testing.assert_close(a, b, atol=atol, rtol=0)


def all_close(xs, ys, atol=1e-5):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        close(x, y, atol)


# -------------------------------------------------------------------------------- cross_layer="none" is Qwen3
def test_none_gives_qwen3s_hidden_states_and_attentions_with_padding_and_a_cache():
    m = ours()
    q = qwen3(m)
    ids, mask, pos = left_padded()
    calls = [dict(), dict(attention_mask=mask, position_ids=pos)]
    for kw in calls:
        a = m(ids, output_hidden_states=True, output_attentions=True, **kw)
        b = q(ids, output_hidden_states=True, output_attentions=True, **kw)
        assert len(a.hidden_states) == L + 1 and len(a.attentions) == L
        all_close(a.hidden_states, b.hidden_states)
        real = slice(None) if not kw else (Ellipsis, slice(2, None), slice(None))  # Qwen3's pad rows are its own
        all_close([x[1][real] for x in a.attentions], [x[1][real] for x in b.attentions])
        all_close([x[0] for x in a.attentions], [x[0] for x in b.attentions])
        close(a.logits, b.logits)
    # a cache: a prompt, then one token and two tokens (S = past + T)
    a_out = m(ids[:, :4], attention_mask=mask[:, :4], position_ids=pos[:, :4], use_cache=True)
    b_out = q(ids[:, :4], attention_mask=mask[:, :4], position_ids=pos[:, :4], use_cache=True)
    for lo, hi in ((4, 5), (5, 6)):
        a_out = m(ids[:, lo:hi], attention_mask=mask[:, :hi], position_ids=pos[:, lo:hi], cache=a_out.cache,
                  output_hidden_states=True, output_attentions=True)
        b_out = q(ids[:, lo:hi], attention_mask=mask[:, :hi], position_ids=pos[:, lo:hi], cache=b_out.cache,
                  output_hidden_states=True, output_attentions=True)
        assert [x.shape for x in a_out.attentions] == [(2, 4, hi - lo, hi)] * L
        all_close(a_out.attentions, b_out.attentions)
        all_close(a_out.hidden_states, b_out.hidden_states)


def test_none_takes_the_flags_from_the_config_selects_hidden_states_and_returns_qwen3s_tuple():
    m = ours()
    q = qwen3(m)
    ids = batch()
    for model in (m, q):
        model.config.output_hidden_states = True
    a, b = m(ids), q(ids)
    all_close(a.hidden_states, b.hidden_states)
    assert a.attentions is None and b.attentions is None
    for model in (m, q):
        model.config.output_hidden_states = False
    a, b = m(ids, output_hidden_states=[0, -1]), q(ids, output_hidden_states=[0, -1])
    assert [h is None for h in a.hidden_states] == [h is None for h in b.hidden_states] == [False, True, True, False]
    all_close([a.hidden_states[i] for i in (0, -1)], [b.hidden_states[i] for i in (0, -1)])
    a = m(ids, output_hidden_states=True, output_attentions=True, return_dict=False)
    b = q(ids, output_hidden_states=True, output_attentions=True, return_dict=False)
    assert [type(x) for x in a] == [type(x) for x in b[:1]] + [type(a[1])] + [tuple, tuple]
    assert len(a) == len(b) == 4
    close(a[0], b[0])
    all_close(a[2], b[2])
    all_close(a[3], b[3])


# -------------------------------------------------------------------------------- every method, a looped model
@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_hidden_states_are_the_embedding_each_layers_readout_and_the_final_norm(method, kw):
    m = ours(method, **kw)
    ids = batch()
    out = m(ids, output_hidden_states=True)
    Lv = m.model.config.num_virtual_layers
    assert len(out.hidden_states) == Lv + 1 and all(h.shape == (2, 6, 32) for h in out.hidden_states)
    close(out.hidden_states[0], m.model.embed_tokens(ids), atol=0)
    close(m.lm_head(out.hidden_states[-1]), out.logits, atol=0)
    close(out.logits, m(ids).logits, atol=0)  # recording hidden states changes nothing
    if kw:
        return
    # after layer u: the hidden state whose final norm the model stopped after layer u would output (logit lens)
    state = m.state_dict()
    for u in range(L - 1):
        short = DepthAttnForCausalLM(DepthAttnConfig.from_model_config(tiny_config(method, num_hidden_layers=u + 1)))
        missing, _ = short.load_state_dict(state, strict=False)
        assert all("rotary" in k for k in missing), missing
        with torch.no_grad():
            short.model.rotary_emb.reset_parameters()
        close(m.model.norm(out.hidden_states[u + 1]), short.eval()(ids, output_hidden_states=True).hidden_states[-1])


@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_attentions_are_probabilities_and_the_eager_forward_equals_sdpa_with_padding_and_a_cache(method, kw):
    m = ours(method, **kw)
    Lv = m.model.config.num_virtual_layers
    ids, mask, _ = left_padded()
    sdpa = m(ids, attention_mask=mask).logits
    out = m(ids, attention_mask=mask, output_attentions=True)
    close(out.logits, sdpa)
    assert len(out.attentions) == Lv and all(a.shape == (2, 4, 6, 6) for a in out.attentions)
    for a in out.attentions:
        close(a.sum(-1), torch.ones(2, 4, 6))
        assert a[0].triu(1).abs().max() == 0 and a[1, :, 2:].triu(3).abs().max() == 0  # causal (pad rows: uniform)
        assert a[1, :, 2:, :2].abs().max() == 0  # real queries never read the pads
    # a cache: prefill 4, then 1 token, then 1 more; eager and SDPA decode the same logits
    caches = {}
    for eager in (False, True):
        step = m(ids[:, :4], attention_mask=mask[:, :4], use_cache=True, output_attentions=eager)
        logits, cache = [step.logits], step.cache
        for hi in (5, 6):
            step = m(ids[:, hi - 1:hi], attention_mask=mask[:, :hi], cache=cache, output_attentions=eager)
            logits.append(step.logits)
            if eager:
                assert [a.shape for a in step.attentions] == [(2, 4, 1, hi)] * Lv
                assert all(a[1, :, :, :2].abs().max() == 0 for a in step.attentions)
        caches[eager] = torch.cat(logits, 1)
    close(caches[True], caches[False])
    real = mask.bool()  # a pad's logits average over whatever slots its call has
    close(caches[False][real], sdpa[real])


@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_depth_weights_are_the_ones_analyze_reads_and_none_for_methods_without_them(method, kw):
    m = ours(method, **kw)
    ids, mask, _ = left_padded()
    out = m(ids, attention_mask=mask, output_depth_weights=True)
    close(out.logits, m(ids, attention_mask=mask).logits, atol=0)
    if not method_record(method).has_depth_weights:
        assert out.depth_weights is None
        with pytest.raises(ValueError, match="depth-attention weights need cross_layer='depth_attention'"):
            check_depth_attention(m)
        return
    plan = m.model.plan
    assert len(out.depth_weights) == len(plan)
    seen = {}
    each_depth_weights(m, ids, mask, lambda u, w: seen.__setitem__(u, w))  # analyze's per-token weights
    for u, (w, cands) in enumerate(zip(out.depth_weights, plan)):
        if not cands:
            assert w is None
            continue
        assert w.shape == (2, 2, 6, len(cands) + 1) and w.dtype == torch.float32
        close(w.sum(-1), torch.ones(2, 2, 6))
        close(w.permute(0, 2, 1, 3)[mask.bool()], seen[u], atol=0)
    m.config.output_depth_weights = True  # or from the config
    assert all((a is None and b is None) or torch.equal(a, b)
               for a, b in zip(m(ids, attention_mask=mask).depth_weights, out.depth_weights))


def test_unknown_record_key_is_one_line():
    m = ours()
    with pytest.raises(ValueError, match=r"record: unknown key\(s\) \['hidden'\]"):
        m.model(batch(), record={"hidden": []})


# -------------------------------------------------------------------------------- generate
def generate(model, ids, **kw):
    return model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0, output_attentions=True,
                          output_hidden_states=True, return_dict_in_generate=True, **kw)


def test_generate_returns_qwen3s_attentions_and_hidden_states_greedy_and_assisted():
    m = ours()
    q = qwen3(m)
    for ids, kw in ((batch(), {}), (batch(B=1), {"prompt_lookup_num_tokens": 2})):
        a, b = generate(m, ids, **kw), generate(q, ids, **kw)
        assert torch.equal(a.sequences, b.sequences)
        assert len(a.attentions) == len(b.attentions) == len(a.hidden_states) == 3
        for x, y in zip(a.attentions, b.attentions):
            all_close(x, y)
        for x, y in zip(a.hidden_states, b.hidden_states):
            all_close(x, y)


@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_generate_with_outputs_every_method_greedy_and_assisted(method, kw):
    m = ours(method, **kw)
    Lv = m.model.config.num_virtual_layers
    plain = m.generate(batch(B=1), max_new_tokens=3, do_sample=False, pad_token_id=0)
    for extra in ({}, {"prompt_lookup_num_tokens": 2}):
        out = generate(m, batch(B=1), **extra)
        assert torch.equal(out.sequences, plain)
        assert [[a.shape for a in step] for step in out.attentions] == [
            [(1, 4, T, S)] * Lv for T, S in ((6, 6), (1, 7), (1, 8))]
        assert [[h.shape for h in step] for step in out.hidden_states] == [
            [(1, T, 32)] * (Lv + 1) for T in (6, 1, 1)]


def test_packed_documents_attentions_stay_in_their_document():
    m = ours("depth_attention")
    ids = batch(B=1)
    docs = torch.tensor([[0, 0, 0, 1, 1, 1]])
    out = m(ids, document_ids=docs, output_attentions=True, output_depth_weights=True)
    close(out.logits, m(ids, document_ids=docs).logits)
    for a in out.attentions:
        assert a[..., 3:, :3].abs().max() == 0 and a[..., :3, 3:].abs().max() == 0


# -------------------------------------------------------------------------------- the headless model
@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_headless_model_gives_the_causal_lms_hidden_states_and_attentions(tmp_path, method, kw):
    """``DepthAttnModel`` (``AutoModel``) loaded from the causal LM's folder returns the same recorded outputs,
    also from ``inputs_embeds``."""
    from depthattn.hf import DepthAttnModel

    model = ours(method, **kw)
    model.save_pretrained(tmp_path)
    base = DepthAttnModel.from_pretrained(tmp_path).eval()
    ids, mask, _ = left_padded()
    with torch.no_grad():
        want = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True, use_cache=False)
        got = base(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True, use_cache=False)
        embeds = base(inputs_embeds=model.model.embed_tokens(ids), attention_mask=mask, output_hidden_states=True,
                      use_cache=False)
    assert len(got.hidden_states) == model.config.to_model_config().num_virtual_layers + 1
    all_close(got.hidden_states, want.hidden_states, atol=0)
    all_close(got.attentions, want.attentions, atol=0)
    all_close(embeds.hidden_states, want.hidden_states, atol=1e-6)
    close(got.last_hidden_state, want.hidden_states[-1], atol=0)
