"""Measure the memory ``depthattn convert --from-authors`` needs: one tensor at a time, never two copies of the weights.

Builds (in a child process, so that its buffers never count) a synthetic authors' folder (hyq718/Depth-Attention
format: Llama + q/k-norm, Depth-Attention switches, bfloat16, sharded safetensors with an index) of the released 3B
shape per layer (hidden 2048, 32 heads / 8 KV heads, head_dim 64, intermediate 6912, vocab 50,304) with
``--layers`` layers (26: 3.2 GB), converts it with ``hf.convert.convert_from_authors`` in this process, and prints
the anonymous memory (``RssAnon`` of ``/proc/self/status``, sampled every 2 ms by a thread; the mapped source and
the page cache are file-backed and do not count) above the baseline taken after the imports, against the issue's
bound of 1.3 × the largest output shard + one tensor. Both folders are deleted afterwards.

    python scripts/bench_import.py --layers 26 --shard-mb 1024 --dtypes bfloat16,float32
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SHAPE = dict(vocab_size=50304, hidden_size=2048, head_dim=64, intermediate_size=6912, num_attention_heads=32,
             num_key_value_heads=8)


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


class Sampler:
    """``with Sampler() as s:``: ``s.peak``, the largest ``RssAnon`` (kB) a thread saw every 2 ms inside the block;
    ``s.start`` the value when it began."""

    def __enter__(self) -> "Sampler":
        self.start = self.peak = status_kb("RssAnon")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, status_kb("RssAnon"))
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def build(folder: Path, layers: int, shards: int) -> None:
    """The child: write the folder shard by shard (one shard's tensors in memory at a time)."""
    import torch
    from safetensors.torch import save_file

    C, V, F = SHAPE["hidden_size"], SHAPE["vocab_size"], SHAPE["intermediate_size"]
    H, K, D = SHAPE["num_attention_heads"], SHAPE["num_key_value_heads"], SHAPE["head_dim"]
    shapes = {"model.embed_tokens.weight": (V, C), "lm_head.weight": (V, C), "model.norm.weight": (C,),
              "lm_head_layernorm.weight": (C,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (H * D, C), p + "self_attn.k_proj.weight": (K * D, C),
                       p + "self_attn.v_proj.weight": (K * D, C), p + "self_attn.o_proj.weight": (C, H * D),
                       p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,),
                       p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                       p + "mlp.down_proj.weight": (C, F), p + "input_layernorm.weight": (C,),
                       p + "post_attention_layernorm.weight": (C,)})
    names = list(shapes)
    per = -(-len(names) // shards)
    weight_map = {}
    g = torch.Generator().manual_seed(0)
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: (0.02 * torch.randn(shapes[n], generator=g)).bfloat16() for n in names[s * per:(s + 1) * per]}
        save_file(part, str(folder / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
        del part
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **SHAPE, "num_hidden_layers": layers,
              "hidden_act": "silu", "max_position_embeddings": 2048, "initializer_range": 0.01, "rms_norm_eps": 1e-5,
              "pretraining_tp": 1, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 0,
              "tie_word_embeddings": False, "rope_theta": 10000.0, "attention_bias": False, "mlp_bias": False,
              "recurrent_model": True, "use_depth_attention": True, "depth_attention_stride": layers // 2,
              "depth_attention_recent_window": 0, "use_qk_norm": True, "scale_embeds": False,
              "torch_dtype": "bfloat16"}
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=26, help="layers of the 3B shape (26: 3.2 GB in bfloat16)")
    ap.add_argument("--source-shards", type=int, default=4)
    ap.add_argument("--shard-mb", type=int, default=1024, help="largest output shard, MiB")
    ap.add_argument("--dtypes", default="bfloat16,float32", help="output dtypes to convert to, one run each")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the two folders go (deleted afterwards)")
    ap.add_argument("--build-only", metavar="FOLDER", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build_only:
        build(Path(args.build_only), args.layers, args.source_shards)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-import-", dir=args.dir))
    try:
        src, out = work / "authors", work / "converted"
        src.mkdir()
        t0 = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--build-only", str(src), "--layers", str(args.layers),
                        "--source-shards", str(args.source_shards)], check=True)
        built = time.perf_counter() - t0
        import torch

        from depthattn.folders.shards import stored_shapes, weight_files
        from depthattn.hf.convert import convert_from_authors

        source_bytes = sum(p.stat().st_size for p in src.glob("*.safetensors"))
        shapes = stored_shapes(weight_files(src)[1]).values()
        mb = 1e6
        print(f"source: {len(list(src.glob('*.safetensors')))} shards, {source_bytes / mb:,.0f} MB bfloat16 "
              f"(built in {built:.0f} s)")
        for name in args.dtypes.split(","):
            dtype = getattr(torch, name)
            largest_tensor = max(dtype.itemsize * int(torch.Size(s).numel()) for s in shapes)
            with Sampler() as check:  # the sampler sees a 100 MB allocation held for 50 ms
                probe = torch.ones(25_000_000)
                time.sleep(0.05)
                del probe
            baseline, hwm0 = status_kb("RssAnon"), status_kb("VmHWM")
            t0 = time.perf_counter()
            with Sampler() as sampled:
                folder, _ = convert_from_authors(src, out, dtype=dtype, shard_bytes=args.shard_mb << 20)
            seconds = time.perf_counter() - t0
            shards = sorted(out.glob("model*.safetensors"))
            largest_shard = max(p.stat().st_size for p in shards)
            bound = 1.3 * largest_shard + largest_tensor
            rise = (sampled.peak - baseline) * 1024
            print(f"--dtype {name}: {len(shards)} output shards, largest {largest_shard / mb:,.1f} MB, largest tensor "
                  f"{largest_tensor / mb:,.1f} MB; converted in {seconds:.0f} s ({source_bytes / mb / seconds:,.0f} "
                  f"MB/s read, checksums included); {folder.notes[-1].split(':')[0]}")
            print(f"  anonymous memory above the post-import baseline: peak {rise / mb:,.1f} MB (RssAnon sampled "
                  f"every 2 ms; the sampler saw {(check.peak - check.start) * 1024 / mb:,.0f} MB of a 100 MB probe); "
                  f"VmHWM rose {(status_kb('VmHWM') - hwm0) * 1024 / mb:,.1f} MB (mapped file pages included)")
            print(f"  bound 1.3 x largest output shard + one tensor = {bound / mb:,.1f} MB: "
                  f"{'within' if rise <= bound else 'EXCEEDED'} ({rise / bound:.3f} of it)")
            shutil.rmtree(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
