"""KV cache and generation: cached decode equals the full forward; bad input gets one clear error."""

import pytest
import torch

from depthattn import KVCache, ModelConfig, generate, generate_stream, naive_generate
from depthattn.checks import check_forward_inputs
from depthattn.generate import sample

from conftest import cached_logits, left_padded_batch, make_model

METHODS = ["none", "depth_attention"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("chunks", [[4] + [1] * 8, [5, 3, 1, 2, 1], [1] * 12, [12]])
def test_cached_decode_equals_full_forward_left_padded(method, chunks):
    model = make_model(cross_layer=method)  # 5 layers, stride 2, GQA group 2
    assert model.config.group_size == 2 and model.plan[-1] == ((0, 2) if method != "none" else ())
    ids, mask = left_padded_batch(512, [12, 7], seed=5)
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
    cached, _ = cached_logits(model, ids, mask, chunks)
    torch.testing.assert_close(cached[mask], full[mask], atol=1e-5, rtol=0)
    assert torch.isfinite(cached).all()


def test_cache_holds_the_mixed_values_of_the_full_forward_and_is_vanilla_sized():
    """Property 11: after a chunked prefill, layer l's value slots equal the Ṽ_l of one uncached full forward."""
    model = make_model()
    ids, mask = left_padded_batch(512, [8, 5], seed=2)
    captured = {}
    hooks = [layer.self_attn.register_forward_hook(lambda m, a, out, i=i: captured.__setitem__(i, out[1]))
             for i, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        model(ids, attention_mask=mask)  # no cache
    for h in hooks:
        h.remove()
    _, cache = cached_logits(model, ids, mask, [3, 1, 4])
    for layer in range(5):
        k_full, v_full = captured[layer]
        torch.testing.assert_close(cache.k[layer][mask[:, None, :, None].expand_as(k_full)],
                                   k_full[mask[:, None, :, None].expand_as(k_full)], atol=1e-5, rtol=0)
        torch.testing.assert_close(cache.v[layer][mask[:, None, :, None].expand_as(v_full)],
                                   v_full[mask[:, None, :, None].expand_as(v_full)], atol=1e-5, rtol=0)
    # Mixed layers store something other than their raw value.
    assert (cache.v[4] - captured[0][1]).abs().max() > 1e-3
    cfg = model.config
    assert cache.v.shape == (cfg.num_hidden_layers, 2, cfg.num_key_value_heads, 8, cfg.head_dim)
    assert cache.bytes_per_token() == 2 * 5 * 2 * 16 * 4
    bf16 = KVCache.empty(cfg, 1, 4, dtype=torch.bfloat16)
    assert bf16.bytes_per_token() == 2 * 5 * 2 * 16 * 2


@pytest.mark.parametrize("method", METHODS)
def test_greedy_generation_equals_naive_full_forward_generation(method):
    model = make_model(cross_layer=method)
    ids, mask = left_padded_batch(512, [6, 3], seed=7)
    fast = generate(model, ids, max_new_tokens=8, temperature=0, attention_mask=mask)
    slow = naive_generate(model, ids, 8, attention_mask=mask)
    assert torch.equal(fast, slow)
    # Each row alone generates the same continuation as in the padded batch.
    for b, n in enumerate([6, 3]):
        alone = generate(model, ids[b:b + 1, -n:], max_new_tokens=8, temperature=0)
        assert torch.equal(alone[0, n:], fast[b, 6:])


def test_sampling_is_seeded_and_respects_top_k_and_top_p():
    model = make_model()
    ids = torch.randint(1, 512, (2, 4))
    a = generate(model, ids, 6, temperature=1.0, top_k=5, seed=11)
    b = generate(model, ids, 6, temperature=1.0, top_k=5, seed=11)
    assert torch.equal(a, b)
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    g = torch.Generator().manual_seed(0)
    draws = {int(sample(logits, 1.0, top_k=2, generator=g)) for _ in range(200)}
    assert draws == {2, 3}
    draws = {int(sample(logits, 1.0, top_p=0.5, generator=g)) for _ in range(200)}
    assert draws == {3}  # p(3) = 0.64 already reaches 0.5
    assert int(sample(logits, 0.0)) == 3 and int(sample(logits, 1e-30)) == 3  # tiny temperature is greedy
    tied = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert len({int(sample(tied, 1.0, top_k=1, generator=g)) for _ in range(50)}) == 1  # exactly k tokens kept


def test_stream_stops_at_eos_and_generate_pads_finished_rows():
    model = make_model(cross_layer="none")
    ids = torch.randint(1, 512, (1, 4))
    first = generate(model, ids, 1, temperature=0)[0, -1].item()
    steps = list(generate_stream(model, ids, 10, temperature=0, eos_token_id=first))
    assert len(steps) == 1 and steps[0].item() == first
    # Batch: the row that hits EOS first keeps emitting EOS while the other row goes on as it would alone.
    other = torch.randint(1, 512, (1, 4), generator=torch.Generator().manual_seed(9))
    alone = generate(model, other, 6, temperature=0)[0, 4:]
    assert first not in alone.tolist()
    both = generate(model, torch.cat([ids, other]), 6, temperature=0, eos_token_id=first)
    assert both[0, 4:].tolist() == [first] * 6 and torch.equal(both[1, 4:], alone)


def test_reorder_and_crop():
    model = make_model()
    ids = torch.randint(1, 512, (2, 6))
    cache = model.new_cache(2, 8)
    with torch.no_grad():
        model(ids, cache=cache)
    k0 = cache.k.clone()
    v0, m0 = cache.v.clone(), cache.key_mask.clone()
    cache.reorder(torch.tensor([1, 0]))
    assert torch.equal(cache.k[:, 0], k0[:, 1]) and torch.equal(cache.v[:, 1], v0[:, 0])
    assert torch.equal(cache.key_mask[0], m0[1])
    cache.crop(3)
    assert cache.length == 3
    with torch.no_grad():
        step = model(ids[[1, 0], 3:4], cache=cache).logits[:, -1]
        full = model(ids[[1, 0], :4]).logits[:, -1]
    torch.testing.assert_close(step, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_attention_heads=4, num_key_value_heads=3), "num_attention_heads"),
    (dict(depth_attention_stride=0), "depth_attention_stride=0"),
    (dict(depth_attention_window=-1), "depth_attention_window=-1"),
    (dict(cross_layer="bogus"), "cross_layer='bogus'"),
    (dict(head_dim=15), "head_dim=15"),
    (dict(num_loops=0), "num_loops=0"),
])
def test_invalid_configs_raise_value_error_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_preset("tiny", **kwargs)


