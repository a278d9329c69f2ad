"""More calls a transformers user makes on ``Qwen3ForCausalLM``, made on ``DepthAttnForCausalLM`` for every
cross-layer method and a looped model: ``torch.export``, ``inputs_embeds`` (forward and ``generate``), gradient
checkpointing (``gradient_checkpointing_enable`` and the ``Trainer``'s flag), ``cache_implementation="static"``,
``attn_implementation`` and the headless ``AutoModel`` (``DepthAttnModel``). With ``cross_layer="none"`` the same
call on Qwen3 gives the same numbers."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from depthattn.cross_layer import names  # noqa: E402
from depthattn.hf import DepthAttnConfig, DepthAttnForCausalLM, DepthAttnModel  # noqa: E402
from test_hf_like_qwen3 import V, batch, pair, tiny_config  # noqa: E402

#: every registered method, and a looped Depth-Attention model
CASES = [(m, {}) for m in names()] + [("depth_attention", {"num_loops": 2})]
IDS = [m for m in names()] + ["depth_attention-loops2"]


def padded_batch():
    """Two rows, the first left-padded by two tokens, and its 0/1 mask."""
    ids = batch()
    mask = torch.ones_like(ids)
    ids[0, :2], mask[0, :2] = 0, 0
    return ids, mask


# -------------------------------------------------------------------------------- torch.export
@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_exported_program_equals_eager_logits(method, kw):
    few_iters = {"mhc_sinkhorn_iters": 4} if method == "mhc" else {}  # export unrolls each Sinkhorn iteration
    ours, _ = pair(method, **kw, **few_iters)
    ids = batch(B=1, T=5)
    program = torch.export.export(ours, (ids,), kwargs={"use_cache": False})
    exported = program.module()(ids, use_cache=False).logits
    torch.testing.assert_close(exported, ours(ids, use_cache=False).logits, atol=1e-5, rtol=0)
    # the value checks skipped while exporting still run eagerly
    with pytest.raises(ValueError, match=r"token id 500 outside the vocabulary"):
        ours(torch.full((1, 5), 500), use_cache=False)


# -------------------------------------------------------------------------------- inputs_embeds
def new_tokens_from_embeds(model, embeds, mask):
    return model.generate(inputs_embeds=embeds, attention_mask=mask, max_new_tokens=4, do_sample=False,
                          pad_token_id=0)


@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_inputs_embeds_forward_and_generate(method, kw):
    ours, q = pair(method, **kw)
    ids, mask = padded_batch()
    embeds = ours.get_input_embeddings()(ids)
    torch.testing.assert_close(ours(inputs_embeds=embeds, attention_mask=mask).logits,
                               ours(ids, attention_mask=mask).logits, atol=0, rtol=0)
    new = new_tokens_from_embeds(ours, embeds, mask)
    from_ids = ours.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert new.shape == (2, 4)  # as transformers does: only the new tokens when given inputs_embeds only
    assert torch.equal(new, from_ids[:, ids.shape[1]:])
    if q is not None:
        assert torch.equal(new_tokens_from_embeds(q, embeds, mask), new)
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        ours(ids, inputs_embeds=embeds)
    with pytest.raises(ValueError, match=r"inputs_embeds must be a floating tensor \[B, T, hidden_size=32\]"):
        ours(inputs_embeds=embeds[..., :16])


# -------------------------------------------------------------------------------- gradient checkpointing
def layer_calls(model) -> list:
    """Record every call of a decoder layer (a recomputation in the backward pass is a second call; a pre-hook,
    since a recomputation stops as soon as it has the tensors the backward needs)."""
    calls = []
    for layer in model.model.layers:
        layer.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def grads(model, ids, mask):
    """Parameter gradients of the loss; labels are -100 at padding and at each row's first real token (whose
    predecessor is padding), so that Qwen3 and the core score the same targets."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, 1:] = labels[:, 1:].masked_fill(mask[:, :-1] == 0, -100)
    model.zero_grad()
    model(ids, attention_mask=mask, labels=labels).loss.backward()
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_gradient_checkpointing_gives_the_plain_gradients(method, kw):
    ours, q = pair(method, **kw)
    ids, mask = padded_batch()
    for model in [ours] + ([q] if q is not None else []):
        model.train()
        calls = layer_calls(model)
        plain = grads(model, ids, mask)
        n_plain = len(calls)
        model.gradient_checkpointing_enable()
        assert model.is_activation_checkpointing
        calls.clear()
        checkpointed = grads(model, ids, mask)
        if model is ours:  # each layer ran again in the backward pass
            assert len(calls) == 2 * n_plain
        assert checkpointed.keys() == plain.keys()
        for k in plain:
            torch.testing.assert_close(checkpointed[k], plain[k], atol=1e-6, rtol=0)
        model.gradient_checkpointing_disable()
        assert not model.is_activation_checkpointing
        calls.clear()
        grads(model, ids, mask)
        assert len(calls) == n_plain
    if q is not None:
        for k, g in grads(ours, ids, mask).items():
            torch.testing.assert_close(g, grads(q, ids, mask)[k], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="every_n_layers=2 is not supported"):
        ours.gradient_checkpointing_enable(every_n_layers=2)


