"""Document masking (``DecoderLM.forward(..., document_ids=)``, ``TrainConfig.doc_mask``): a document packed after
others gets the logits it gets alone (every method, eager and compiled), positions restart, the HF packing
convention (restarting ``position_ids``) is the same path, training with ``doc_mask`` runs and is what it says, and
the refusals are one line each.

Twins: a document run alone in its own forward (the obvious meaning of "attention only within a document, positions
from 0"); Python loops for the id and position helpers. Tolerance: 1e-5 on float32 logits of magnitude ~1 (measured
~3e-7: the packed and the alone forward differ only in the reduction order of masked attention).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from depthattn.cross_layer import get as method_record, names as method_names
from depthattn.data import embedded_corpus_documents, load_prepared, prepare_corpus
from depthattn.data.boundaries import document_boundary_token, window_document_ids
from depthattn.functional import (attention, causal_padding_mask, document_block_mask, document_positions,
                                  document_runs, flex_attention, packed_document_ids)
from depthattn.training import TrainConfig, read_metrics, resolve_model_config, train

from conftest import make_model

ATOL = 1e-5
#: Row 0 packs three documents, row 1 two (T = 16).
LENGTHS = ([5, 8, 3], [9, 7])


def packed_batch(vocab: int = 512, seed: int = 0, layout=LENGTHS):
    """(ids [2, T], document_ids [2, T], the documents of each row as id tensors [1, n]); T = 16 by default."""
    g = torch.Generator().manual_seed(seed)
    rows, docs, pieces = [], [], []
    for lengths in layout:
        parts = [torch.randint(0, vocab, (1, n), generator=g) for n in lengths]
        pieces.append(parts)
        rows.append(torch.cat(parts, 1))
        docs.append(torch.cat([torch.full((1, n), 10 * d + 7) for d, n in enumerate(lengths)], 1))  # any labels
    return torch.cat(rows), torch.cat(docs), pieces


def alone_logits(model, pieces) -> torch.Tensor:
    """The twin: every document in its own forward, logits concatenated back into the packed layout."""
    with torch.no_grad():
        return torch.cat([torch.cat([model(p).logits for p in parts], 1) for parts in pieces])


def method_models():
    """One model per registered method, plus the looped form of every loopable one."""
    cases = [(m, {}) for m in method_names()]
    cases += [(m, {"num_loops": 2}) for m in method_names() if method_record(m).loopable]
    return cases


CASES = method_models()
IDS = [m + ("-loops2" if o else "") for m, o in CASES]


# ------------------------------------------------------------------------------------------------ the helpers
def test_window_document_ids_match_a_loop():
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 4, (3, 40), generator=g)  # eos 0: frequent, sometimes first or last or twice in a row
    want = torch.zeros_like(x)
    for b in range(x.shape[0]):
        doc = 0
        for t in range(x.shape[1]):
            want[b, t] = doc
            doc += int(x[b, t]) == 0
    assert torch.equal(window_document_ids(x, 0), want)
    assert window_document_ids(x, 0).dtype == torch.int64


def test_runs_positions_and_packed_ids_match_loops():
    g = torch.Generator().manual_seed(4)
    labels = torch.randint(0, 3, (3, 30), generator=g)
    real = torch.rand(3, 30, generator=g) > 0.3
    runs = document_runs(labels)
    pos = document_positions(runs, real)
    for b in range(3):
        run, count = 0, 0
        for t in range(30):
            if t and labels[b, t] != labels[b, t - 1]:
                run, count = run + 1, 0
            assert runs[b, t] == run
            assert pos[b, t] == count
            count += bool(real[b, t])
    # HF's flattening collator: each packed example counts from 0 (a row may start anywhere)
    position_ids = torch.tensor([[3, 4, 5, 0, 1, 0, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 7, 8]])
    assert packed_document_ids(position_ids).tolist() == [[0, 0, 0, 1, 1, 2, 3, 3, 3], [0] * 9]
    assert torch.equal(document_positions(document_runs(packed_document_ids(position_ids)))[:, 3:],
                       position_ids[:, 3:])


def test_flex_block_mask_equals_the_sdpa_mask():
    """FlexAttention (eager: the reference implementation of its semantics, on CPU) with ``document_block_mask``
    equals SDPA with ``causal_padding_mask``'s document mask, with GQA and left padding, on every real query (T is
    not a multiple of the 128-token block, and documents straddle blocks)."""
    g = torch.Generator().manual_seed(0)
    B, H, K, T, D = 2, 4, 2, 150, 16
    q, k, v = (torch.randn(B, n, T, D, generator=g) for n in (H, K, K))
    docs = document_runs(torch.tensor([[0] * 40 + [1] * 70 + [2] * 40, [5] * 100 + [3] * 50]))
    real = torch.ones(B, T, dtype=torch.bool)
    real[1, :10] = False
    for key_mask in (None, real):
        want = attention(q, k, v, causal_padding_mask(key_mask, 0, T, T, torch.float32, "cpu", docs), False)
        got = flex_attention(q, k, v, document_block_mask(docs, key_mask), compiled=False)
        rows = real if key_mask is not None else torch.ones_like(real)
        torch.testing.assert_close(got.transpose(1, 2)[rows], want.transpose(1, 2)[rows], atol=ATOL, rtol=0)


# ------------------------------------------------------------------------------------------------ the model
@pytest.mark.parametrize("method,options", CASES, ids=IDS)
def test_packed_document_gets_its_logits_alone(method, options):
    model = make_model(cross_layer=method, **options)
    ids, docs, pieces = packed_batch()
    with torch.no_grad():
        packed = model(ids, document_ids=docs).logits
        plain = model(ids).logits
    want = alone_logits(model, pieces)
    torch.testing.assert_close(packed, want, atol=ATOL, rtol=0)
    # the test can fail: without the mask, the later documents see the earlier ones
    assert (plain[0, 5:] - want[0, 5:]).abs().max() > 1e-3


def rope_positions(model, call) -> list[torch.Tensor]:
    """The position ids the RoPE tables were computed for during ``call()`` (one entry per forward)."""
    seen = []
    handle = model.model.rotary_emb.register_forward_hook(lambda m, args, out: seen.append(args[0].clone()))
    try:
        with torch.no_grad():
            call()
    finally:
        handle.remove()
    return seen


def test_positions_restart_at_each_document():
    """The RoPE positions of a packed row are those of its documents run alone, concatenated (the twin). (RoPE is
    relative, so with the mask in place the logits cannot show the offset: the positions are checked themselves.)
    Given ``position_ids`` are used as they are."""
    model = make_model()
    ids, docs, pieces = packed_batch()
    (packed,) = rope_positions(model, lambda: model(ids, document_ids=docs))
    alone = [torch.cat([rope_positions(model, lambda p=p: model(p))[0].expand(1, -1) for p in parts], 1)
             for parts in pieces]
    assert torch.equal(packed, torch.cat(alone))
    assert packed[0].tolist() == list(range(5)) + list(range(8)) + list(range(3))
    absolute = torch.arange(16).expand(2, 16)
    (given,) = rope_positions(model, lambda: model(ids, document_ids=docs, position_ids=absolute))
    assert torch.equal(given, absolute)


@pytest.mark.parametrize("method", ["depth_attention", "mhc"])
def test_document_ids_with_left_padding(method):
    """Left padding and packed documents together: every real token gets its logits alone."""
    model = make_model(cross_layer=method)
    ids, docs, pieces = packed_batch()
    pad = 4
    ids = torch.cat([torch.zeros(2, pad, dtype=torch.long), ids], 1)
    docs = torch.cat([docs[:, :1].expand(2, pad), docs], 1)  # pads share the first document's id
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:, :pad] = False
    mask[1, pad] = False  # row 1 also pads its first token (so its first document is one token shorter)
    pieces[1][0] = pieces[1][0][:, 1:]
    with torch.no_grad():
        out = model(ids, attention_mask=mask, document_ids=docs).logits
        want = [torch.cat([model(p).logits[0] for p in parts]) for parts in pieces]
    torch.testing.assert_close(out[mask], torch.cat(want), atol=ATOL, rtol=0)


@pytest.mark.compile
@pytest.mark.parametrize("method", method_names())
def test_packed_equals_alone_compiled_aot_eager(method):
    """``torch.compile`` (``aot_eager``: dynamo + AOTAutograd tracing, eager kernels; inductor's C++ compile of
    every method would take minutes here) of every method's forward with ``document_ids``: the traced graph gets
    the logits of each document alone. (The looped forms are checked eagerly above.)"""
    torch._dynamo.reset()
    model = make_model(cross_layer=method)
    ids, docs, pieces = packed_batch()
    compiled = torch.compile(model, backend="aot_eager", dynamic=False)
    with torch.no_grad():
        out = compiled(ids, document_ids=docs).logits
    torch.testing.assert_close(out, alone_logits(model, pieces), atol=ATOL, rtol=0)


@pytest.mark.compile
@pytest.mark.parametrize("method", ["depth_attention"])
def test_packed_equals_alone_compiled_inductor(method):
    """The default backend (inductor, CPU C++ kernels) for Depth-Attention."""
    from depthattn.training.parallelize import check_compiler

    try:
        check_compiler(torch.device("cpu"))
    except ValueError as e:
        pytest.skip(str(e))
    torch._dynamo.reset()
    model = make_model(cross_layer=method)
    ids, docs, pieces = packed_batch()
    compiled = torch.compile(model, dynamic=False)
    with torch.no_grad():
        out = compiled(ids, document_ids=docs).logits
    torch.testing.assert_close(out, alone_logits(model, pieces), atol=ATOL, rtol=0)


@pytest.mark.compile
def test_flex_path_of_the_model_on_cpu(monkeypatch):
    """The CUDA path (block mask + compiled FlexAttention) run on CPU, where inductor makes FlexAttention's CPU
    kernel: equal to each document alone. (On CUDA: tests/model/test_gpu.py.)"""
    import depthattn.model

    monkeypatch.setattr(depthattn.model, "flex_serves", lambda device: True)
    model = make_model()
    ids, docs, pieces = packed_batch()
    with torch.no_grad():
        out = model(ids, document_ids=docs).logits
    torch.testing.assert_close(out, alone_logits(model, pieces), atol=ATOL, rtol=0)


def test_gradients_do_not_cross_documents():
    """The backward pass respects the documents too: row 0's second document's logits have a gradient with respect
    to its own embeddings only (none to the first or third document's)."""
    model = make_model(cross_layer="mhc").train()
    ids, docs, _ = packed_batch()
    seen = []

    def keep(module, args, out):
        out.retain_grad()
        seen.append(out)

    model.model.embed_tokens.register_forward_hook(keep)
    model(ids, document_ids=docs).logits[0, 5:13].sum().backward()
    g = seen[0].grad[0].abs().sum(-1)
    assert g[:5].max() == 0 and g[13:].max() == 0 and g[5:13].min() > 0


# ------------------------------------------------------------------------------------------------ HF wrapper
def test_hf_restarting_position_ids_equal_document_ids():
    from depthattn.hf import DepthAttnForCausalLM

    core = make_model()
    hf = DepthAttnForCausalLM.from_core(core).eval()
    ids, docs, pieces = packed_batch()
    position_ids = document_positions(document_runs(docs))
    with torch.no_grad():
        via_positions = hf(ids, position_ids=position_ids)
        via_ids = hf(ids, document_ids=docs, use_cache=False).logits
        core_out = core(ids, document_ids=docs).logits
    assert via_positions.past_key_values is None  # packed: no cache made
    torch.testing.assert_close(via_positions.logits, core_out, atol=0, rtol=0)
    torch.testing.assert_close(via_ids, core_out, atol=0, rtol=0)
    torch.testing.assert_close(core_out, alone_logits(core, pieces), atol=ATOL, rtol=0)
    # with an attention_mask (generate's left padding) position_ids are positions, not documents (transformers too)
    with torch.no_grad():
        masked = hf(ids, attention_mask=torch.ones_like(ids), position_ids=position_ids, use_cache=False).logits
    assert (masked[0, 5:] - core_out[0, 5:]).abs().max() > 1e-3


def test_hf_packed_refuses_a_cache():
    from depthattn.hf import DepthAttnForCausalLM

    hf = DepthAttnForCausalLM.from_core(make_model()).eval()
    ids, docs, _ = packed_batch()
    with pytest.raises(ValueError, match="cannot be combined with a cache") as e:
        hf(ids, position_ids=document_positions(document_runs(docs)), use_cache=True)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="cannot be combined with a cache"):
        hf(ids, document_ids=docs, use_cache=True)