def test_unknown_preset_and_key():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        ModelConfig.from_preset("huge")
    with pytest.raises(ValueError, match="hidden_dim"):
        ModelConfig.from_preset("tiny", hidden_dim=3)


def test_bad_forward_inputs_raise_value_error_naming_the_argument():
    """Shapes are refused by every forward; values by the boundary check (``check_forward_inputs``: generate,
    evaluation, the HF forward), which must refuse everything the old per-forward checks refused."""
    model = make_model()
    ids = torch.randint(0, 512, (2, 5))

    def boundary(input_ids, attention_mask=None, position_ids=None, labels=None, cache=None):
        check_forward_inputs(model.config, input_ids, attention_mask, position_ids, labels, cache)

    for check in (model, boundary):  # shape errors: the forward and the boundary both refuse them
        with pytest.raises(ValueError, match="max_position_embeddings"):
            check(torch.zeros(1, 257, dtype=torch.long))
        with pytest.raises(ValueError, match="attention_mask shape"):
            check(ids, attention_mask=torch.ones(2, 4, dtype=torch.bool))
        with pytest.raises(ValueError, match="attention_mask must be a bool or integer"):
            check(ids, attention_mask=torch.ones(2, 5))
        with pytest.raises(ValueError, match="input_ids must be an integer tensor"):
            check(ids.float())
        with pytest.raises(ValueError, match="at least one row"):
            check(ids[:0])
        with pytest.raises(ValueError, match="labels must be an integer tensor"):
            check(ids, labels=ids.float())
        with pytest.raises(ValueError, match="position_ids must be an integer tensor"):
            check(ids, position_ids=[[0, 1, 2, 3, 4]] * 2)
    # value errors: the boundary refuses them (the forward no longer reads values)
    with pytest.raises(ValueError, match="token id 512"):
        boundary(torch.full((1, 3), 512))
    with pytest.raises(ValueError, match="token id -1"):
        boundary(torch.full((1, 3), -1))
    with pytest.raises(ValueError, match="labels contains 600"):
        boundary(ids, labels=torch.full((2, 5), 600))
    with pytest.raises(ValueError, match="labels contains -5"):
        boundary(ids, labels=torch.full((2, 5), -5))
    with pytest.raises(ValueError, match="no target"):
        boundary(ids, labels=torch.full((2, 5), -100))
    with pytest.raises(ValueError, match="attention_mask must hold only 0 and 1"):
        boundary(ids, attention_mask=torch.full((2, 5), 2))
    with pytest.raises(ValueError, match="position_ids contains -1"):
        boundary(ids, position_ids=torch.full((2, 5), -1))
    with pytest.raises(ValueError, match="position_ids contains 256"):
        boundary(ids, position_ids=torch.full((2, 5), 256))
    cache = model.new_cache(2, 8)
    with torch.no_grad():
        model(ids[:, :3], attention_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]), cache=cache)
    with pytest.raises(ValueError, match="disagree with the cached padding mask"):
        boundary(ids[:, 3:4], attention_mask=torch.ones(2, 4, dtype=torch.bool), cache=cache)
    # generate checks the prompt's values before any work
    with pytest.raises(ValueError, match="token id 512"):
        generate(model, torch.full((1, 3), 512), 2)
    with pytest.raises(ValueError, match="attention_mask must hold only 0 and 1"):
        generate(model, ids, 2, attention_mask=torch.full((2, 5), 2))
    with pytest.raises(ValueError, match="attention_mask shape"):
        generate(model, ids, 2, attention_mask=torch.ones(2, 4, dtype=torch.bool))
    small = make_model(num_hidden_layers=4)
    with pytest.raises(ValueError, match="cache has"):
        model(ids, cache=small.new_cache(2, 8))
    with pytest.raises(ValueError, match="cache has"):
        model(ids, cache=model.new_cache(3, 8))
    cache = model.new_cache(2, 6)
    with torch.no_grad():
        model(ids, cache=cache)
        with pytest.raises(ValueError, match="cache capacity=6"):
            model(ids[:, :2], cache=cache)
    assert cache.length == 5  # the failed call wrote nothing
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, ids, -1)
    with pytest.raises(ValueError, match="exceeds max_position_embeddings"):
        generate(model, ids, 300)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, ids, 2, top_p=1.5)
    for bad in (dict(temperature=-1.0), dict(temperature=float("nan")), dict(top_k=0), dict(top_p=0.0)):
        with pytest.raises(ValueError, match=list(bad)[0]):
            generate_stream(model, ids, 2, **bad)  # checked on the call, before iteration
        with pytest.raises(ValueError, match=list(bad)[0]):
            sample(torch.zeros(1, 4), **bad)
    with pytest.raises(ValueError, match="eos_token_id=9999"):
        generate(model, ids, 2, eos_token_id=9999)
    with pytest.raises(ValueError, match="input_ids must be a"):
        generate(model, ids[0], 2)


