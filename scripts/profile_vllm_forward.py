"""Where Depth-Attention's serving time goes: the plugin's forward per step kind, vanilla vs Depth-Attention, in vLLM.

One in-process engine on a random Depth-Attention checkpoint of width ``WIDTH`` (``bench_vllm.width_config``) runs
the same batches with three plans, alternated per batch (``depthattn.bench.interleaved``, order reversed every other
batch): ``none`` (the empty plan: vanilla), ``da`` (its own plan)
and ``contig`` (vanilla with the value made contiguous before vLLM's attention, as the mix's output is). For each
plan and step kind (prefill: more tokens than sequences; decode) it prints the median thread CPU time of
``DepthAttnModel.forward`` and of the ``token_depth_mix`` calls inside it. A diagnostic, not a test; run in the vLLM
environment with one torch thread:

    OMP_NUM_THREADS=1 .venv-vllm/bin/python scripts/profile_vllm_forward.py 256 16 128 32 4
    (WIDTH BATCH PROMPT_LEN NEW_TOKENS PAIRS)
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: the patches reach it
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import bench_vllm  # noqa: E402
from depthattn.bench import interleaved  # noqa: E402
from depthattn.serving import vllm_model  # noqa: E402

PLANS = ("none", "da", "contig")
state = {"plan": "none", "mix": 0.0}
samples: dict[tuple[str, str], dict[str, list[float]]] = {}
_mix, _forward = vllm_model.token_depth_mix, vllm_model.DepthAttnModel.forward


def timed_mix(*args, **kwargs):
    t = time.thread_time()
    out = _mix(*args, **kwargs)
    state["mix"] += time.thread_time() - t
    return out


def contiguous_value(module, args):
    """Forward pre-hook on vLLM's ``Attention``: in the ``contig`` plan its value input is made contiguous."""
    if state["plan"] == "contig":
        return (*args[:2], args[2].contiguous(), *args[3:])
    return None


def hook_attention(model):
    for layer in model.model.layers:
        layer.self_attn.attn.register_forward_pre_hook(contiguous_value)
    return len(model.model.layers)


def forward_for(batch):
    def forward(self, input_ids, positions, *args, **kwargs):
        state["mix"] = 0.0
        t = time.thread_time()
        out = _forward(self, input_ids, positions, *args, **kwargs)
        kind = "prefill" if positions.shape[-1] > batch else "decode"
        entry = samples.setdefault((state["plan"], kind), {"forward": [], "mix": []})
        entry["forward"].append(time.thread_time() - t)
        entry["mix"].append(state["mix"])
        return out
    return forward


def main() -> None:
    width, batch, prompt_len, new_tokens, pairs = (int(x) for x in sys.argv[1:6])
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    vllm_model.token_depth_mix = timed_mix
    vllm_model.DepthAttnModel.forward = forward_for(batch)
    with tempfile.TemporaryDirectory() as folder:
        path = bench_vllm.make_checkpoint(folder, width, bench_vllm.make_tokenizer(folder, 8192))
        llm = LLM(model=path, dtype="float32", enforce_eager=True, enable_prefix_caching=False,
                  max_model_len=prompt_len + new_tokens, max_num_seqs=batch, seed=0)
        params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
        llm.apply_model(hook_attention)
        da = llm.apply_model(lambda m: m.model.plan)[0]
        plans = {"none": tuple(() for _ in da), "da": da, "contig": tuple(() for _ in da)}
        g = torch.Generator().manual_seed(0)

        def run(plan, prompts):
            state["plan"] = plan
            llm.apply_model(lambda m: bench_vllm._set_plan(m, plans[plan]))
            return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

        def prompts():
            return [TokensPrompt(prompt_token_ids=torch.randint(1, 8000, (prompt_len,), generator=g).tolist())
                    for _ in range(batch)]

        warm = prompts()
        tokens = {plan: run(plan, warm) for plan in PLANS}
        print(f"contig tokens == vanilla tokens: {tokens['contig'] == tokens['none']}; Depth-Attention's differ: "
              f"{tokens['da'] != tokens['none']}")
        samples.clear()
        shared = {}  # the batch every plan of a round runs

        def new_batch(index: int) -> None:
            shared["prompts"] = prompts()

        def case(plan):
            def go() -> None:  # the forwards time themselves (samples)
                run(plan, shared["prompts"])
            return go

        interleaved({plan: case(plan) for plan in PLANS}, pairs, order="abba", warmup=0, before_round=new_batch)
    for kind in ("prefill", "decode"):
        base = statistics.median(samples["none", kind]["forward"])
        for plan in PLANS:
            s = samples[plan, kind]
            f, m = statistics.median(s["forward"]), statistics.median(s["mix"])
            print(f"width {width} {kind:7s} {plan:6s}: {len(s['forward'])} forwards, {f * 1e3:8.2f} ms CPU each "
                  f"({f / base:.3f} x vanilla), of which token_depth_mix {m * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