# ------------------------------------------------------------------------------------------------ refusals
def test_document_ids_refusals_are_one_line():
    model = make_model()
    ids, docs, _ = packed_batch()
    cases = [
        (dict(document_ids=docs, cache=model.new_cache(2, 32)), "cannot be combined with a KV cache"),
        (dict(document_ids=docs[:, :5]), r"document_ids must be an integer tensor of shape \(2, 16\)"),
        (dict(document_ids=docs.float()), "document_ids must be an integer tensor"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message) as e:
            model(ids, **kwargs)
        assert "\n" not in str(e.value)


def test_no_document_boundaries_is_refused():
    train_tokens = np.array([5, 6, 0, 7, 0], dtype=np.uint16)
    meta = {"eos_token_id": 0, "vocab_size": 512}
    assert document_boundary_token(meta, train_tokens, "d") == 0
    for bad_meta, tokens, message in [
        ({"eos_token_id": None, "vocab_size": 512}, train_tokens, "records no end-of-document token"),
        ({"vocab_size": 512}, train_tokens, "records no end-of-document token"),
        ({"eos_token_id": 900, "vocab_size": 512}, train_tokens, "records no end-of-document token"),
        ({"eos_token_id": 7, "vocab_size": 512}, train_tokens, "does not end with the end-of-document token 7"),
        (meta, train_tokens[:-1], "does not end with the end-of-document token 0"),
    ]:
        with pytest.raises(ValueError, match=message) as e:
            document_boundary_token(bad_meta, tokens, "d")
        assert "\n" not in str(e.value) and "doc_mask=false" in str(e.value)


# ------------------------------------------------------------------------------------------------ training
@pytest.fixture(scope="module")
def short_docs(tmp_path_factory) -> Path:
    """The shipped corpus cut into documents of 300 characters (so that a 64-token window holds several)."""
    folder = tmp_path_factory.mktemp("short_docs")
    texts = [text[i:i + 300] for _, text in embedded_corpus_documents()[:4] for i in range(0, 12000, 300)]
    src = folder / "short.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    prepare_corpus(folder / "data", [str(src)], vocab_size=512, val_fraction=0.2, progress=False)
    return folder / "data"


TRAIN = dict(steps=3, batch_size=4, seq_len=64, eval_every=3, eval_windows=4, eval_batch_size=4, save_every=0,
             save_every_minutes=0.0, tensorboard=False, warmup=0.3)


def test_training_with_doc_mask(short_docs, tmp_path):
    """doc_mask=true trains (a different loss from doc_mask=false on the same windows), and its final validation
    loss is the mean loss of the validation windows with every document of a window run alone (the twin)."""
    from depthattn.checkpoint import load_model
    from depthattn.eval.perplexity import validation_windows

    cfg = resolve_model_config("tiny", {"cross_layer": "depth_attention"}, 512, "tokenizer.json")
    masked = train(tmp_path / "masked", cfg, TrainConfig(**TRAIN, doc_mask=True), short_docs, progress=False)
    plain = train(tmp_path / "plain", cfg, TrainConfig(**TRAIN), short_docs, progress=False)
    rows_m, rows_p = read_metrics(tmp_path / "masked"), read_metrics(tmp_path / "plain")
    assert len(rows_m) == 3 and all(np.isfinite(r["loss"]) for r in rows_m)
    # same init, same windows: only the mask differs (at init the tiny model hardly reads its context, so the first
    # step's losses agree to float32 rounding; measured: 6.2215 vs 6.2115 at step 3)
    assert max(abs(m["loss"] - p["loss"]) for m, p in zip(rows_m, rows_p)) > 1e-3
    assert json.loads((tmp_path / "masked" / "run.json").read_text())["train"]["doc_mask"] is True

    prepared = load_prepared(short_docs)
    eos = prepared.eos_token_id
    windows = validation_windows(prepared.val, 64, 4)
    assert (windows[:, :-1] == eos).any()  # the windows do cross documents
    model = load_model(masked.checkpoint).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for w in windows:
            ends = [i + 1 for i in torch.nonzero(w[:-1] == eos).flatten().tolist()]
            bounds = [0, *ends, 64]
            logits = torch.cat([model(w[None, a:b]).logits for a, b in zip(bounds, bounds[1:]) if b > a], 1)
            total += float(torch.nn.functional.cross_entropy(logits[0], w[1:], reduction="sum"))
            count += 64
    assert abs(total / count - masked.final_val_loss) < 1e-5
    assert abs(plain.final_val_loss - masked.final_val_loss) > 1e-4


def test_doc_mask_on_data_without_boundaries_is_refused(data_dir, tmp_path):
    """A folder whose meta.json names another end-of-document token than its documents end with: refused in one
    line before anything is trained or written."""
    other = tmp_path / "data"
    shutil.copytree(data_dir, other)
    meta = json.loads((other / "meta.json").read_text())
    meta["eos_token_id"] = meta["eos_token_id"] + 1
    (other / "meta.json").write_text(json.dumps(meta))
    cfg = resolve_model_config("tiny", {"cross_layer": "depth_attention"}, 512, "tokenizer.json")
    run = tmp_path / "run"
    with pytest.raises(ValueError, match="doc_mask=true needs document boundaries") as e:
        train(run, cfg, TrainConfig(**TRAIN, doc_mask=True), other, progress=False)
    assert "\n" not in str(e.value)
    assert not (run / "run.json").exists() and not (run / "checkpoints").exists()


def test_doc_mask_must_be_a_bool():
    with pytest.raises(ValueError, match="TrainConfig.doc_mask='yes' is invalid"):
        TrainConfig(doc_mask="yes")
    # a run recorded without the key (release 97f8652): today's behaviour, so it resumes with a new config's default
    from depthattn.training.resume import config_differences

    from depthattn import ModelConfig

    model = ModelConfig.from_preset("tiny").to_dict()
    recorded = {"model": model, "train": {k: v for k, v in TrainConfig().to_dict().items() if k != "doc_mask"}}
    assert TrainConfig.from_recorded(recorded["train"]).doc_mask is False
    assert config_differences(recorded, model, TrainConfig().to_dict()) == []
    assert config_differences(recorded, model, TrainConfig(doc_mask=True).to_dict()) == ["doc_mask: False vs True"]



# ------------------------------------------------------------------------------------------------ CUDA (gpu marker)
#: Documents that straddle FlexAttention's 128-token blocks (T = 300, not a multiple of 128).
LONG = ([100, 150, 50], [300])


@pytest.fixture
def no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize("method", method_names())
@pytest.mark.parametrize("layout", [LENGTHS, LONG], ids=["T16", "T300"])
@pytest.mark.usefixtures("no_tf32")
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_flex_attention_packed_equals_alone(method, layout, monkeypatch):
    """On CUDA the forward takes compiled FlexAttention with the block mask: float32 logits equal each document
    alone (plain causal SDPA) to 1e-4 (other kernels and reduction orders, TF32 off), and the gradients equal those
    of the SDPA-mask path."""
    import depthattn.model
    from depthattn.functional import flex_serves

    assert flex_serves(torch.device("cuda"))
    model = make_model(cross_layer=method).cuda()
    ids, docs, pieces = packed_batch(layout=layout)
    ids, docs = ids.cuda(), docs.cuda()
    with torch.no_grad():
        out = model(ids, document_ids=docs).logits
        want = torch.cat([torch.cat([model(p.cuda()).logits for p in parts], 1) for parts in pieces])
    torch.testing.assert_close(out, want, atol=1e-4, rtol=0)

    grads = []
    for flex in (True, False):
        monkeypatch.setattr(depthattn.model, "flex_serves", lambda device, flex=flex: flex)
        model.zero_grad()
        model(ids, document_ids=docs, labels=ids).loss.backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_compiled_blocks_bf16_doc_mask_step(monkeypatch):
    """The training configuration: blocks compiled by ``parallelize.apply_compile`` (inductor), bf16 autocast, the
    block mask passed through the compiled blocks; the loss equals the SDPA-mask path's to bf16 rounding (3e-2)
    and a backward pass gives finite gradients."""
    import depthattn.model
    from depthattn.training.parallelize import apply_compile

    torch._dynamo.reset()
    model = make_model().cuda().train()
    apply_compile(model)
    ids, docs, _ = packed_batch(layout=LONG)
    ids, docs = ids.cuda(), docs.cuda()
    losses = {}
    for flex in (True, False):
        monkeypatch.setattr(depthattn.model, "flex_serves", lambda device, flex=flex: flex)
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, document_ids=docs, labels=ids).loss
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        losses[flex] = float(loss)
    assert abs(losses[True] - losses[False]) < 3e-2