def _no_host_sync(monkeypatch):
    """Make every way of reading a tensor's value on the host raise (what a device synchronisation needs)."""
    def refuse(*args, **kwargs):
        raise AssertionError("host read of a tensor value (a device synchronisation) on the hot path")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)


@pytest.mark.parametrize("method", ["depth_attention", "mhc", "attnres", "denseformer"])
def test_hot_path_reads_no_tensor_value_on_the_host(method, monkeypatch):
    """Training forward/backward, a padded prefill and decode steps (dynamic and static cache) never read a value."""
    from depthattn.generate import CompiledDecoder, decode_one_token, prefill

    model = make_model(cross_layer=method)
    ids, mask = left_padded_batch(512, [7, 4], seed=3)
    cache, static = model.new_cache(2, 10), model.new_cache(2, 10)
    steps = CompiledDecoder(backend=None)  # the static path, uncompiled
    _no_host_sync(monkeypatch)
    model.train()
    model(ids, attention_mask=mask, labels=ids).loss.backward()
    model.eval()
    token = prefill(model, ids, mask, cache).argmax(-1)
    tokens, tokens_s = [token], [steps.prefill(model, ids, mask, static).argmax(-1)]
    for _ in range(3):  # both caches are fed the dynamic path's tokens; their greedy choices are compared below
        logits, logits_s = decode_one_token(model, token, cache), steps.decode_one_token(model, token, static)
        token = logits.argmax(-1)
        tokens.append(token)
        tokens_s.append(logits_s.argmax(-1))
    monkeypatch.undo()
    assert torch.equal(torch.stack(tokens_s), torch.stack(tokens))
    assert cache.length == static.length == 10
    torch.testing.assert_close(logits_s, logits, atol=1e-5, rtol=0)
    assert torch.equal(static.slot, torch.tensor(10)) and torch.equal(static.key_mask, cache.key_mask)