def test_trainer_with_gradient_checkpointing_makes_the_plain_update(tmp_path):
    """``Trainer(..., gradient_checkpointing=True)``: one SGD step (lr 1, so the update is minus the gradient)
    recomputes every layer and moves the weights by the plain path's gradient."""
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainingArguments

    ids, mask = padded_batch()
    model, _ = pair("depth_attention", num_loops=2)
    model.train()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    plain = grads(model, ids, mask)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, 1:] = labels[:, 1:].masked_fill(mask[:, :-1] == 0, -100)  # the targets grads() scores
    rows = [dict(input_ids=i, attention_mask=m, labels=y) for i, m, y in zip(ids, mask, labels)]

    class Rows(Dataset):
        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            return rows[i]

    calls = layer_calls(model)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, max_steps=1,
                             learning_rate=1.0, optim="sgd", lr_scheduler_type="constant", report_to=[],
                             save_strategy="no", use_cpu=True, seed=0, max_grad_norm=0.0, disable_tqdm=True,
                             gradient_checkpointing=True)
    Trainer(model=model, args=args, train_dataset=Rows()).train()
    assert model.is_activation_checkpointing
    assert len(calls) == 2 * 2 * len(model.model.layers)  # 2 virtual layers per physical one, each run twice
    after = dict(model.named_parameters())
    for k, g in plain.items():
        torch.testing.assert_close(after[k].detach() - start[k], -g, atol=1e-6, rtol=0)


