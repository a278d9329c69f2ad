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
timeout 200 python3 -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.txt"
# CPU benchmark: run on the 2-core CI-class machine itself (see docs/benchmarks.md).
timeout 150 python3 scripts/bench.py --device cuda --dtype bfloat16 --preset 360m --batch-size 8 --seq-len 2048 \
  --methods "$METHODS" --rounds 6 --decode-steps 64 2>&1 | tee "$OUT/bench_gpu.txt"
timeout 200 python3 scripts/bench.py --device cuda --dtype bfloat16 --preset 360m --batch-size 8 --seq-len 2048 \
  --methods none,depth_attention --rounds 6 --compile --decode-batches "" 2>&1 | tee "$OUT/bench_gpu_compile.txt"
