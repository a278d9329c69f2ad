"""Compiled decode (gpt-fast style) against its eager twin: same greedy tokens, close logits, one graph per shape.

Most tests use dynamo's ``eager`` backend (capture with ``fullgraph=True`` on the static cache path, no code
generation) so that CI on 2 cores stays fast; a few run inductor end to end (both wrappers, a looped model, the
C++ wrapper's fallback).
"""

import importlib

import pytest
import torch
from torch._dynamo.utils import counters

from depthattn import generate
from depthattn.generate import CompileLimitReached, CompileUnavailable, CompiledDecoder, check_compile_works, decode_one_token, prefill

from conftest import left_padded_batch, make_model

pytestmark = pytest.mark.compile  # torch.compile throughout (dynamo tracing, inductor)

CONFIGS = {
    "none": dict(cross_layer="none"),
    "depth_attention": dict(cross_layer="depth_attention"),
    "denseformer": dict(cross_layer="denseformer"),
    "mhc": dict(cross_layer="mhc"),
    "attnres": dict(cross_layer="attnres"),
    "looped_depth_attention": dict(cross_layer="depth_attention", num_loops=2),
    "value_residual_learnable": dict(cross_layer="value_residual", value_residual_learnable=True),
    "depth_attention_uniform": dict(cross_layer="depth_attention_uniform"),
}


def test_configs_cover_every_registered_method():
    from depthattn.cross_layer import names

    assert {c["cross_layer"] for c in CONFIGS.values()} == set(names())


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _step_logits(model, ids, mask, steps: int, decoder=None):
    """Greedy logits ``[steps + 1, B, V]`` of a prefill and ``steps`` decode steps (eager, or ``decoder``'s), in a
    cache of the capacity ``generate(..., steps + 1)`` uses (so a compiled decode graph is shared with it)."""
    run_prefill, run_decode = (prefill, decode_one_token) if decoder is None else (decoder.prefill,
                                                                                   decoder.decode_one_token)
    cache = model.new_cache(ids.shape[0], ids.shape[1] + steps + 1)
    logits = [run_prefill(model, ids, mask, cache)]
    for _ in range(steps):
        logits.append(run_decode(model, logits[-1].argmax(-1), cache))
    assert cache.length == ids.shape[1] + steps and (decoder is None or cache.static)
    return torch.stack(logits)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_compiled_generation_equals_eager_for_every_method(name):
    model = make_model(num_hidden_layers=2, **CONFIGS[name])
    ids, mask = left_padded_batch(512, [6, 3], seed=7)  # ragged, left-padded
    eager = generate(model, ids, 5, temperature=0, attention_mask=mask)
    compiled = generate(model, ids, 5, temperature=0, attention_mask=mask, compile="eager")
    assert torch.equal(compiled, eager)
    torch.testing.assert_close(_step_logits(model, ids, mask, 4, CompiledDecoder("eager")),
                               _step_logits(model, ids, mask, 4), atol=1e-5, rtol=0)
    assert counters["stats"]["unique_graphs"] == 2 and not counters["graph_break"]  # prefill + decode, full graphs


@pytest.mark.parametrize("cpp_wrapper,loops", [(None, 1), (False, 1), (None, 2)])
def test_inductor_decode_equals_eager_decode(cpp_wrapper, loops):
    """The real thing: inductor-generated code for the prefill and the decode step (Depth-Attention, plain and
    looped), with the default C++ wrapper of the CPU decode step and with inductor's Python wrapper."""
    from torch._inductor.utils import run_and_get_code

    try:
        check_compile_works("cpu")
    except CompileUnavailable as e:
        pytest.skip(str(e))
    counters.clear()  # the probe's graph
    model = make_model(num_hidden_layers=2, depth_attention_stride=1, num_loops=loops)
    ids, mask = left_padded_batch(512, [5, 2], seed=1)
    eager = _step_logits(model, ids, mask, 4)
    decoder = CompiledDecoder(cpp_wrapper=cpp_wrapper)
    compiled, code = run_and_get_code(_step_logits, model, ids, mask, 4, decoder)
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
    assert torch.equal(compiled.argmax(-1), eager.argmax(-1))
    assert not counters["graph_break"]
    assert len(code) == 2  # prefill (Python wrapper: dynamic shapes) and decode step
    assert ["def call(" in c for c in code] == [True, cpp_wrapper is False]  # the decode step's wrapper


def test_a_cpp_wrapper_that_fails_to_build_falls_back_to_the_python_wrapper(monkeypatch):
    """A broken C++ toolchain for the wrapper (here: a compiler that does not exist, for this graph only) costs
    one warning, and the decode step still equals eager decode."""
    gen = importlib.import_module("depthattn.generate")  # the module (the package's ``generate`` is the function)

    try:
        check_compile_works("cpu")
    except CompileUnavailable as e:
        pytest.skip(str(e))
    monkeypatch.setattr(gen, "CPU_DECODE_OPTIONS", {"cpp_wrapper": True, "cpp.cxx": (None, "/nonexistent/c++")})
    model = make_model(num_hidden_layers=2, depth_attention_stride=1)
    ids, mask = left_padded_batch(512, [4, 2], seed=2)
    eager = _step_logits(model, ids, mask, 3)
    decoder = CompiledDecoder()
    with pytest.warns(RuntimeWarning, match=r"C\+\+ wrapper failed .*; using its Python wrapper") as record:
        compiled = _step_logits(model, ids, mask, 3, decoder)
    assert len(record) == 1 and decoder.cpp_wrapper is False
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)


def test_cpp_wrapper_needs_inductor():
    with pytest.raises(ValueError, match="cpp_wrapper=True needs the inductor backend, got backend='eager'"):
        CompiledDecoder("eager", cpp_wrapper=True)
    assert CompiledDecoder("eager").cpp_wrapper is False and CompiledDecoder().cpp_wrapper is True