@pytest.mark.parametrize("method", METHODS)
def test_static_cache_path_equals_dynamic_path_through_the_plain_forward(method):
    """A static cache (fixed shapes, device slot) used through ``DecoderLM.forward`` in chunks equals the full
    forward, and keeps host and device fill levels equal."""
    model = make_model(cross_layer=method)
    ids, mask = left_padded_batch(512, [9, 5], seed=4)
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
    cache = model.new_cache(2, 12)
    cache.static = True
    outs, start = [], 0
    for n in [4, 1, 3, 1]:
        with torch.no_grad():
            outs.append(model(ids[:, start:start + n], attention_mask=mask[:, :start + n], cache=cache).logits)
        start += n
        assert cache.length == start and int(cache.slot) == start
    torch.testing.assert_close(torch.cat(outs, 1)[mask], full[mask], atol=1e-5, rtol=0)


def test_static_writes_equal_dynamic_writes_slot_for_slot():
    """``write_at`` / ``reserve_at`` (one ``index_put_`` on the whole cache) store exactly what ``write`` /
    ``reserve`` store, in the right layer and slots, and leave every other layer and slot untouched."""
    g = torch.Generator().manual_seed(5)
    dynamic, static = KVCache(3, 2, 2, 4, 9), KVCache(3, 2, 2, 4, 9)
    for t, (start, T) in enumerate([(0, 4), (4, 1), (5, 2)]):
        mask = torch.rand(2, T, generator=g) > 0.3 if t == 0 else None
        dynamic.reserve(mask, T)
        static.reserve_at(mask, torch.arange(start, start + T))
        for layer in (2, 0):  # not in order, not every layer
            k, v = torch.randn(2, 2, T, 4, generator=g), torch.randn(2, 2, T, 4, generator=g)
            k_all, v_all = dynamic.write(layer, start, k, v)
            k_s, v_s = static.write_at(layer, torch.arange(start, start + T), k, v)
            assert torch.equal(k_s[:, :, :start + T], k_all) and torch.equal(v_s[:, :, :start + T], v_all)
        dynamic.advance(T)
        static.advance(T)
    assert torch.equal(static.k, dynamic.k) and torch.equal(static.v, dynamic.v)
    assert torch.equal(static.key_mask, dynamic.key_mask)
    assert not static.k[1].any() and not static.k[:, :, :, 7:].any()  # layer 1 and slots 7, 8 never written
