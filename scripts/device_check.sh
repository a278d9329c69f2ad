#!/usr/bin/env bash
# One prepared run on a lent GPU machine: GPU tests, then the benchmark on 2 pinned CPU threads (a quiet host) and
# on the GPU in bf16. Results go to $OUT. Usage (device tool): bash scripts/device_check.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/env.txt"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$OUT/env.txt"
METHODS=${METHODS:-none,depth_attention,denseformer,mhc,attnres}
timeout 200 python3 -m pytest -m gpu tests/model/test_gpu.py -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.txt"
# CPU benchmark: run on the 2-core CI-class machine itself (see docs/benchmarks.md).
timeout 150 python3 scripts/bench.py --device cuda --dtype bfloat16 --preset 360m --batch-size 8 --seq-len 2048 \
  --methods "$METHODS" --rounds 6 --decode-steps 64 2>&1 | tee "$OUT/bench_gpu.txt"
timeout 200 python3 scripts/bench.py --device cuda --dtype bfloat16 --preset 360m --batch-size 8 --seq-len 2048 \
  --methods none,depth_attention --rounds 6 --compile --decode-batches "" 2>&1 | tee "$OUT/bench_gpu_compile.txt"
# FSDP2 training of the 360m preset on this one GPU: bf16 (MixedPrecisionPolicy), compiled blocks, a few steps per
# method; prints tokens/s, MFU and peak memory of the steps after compilation (docs/training-at-scale.md).
FSDP_STEPS=${FSDP_STEPS:-8}
FSDP_PRESET=${FSDP_PRESET:-360m}; FSDP_SETS=${FSDP_SETS:-"--set precision=bfloat16 --set seq_len=2048 --set batch_size=4"}
[ -f "$OUT/fsdp_data/meta.json" ] || python3 -m depthattn.cli data prepare --out "$OUT/fsdp_data" --quiet >/dev/null 2>&1
for m in ${METHODS//,/ }; do
  rm -rf "$OUT/fsdp_$m"
  timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node=1 -m depthattn.cli train --preset "$FSDP_PRESET" \
    --cross-layer "$m" --data "$OUT/fsdp_data" --steps "$FSDP_STEPS" --out "$OUT/fsdp_$m" --no-progress --compile \
    --set data_parallel=fsdp $FSDP_SETS --set grad_accum=1 \
    --set eval_every=0 --set eval_windows=2 --set save_every=0 --set log_every=1 --set tensorboard=false \
    > "$OUT/fsdp_$m.log" 2>&1
  python3 - "$OUT/fsdp_$m" "$m" <<'PY' 2>&1 | tee -a "$OUT/fsdp_train.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if l.strip()] if __import__("os").path.exists(f"{sys.argv[1]}/metrics.jsonl") else []
late = rows[2:] or rows
if not late:
    print(f"{sys.argv[2]:16s} FAILED (see fsdp_{sys.argv[2]}.log)")
else:
    med = lambda k: statistics.median(r[k] for r in late if k in r) if any(k in r for r in late) else float("nan")
    print(f"{sys.argv[2]:16s} tokens/s {med('tokens_per_s'):10.0f}  MFU {100 * med('mfu'):5.1f}%  "
          f"TFLOP/s {med('flops_per_s') / 1e12:6.1f}  peak {max(r['peak_memory_gib'] for r in late):6.2f} GiB  "
          f"loss {late[-1]['loss']:.3f}")
PY
done