def test_64_token_generation_compiles_the_decode_step_once():
    model = make_model(num_hidden_layers=2, cross_layer="depth_attention", depth_attention_stride=1)
    ids = torch.randint(1, 512, (1, 4), generator=torch.Generator().manual_seed(0))
    out = generate(model, ids, 64, temperature=0, compile="eager")
    assert out.shape == (1, 68)
    assert counters["stats"]["unique_graphs"] == 2  # one prefill graph, one decode graph for all 63 decode steps
    assert not counters["graph_break"]
    again = generate(model, ids, 64, temperature=0, compile="eager")  # same (batch, capacity): no new graph
    assert torch.equal(again, out) and counters["stats"]["unique_graphs"] == 2
    assert torch.equal(out, generate(model, ids, 64, temperature=0))


def test_a_backend_that_does_not_work_gives_one_line():
    def broken(gm, example_inputs):
        raise RuntimeError("no C++ compiler found\nsecond line of detail")

    with pytest.raises(CompileUnavailable, match=r"\(backend 'broken'\) does not work here: RuntimeError: no C") as e:
        check_compile_works("cpu", broken)
    assert "\n" not in str(e.value)
    model = make_model(num_hidden_layers=2)
    with pytest.raises(CompileUnavailable, match="does not work here"):
        generate(model, torch.ones(1, 3, dtype=torch.long), 2, compile=broken)


def test_more_decode_shapes_than_dynamos_limit_is_one_clear_error():
    """One graph per (model, batch size, capacity): past ``recompile_limit`` the step says so in one line."""
    torch._dynamo.reset()
    before = torch._dynamo.config.recompile_limit
    model = make_model(num_hidden_layers=2)
    with torch._dynamo.config.patch(recompile_limit=2):  # dynamo's own patcher (restores the value after)
        for batch in (1, 2):
            generate(model, torch.ones(batch, 3, dtype=torch.long), 2, temperature=0, compile="eager")
        with pytest.raises(CompileLimitReached, match=r"compiled decode step: dynamo's recompile limit is reached "
                                                      r"\(torch._dynamo.config.recompile_limit = 2 .*reuse a batch "
                                                      r"size") as e:
            generate(model, torch.ones(3, 3, dtype=torch.long), 2, temperature=0, compile="eager")
    assert "\n" not in str(e.value)
    assert torch._dynamo.config.recompile_limit == before  # restored for the tests after this one
    torch._dynamo.reset()


def _mix_twin64(q, keys, values):
    """Float64 twin with plain autograd: softmax over depth of the group-mean scores, weighted sum of values."""
    from depthattn.cross_layer.depth_attention import depth_weights

    w = depth_weights(q, keys)
    return sum(w[..., i, None] * v for i, v in enumerate(values))


def test_compiled_depth_mix_is_one_graph_and_matches_the_float64_twin():
    """The mix (group-mean query, scores, fp32 softmax, weighted sum, cast) compiles into one graph, forward and
    the hand-written backward (training) and the inference path (decode), and matches the float64 twin."""
    from depthattn.cross_layer.depth_attention import depth_mix, depth_mix_ref

    try:
        check_compile_works("cpu")
    except CompileUnavailable as e:
        pytest.skip(str(e))
    counters.clear()  # the probe's graph
    g = torch.Generator().manual_seed(0)
    B, H, K, T, D, n = 2, 4, 2, 3, 16, 3
    q = torch.randn(B, H, T, D, generator=g)
    kv = [torch.randn(B, K, T, D, generator=g) for _ in range(2 * n)]

    def mix(q, *kv):
        return depth_mix(q, kv[:n], kv[n:])

    fused = torch.compile(mix, fullgraph=True)
    leaves = [t.clone().requires_grad_() for t in (q, *kv)]
    out = fused(*leaves)
    grad_out = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad(out, leaves, grad_out)
    leaves64 = [t.double().requires_grad_() for t in (q, *kv)]
    out64 = _mix_twin64(leaves64[0], leaves64[1:1 + n], leaves64[1 + n:])
    grads64 = torch.autograd.grad(out64, leaves64, grad_out.double())
    torch.testing.assert_close(out.double(), depth_mix_ref(q, kv[:n], kv[n:]), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.double(), out64.detach(), atol=1e-5, rtol=0)
    for got, want in zip(grads, grads64):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
    with torch.no_grad():  # the decode path (no autograd): a second graph of the same function
        torch.testing.assert_close(fused(q, *kv).double(), out64.detach(), atol=1e-5, rtol=0)
    assert counters["stats"]["unique_graphs"] == 2 and not counters["graph_break"]


def test_mhc_sinkhorn_maps_compile_without_graph_breaks_for_training():
    from depthattn.cross_layer.mhc import Connector

    model = make_model(num_hidden_layers=2, cross_layer="mhc")
    conn: Connector = model.model.layers[0].cross_layer.connectors[0]
    X = torch.randn(2, 3, model.config.mhc_num_streams, model.config.hidden_size, requires_grad=True)
    eager = conn.maps(X)
    grads_eager = torch.autograd.grad(sum(m.sum() for m in eager), [X, conn.phi.weight, conn.alpha])
    compiled = torch.compile(conn.maps, fullgraph=True, backend="aot_eager")(X)
    grads = torch.autograd.grad(sum(m.sum() for m in compiled), [X, conn.phi.weight, conn.alpha])
    assert not counters["graph_break"] and counters["stats"]["unique_graphs"] == 1
    for got, want in zip((*compiled, *grads), (*eager, *grads_eager)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