# -------------------------------------------------------------------------------- cache_implementation="static"
@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_static_cache_generates_the_dynamic_tokens(method, kw):
    ours, q = pair(method, **kw)
    ids, mask = padded_batch()

    def run(model, **kw):
        return model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0,
                              return_dict_in_generate=True, output_scores=True, **kw)

    dynamic, static = run(ours), run(ours, cache_implementation="static")
    assert torch.equal(static.sequences, dynamic.sequences)
    for a, b in zip(static.scores, dynamic.scores, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    kv = static.cache.kv
    assert kv.static and kv.capacity == ids.shape[1] + 5 - 1  # max_length - 1 slots, never grown
    assert not dynamic.cache.kv.static
    if q is not None:
        assert torch.equal(run(q, cache_implementation="static").sequences, dynamic.sequences)
    with pytest.raises(ValueError, match="cache_implementation='offloaded' is not supported"):
        run(ours, cache_implementation="offloaded")


# -------------------------------------------------------------------------------- attn_implementation
@pytest.mark.parametrize("impl", ["flash_attention_2", "flex_attention", "garbage"])
def test_unsupported_attn_implementation_is_refused_in_one_line(tmp_path, impl):
    from transformers import AutoModelForCausalLM

    message = rf"attn_implementation='{impl}' is not supported by DepthAttn\w+; use one of 'sdpa', 'eager'"
    config = DepthAttnConfig.from_model_config(tiny_config())
    DepthAttnForCausalLM(config).save_pretrained(tmp_path / "ck")
    with pytest.raises(ValueError, match=message):
        DepthAttnForCausalLM(DepthAttnConfig.from_model_config(tiny_config(), attn_implementation=impl))
    with pytest.raises(ValueError, match=message):
        AutoModelForCausalLM.from_config(config, attn_implementation=impl)
    with pytest.raises(ValueError, match=message):
        AutoModelForCausalLM.from_pretrained(tmp_path / "ck", attn_implementation=impl)
    with pytest.raises(ValueError, match=message):
        DepthAttnModel.from_pretrained(tmp_path / "ck", attn_implementation=impl)


@pytest.mark.parametrize("impl", ["sdpa", "eager", None])
def test_sdpa_and_eager_are_accepted(tmp_path, impl):
    from transformers import AutoModelForCausalLM

    ours, _ = pair("none")
    ours.save_pretrained(tmp_path / "ck")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ck", attn_implementation=impl).eval()
    assert loaded.config._attn_implementation == (impl or "sdpa")
    ids = batch()
    torch.testing.assert_close(loaded(ids).logits, ours(ids).logits, atol=0, rtol=0)


# -------------------------------------------------------------------------------- headless AutoModel
@pytest.mark.parametrize("method,kw", CASES, ids=IDS)
def test_auto_model_loads_the_causal_lm_folder_headless(tmp_path, method, kw):
    from transformers import AutoModel, Qwen3Model

    ours, q = pair(method, **kw)
    ours.save_pretrained(tmp_path / "ck")
    base = AutoModel.from_pretrained(tmp_path / "ck").eval()
    assert type(base) is DepthAttnModel
    assert {f"model.{k}" for k in base.state_dict()} == {k for k in ours.state_dict() if k.startswith("model.")}
    ids, mask = padded_batch()
    out = base(ids, attention_mask=mask, use_cache=True)
    hidden = ours.model(ids, mask)
    torch.testing.assert_close(out.last_hidden_state, hidden, atol=0, rtol=0)
    assert out.cache.get_seq_length() == ids.shape[1]
    embeds = base.get_input_embeddings()(ids)
    torch.testing.assert_close(base(inputs_embeds=embeds, attention_mask=mask).last_hidden_state, hidden,
                               atol=0, rtol=0)
    if q is not None:  # Qwen3ForCausalLM's Qwen3Model on the same weights: its keys and hidden states
        assert isinstance(q.base_model, Qwen3Model)
        assert set(q.base_model.state_dict()) == set(base.state_dict())
        real = mask.bool()  # what a padded position holds is not defined by either model
        torch.testing.assert_close(out.last_hidden_state[real],
                                   q.base_model(ids, attention_mask=mask).last_hidden_state[real], atol=1e-5, rtol=0)
    # the headless model's modules are its core's: training mode, checkpointing and saving follow
    base.train()
    base.gradient_checkpointing_enable()
    assert base._backbone().training and base._backbone().activation_checkpointing
    base.save_pretrained(tmp_path / "base")
    again = DepthAttnModel.from_pretrained(tmp_path / "base").eval()
    torch.testing.assert_close(again(ids, attention_mask=mask).last_hidden_state, hidden, atol=0, rtol=0)


def test_headless_model_resizes_with_its_core():
    model = DepthAttnModel(DepthAttnConfig.from_model_config(tiny_config())).eval()
    model.resize_token_embeddings(V + 5)
    assert model._backbone().embed_tokens is model.embed_tokens
    assert model(torch.full((1, 3), V + 4)).last_hidden_state.shape == (1, 3, 32)
    with pytest.raises(ValueError, match=rf"token id {V + 5} outside the vocabulary"):
        model(torch.full((1, 3), V + 5))
