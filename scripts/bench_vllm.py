"""vLLM serving throughput, vanilla vs Depth-Attention: same weights, same engine config, measured alternately.

Depth-Attention adds no parameters, so both checkpoints hold the *same* tensors (one random ``small``-preset model,
head_dim 64); only ``cross_layer`` differs. Each round runs one worker process per method (order A B, then B A), each
building an in-process vLLM engine (float32, ``enforce_eager``, prefix caching off so every round recomputes), warming
up once and timing ``--repeats`` batches of ``--batch`` random prompts of ``--prompt-len`` tokens with
``--new-tokens`` greedy tokens each (``ignore_eos``). Throughput = (prompt + generated tokens) / time, by wall clock
and by the worker's CPU time (all threads; robust to other load on a shared machine, the number to quote there); a
ratio is the median over rounds of Depth-Attention's time over vanilla's. Run in the vLLM environment
(``bash scripts/ci_vllm.sh`` builds it):

    .venv-vllm/bin/python scripts/bench_vllm.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def make_checkpoints(folder: str, preset: str) -> dict[str, str]:
    import torch

    from depthattn import DecoderLM, ModelConfig
    from depthattn.checkpoint import save_model
    from depthattn.data import embedded_corpus_documents
    from depthattn.data.tokenizer import train_bpe

    cfg = ModelConfig.from_preset(preset)
    tok = os.path.join(folder, "tokenizer.json")
    train_bpe([t[:50000] for _, t in embedded_corpus_documents()[:3]], vocab_size=cfg.vocab_size).save(tok)
    torch.manual_seed(0)
    core = DecoderLM(cfg).eval()
    out = {}
    for method in ("none", "depth_attention"):
        model = DecoderLM(cfg.replace(cross_layer=method)).eval()
        model.load_state_dict(core.state_dict())
        out[method] = os.path.join(folder, method)
        save_model(model, out[method], tokenizer_file=tok)
    return out


def worker(args) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.worker, dtype="float32", enforce_eager=True, enable_prefix_caching=False,
              max_model_len=args.prompt_len + args.new_tokens, max_num_seqs=args.batch, seed=0)
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    g = torch.Generator().manual_seed(0)

    def batch():
        return [TokensPrompt(prompt_token_ids=torch.randint(1, 8000, (args.prompt_len,), generator=g).tolist())
                for _ in range(args.batch)]

    llm.generate(batch(), params, use_tqdm=False)  # warm-up
    wall, cpu = [], []
    for _ in range(args.repeats):
        prompts = batch()
        t0, c0 = time.perf_counter(), time.process_time()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        assert all(len(o.outputs[0].token_ids) == args.new_tokens for o in outs)
    print("RESULT " + json.dumps({"wall": statistics.median(wall), "cpu": statistics.median(cpu)}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="small")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    tokens = args.batch * (args.prompt_len + args.new_tokens)
    with tempfile.TemporaryDirectory(prefix="depthattn-bench-vllm-") as folder:
        ckpts = make_checkpoints(folder, args.preset)
        seconds: dict[str, dict[str, list[float]]] = {m: {"wall": [], "cpu": []} for m in ckpts}
        for r in range(args.rounds):
            order = list(ckpts) if r % 2 == 0 else list(ckpts)[::-1]
            for method in order:
                cmd = [sys.executable, __file__, "--worker", ckpts[method], "--repeats", str(args.repeats),
                       "--batch", str(args.batch), "--prompt-len", str(args.prompt_len),
                       "--new-tokens", str(args.new_tokens)]
                res = subprocess.run(cmd, capture_output=True, text=True)
                line = [s for s in res.stdout.splitlines() if s.startswith("RESULT ")]
                if res.returncode != 0 or not line:
                    sys.exit(f"worker for {method} failed:\n{res.stderr[-3000:]}")
                res = json.loads(line[0][7:])
                for clock in ("wall", "cpu"):
                    seconds[method][clock].append(res[clock])
                print(f"round {r} {method}: {tokens / res['wall']:.0f} tok/s wall, {tokens / res['cpu']:.0f} tok per "
                      f"CPU-second", flush=True)
    print(f"\n{args.preset}, batch {args.batch} x ({args.prompt_len} prompt + {args.new_tokens} generated) tokens, "
          f"float32, enforce_eager, median of {args.repeats} batches per round, {args.rounds} rounds")
    print("| method | tok/s wall | tok per CPU-second |\n|---|---|---|")
    for m, s in seconds.items():
        print(f"| {m} | {tokens / statistics.median(s['wall']):.0f} | {tokens / statistics.median(s['cpu']):.0f} |")
    for clock in ("cpu", "wall"):
        ratios = [d / n for d, n in zip(seconds["depth_attention"][clock], seconds["none"][clock])]
        print(f"Depth-Attention {clock} time / vanilla {clock} time: {statistics.median(ratios):.3f} (per round: "
              f"{', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    main()
