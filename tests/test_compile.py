"""Compiled decode (gpt-fast style) against its eager twin: same greedy tokens, close logits, one graph per shape.

Most tests use dynamo's ``eager`` backend (capture with ``fullgraph=True`` on the static cache path, no code
generation) so that CI on 2 cores stays fast; one test runs inductor end to end.
"""

import pytest
import torch
from torch._dynamo.utils import counters

from depthattn import generate
from depthattn.generate import CompileUnavailable, CompiledDecoder, check_compile_works, decode_one_token, prefill

from conftest import left_padded_batch, make_model

CONFIGS = {
    "none": dict(cross_layer="none"),
    "depth_attention": dict(cross_layer="depth_attention"),
    "denseformer": dict(cross_layer="denseformer"),
    "mhc": dict(cross_layer="mhc"),
    "attnres": dict(cross_layer="attnres"),
    "looped_depth_attention": dict(cross_layer="depth_attention", num_loops=2),
}


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


def test_inductor_decode_equals_eager_decode():
    """The real thing: inductor-generated code for the prefill and the decode step (Depth-Attention)."""
    try:
        check_compile_works("cpu")
    except CompileUnavailable as e:
        pytest.skip(str(e))
    model = make_model(num_hidden_layers=2, depth_attention_stride=1)
    ids, mask = left_padded_batch(512, [5, 2], seed=1)
    eager = _step_logits(model, ids, mask, 4)
    compiled = _step_logits(model, ids, mask, 4, CompiledDecoder())
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
    assert torch.equal(compiled.argmax(-1), eager.argmax(-1))
    assert not counters["graph_break"]


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
