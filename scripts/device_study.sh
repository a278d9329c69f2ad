#!/usr/bin/env bash
# The issue-28 budget study (scripts/study.py's mix parts) on a lent GPU: many 10 M-parameter runs at once on one
# GPU, which a single run leaves mostly idle. Two calls of the device tool:
#
#   COMMIT=<sha> bash scripts/device_study.sh start   # launch it in its own session; watch the first steps
#   COMMIT=<sha> bash scripts/device_study.sh wait    # wait for it (starting it first on a fresh machine), pack
#
# The second call must come within the machine's warm time (30 s): a machine given back takes the running parts
# with it, and `wait` on a fresh one starts the study again from the parts published in docs/study.
# `start` runs the parts compiled (--compile); a part that fails while it watches (a compiler problem on that
# machine) sends the whole study back to eager, in a fresh root. `wait` packs $OUT/study.tar.gz every 20 s and at
# the end: the published parts (docs/study/PART, the mix1/mix4/mix16 ones) and logs/ (each part's study.log, the
# driver's log, the machine). Unpack it here with `tar -xzf study.tar.gz -C /tmp/x`, copy /tmp/x/pub/* to
# results/small-scale, then `depthattn study report --published results/small-scale`. The prepared mix travels as runs/study/data-mix (carry it).
# If the study ends with time to spare, the `gpu`-marked tests run (logs/gpu_tests.txt).
#
# Settings (environment): COMMIT (the code's commit: the copy has no git history), JOBS (parts at once, default 16),
# WATCH_S (seconds `start` watches, default 120), WAIT_S (seconds `wait` may take in all, default 560), DATA;
# DEVICE (default cuda) and EXTRA (study flags, e.g. --tiny) check the script itself on a CPU.
set -uo pipefail
MODE=${1:-wait}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1
export PYTHONPATH=$PWD/src
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=${W:-/tmp/device-study}; mkdir -p "$W/logs" "$W/pub"
JOBS=${JOBS:-16}; WATCH_S=${WATCH_S:-120}; WAIT_S=${WAIT_S:-560}
DATA=${DATA:-runs/study/data-mix}; DEVICE=${DEVICE:-cuda}; EXTRA=${EXTRA:-}
COMMIT=${COMMIT:-$(git rev-parse --short=8 HEAD 2>/dev/null || echo unknown)}
T0=$(date +%s)

say() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

pack() {
  local f r
  for f in "$W"/root*/*/study.log; do  # named by root too: an eager fallback's log must not overwrite the first's
    [ -f "$f" ] || continue; r=$(basename "$(dirname "$(dirname "$f")")")
    cp "$f" "$W/logs/$r-$(basename "$(dirname "$f")").log"
  done
  # tar exits 1 when a file (the driver's log) grew while it was read: the archive is still whole
  # shellcheck disable=SC2046  # a list of folder names
  (cd "$W" && tar -czf "$OUT/.study.tmp" logs $(finished); [ $? -le 1 ]) && mv -f "$OUT/.study.tmp" "$OUT/study.tar.gz"
}

finished() {  # the mix parts published here, as pub/PART (results.json is written last: without it, still writing)
  local d
  for d in "$W"/pub/mix1-* "$W"/pub/mix4-* "$W"/pub/mix16-*; do [ -f "$d/results.json" ] && echo "pub/${d##*/}"; done
}

running() { [ -f "$W/driver.pid" ] && kill -0 "$(cat "$W/driver.pid")" 2>/dev/null; }

launch() {  # $1: root suffix, $2...: extra study flags
  local root="$W/root$1"; shift
  say "launching the study: --jobs $JOBS $* (root $root)"
  # The study runs from its own copy of the code and data under $W: a later call re-sends the working tree (and
  # any carried data) over the repository while the parts are running.
  # shellcheck disable=SC2086  # EXTRA is a list of flags
  PYTHONPATH="$W/code/src" setsid python3 "$W/code/scripts/study.py" --root "$root" --publish "$W/pub" \
    --mix-data "$W/data-mix" --device "$DEVICE" --commit "$COMMIT" $EXTRA "$@" run --all --jobs "$JOBS" \
    >>"$W/logs/driver.log" 2>&1 </dev/null &
  echo $! >"$W/driver.pid"
  echo "$*" >"$W/mode"
}

progress() {
  local m
  for m in "$W"/root*/*/runs/*/metrics.jsonl; do
    [ -f "$m" ] && echo "  $(echo "$m" | sed "s|$W/||; s|/runs/.*||"): $(wc -l <"$m") rows"
  done | sort | head -40
  say "published parts: $(finished | wc -l); GPU: $(nvidia-smi --query-gpu=utilization.gpu,memory.used \
    --format=csv,noheader)"
}

start() {
  if running; then say "the study is already running"; progress; return; fi
  cp -rn docs/study/. "$W/pub/"  # the finished parts (embedded corpus, the CPU cross-check) count as done
  rm -rf "$W/code"; mkdir -p "$W/code"; cp -r src scripts "$W/code/"
  [ -f "$W/data-mix/meta.json" ] || cp -r "$DATA" "$W/data-mix"
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import torch, triton, transformers as t
print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', t.__version__)"
    lscpu | grep -E "Model name|^CPU\(s\)"; echo "commit $COMMIT"; } >"$W/logs/env.txt" 2>&1
  cat "$W/logs/env.txt"
  launch "" --compile
  while [ $(( $(date +%s) - T0 )) -lt "$WATCH_S" ]; do
    sleep 5
    if grep -q "failed (exit" "$W/logs/driver.log" && [ "$(cat "$W/mode")" = "--compile" ]; then
      say "a compiled part failed:"; grep -A6 "failed (exit" "$W/logs/driver.log" | head -20
      kill -TERM -- "-$(cat "$W/driver.pid")" 2>/dev/null; sleep 3; kill -KILL -- "-$(cat "$W/driver.pid")" 2>/dev/null
      launch "-eager"
    fi
    running || break
    # past compiling: most of the first wave has logged its first 30 steps
    local warm=0
    for m in "$W"/root*/*/runs/*/metrics.jsonl; do
      [ -f "$m" ] && [ "$(wc -l <"$m")" -ge 30 ] && warm=$((warm + 1))
    done
    if [ "$warm" -ge "$(( JOBS < 8 ? JOBS : 8 ))" ]; then say "$warm runs past step 30"; break; fi
  done
  progress
}

wait_for() {
  running || [ -f "$W/mode" ] || { WATCH_S=60 start; }
  local last=0
  while running && [ $(( $(date +%s) - T0 )) -lt $(( WAIT_S - 25 )) ]; do
    sleep 5
    if [ $(( $(date +%s) - last )) -ge 20 ]; then pack; last=$(date +%s); fi
  done
  progress; tail -5 "$W/logs/driver.log"
  local left=$(( WAIT_S - 25 - ($(date +%s) - T0) ))
  if ! running && [ "$left" -gt 60 ]; then
    say "study ended; the gpu tests with ${left}s left"
    timeout "$left" python3 -m pytest -m gpu tests/model/test_gpu.py -q -p no:cacheprovider >"$W/logs/gpu_tests.txt" 2>&1
    tail -15 "$W/logs/gpu_tests.txt"
  fi
  pack; ls -la "$OUT"
}

case "$MODE" in
  start) start; pack ;;
  wait) wait_for ;;
  *) echo "device_study.sh: MODE must be start or wait, not '$MODE'" >&2; exit 2 ;;
esac
