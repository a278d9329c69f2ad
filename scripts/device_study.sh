#!/usr/bin/env bash
# The issue-28 budget study (studies/small-scale/mix16.toml, mix1.toml, mix4.toml) on a lent GPU: many
# 10 M-parameter runs at once on one GPU, which a single run leaves mostly idle. Two calls of the device tool:
#
#   COMMIT=<sha> bash scripts/device_study.sh start   # launch it in its own session; watch the first steps
#   COMMIT=<sha> bash scripts/device_study.sh wait    # wait for it (starting it first on a fresh machine), pack
#
# Each group is `depthattn study run studies/small-scale/GROUP.toml --jobs JOBS --skip-published` (the parts not
# yet in results/small-scale; the study file's `publish` makes each part publish as it finishes), then
# `depthattn study publish` of the same file. The second call must come within the machine's warm time (30 s): a
# machine given back takes the running parts with it, and `wait` on a fresh one starts the study again from the
# parts published in results/small-scale.
# The study files train compiled (compile = true); a part that fails while `start` watches (a compiler problem on
# that machine) sends the whole study back to eager (compile = false in a copy of the study files), in a fresh
# folder. `wait` packs $OUT/study.tar.gz every 20 s and at the end: the groups' published parts (pub/PART.json)
# and logs/ (each part's PART.log and PART.jsonl, the driver's log, the machine). Unpack it here with
# `tar -xzf study.tar.gz -C /tmp/x`, copy /tmp/x/pub/* to results/small-scale, then
# `depthattn study report --published results/small-scale`. The prepared mix travels as runs/study/data-mix (carry
# it). If the study ends with time to spare, the `gpu`-marked tests run (logs/gpu_tests.txt).
#
# Settings (environment): COMMIT (the code's commit: the copy has no git history), JOBS (parts at once, default 16),
# WATCH_S (seconds `start` watches, default 120), WAIT_S (seconds `wait` may take in all, default 560), DATA (the
# prepared mix, default runs/study/data-mix), STUDY_GROUPS (the study files of studies/small-scale to run, in order;
# default "mix16 mix1 mix4").
set -uo pipefail
MODE=${1:-wait}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=${W:-/tmp/device-study}; mkdir -p "$W/logs" "$W/pub"
export JOBS=${JOBS:-16} STUDY_GROUPS=${STUDY_GROUPS:-mix16 mix1 mix4}
WATCH_S=${WATCH_S:-120}; WAIT_S=${WAIT_S:-560}; DATA=${DATA:-runs/study/data-mix}
export COMMIT=${COMMIT:-$(git rev-parse --short=8 HEAD 2>/dev/null || echo unknown)}
T0=$(date +%s)

say() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

pack() {
  local f g r
  for f in "$W"/work*/runs/study/*/logs/*; do  # named by work folder too: an eager fallback's must not overwrite
    [ -f "$f" ] || continue; r=$(basename "${f%%/runs/study/*}")
    cp "$f" "$W/logs/$r-$(basename "$f")"
  done
  for g in $STUDY_GROUPS; do  # the groups' published parts (the copies of results/small-scale included: unchanged)
    for f in "$W"/work*/results/small-scale/"$g"-*.json; do [ -f "$f" ] && cp "$f" "$W/pub/"; done
  done
  # tar exits 1 when a file (the driver's log) grew while it was read: the archive is still whole
  (cd "$W" && tar -czf "$OUT/.study.tmp" logs pub; [ $? -le 1 ]) && mv -f "$OUT/.study.tmp" "$OUT/study.tar.gz"
}

finished() {  # how many of the groups' parts are published in the work folders
  local g
  for g in $STUDY_GROUPS; do ls "$W"/work*/results/small-scale/"$g"-*.json 2>/dev/null; done \
    | xargs -rn1 basename | sort -u | wc -l
}

running() { [ -f "$W/driver.pid" ] && kill -0 "$(cat "$W/driver.pid")" 2>/dev/null; }

launch() {  # $1: work folder suffix ("" compiled, "-eager" eager)
  local work="$W/work$1"
  say "launching the study: groups $STUDY_GROUPS, --jobs $JOBS (in $work)"
  # The study runs from its own copy of the code, study files and data under $W: a later call re-sends the working
  # tree (and any carried data) over the repository while the parts are running.
  rm -rf "$work"; mkdir -p "$work/runs/study" "$work/results"
  cp -r "$W/code/src" "$W/code/studies" "$work/"; cp -r results/small-scale "$work/results/"
  ln -s "$W/data-mix" "$work/runs/study/data-mix"
  [ "$1" = "-eager" ] && sed -i 's/^compile = true/compile = false/' "$work"/studies/small-scale/*.toml
  cat >"$work/driver.sh" <<'EOF'
depthattn() { python3 -c "import sys; from depthattn.cli import main; sys.exit(main())" "$@"; }
rc=0
for g in $STUDY_GROUPS; do
  depthattn study run "studies/small-scale/$g.toml" --jobs "$JOBS" --skip-published --commit "$COMMIT" \
    --no-progress || rc=1
  depthattn study publish "studies/small-scale/$g.toml" || rc=1
done
exit $rc
EOF
  (cd "$work" && PYTHONPATH="$work/src" setsid bash driver.sh >>"$W/logs/driver.log" 2>&1 </dev/null &
   echo $! >"$W/driver.pid")
  echo "$1" >"$W/mode"
}

progress() {
  local m
  for m in "$W"/work*/runs/study/*/*/runs/*/metrics.jsonl; do
    [ -f "$m" ] && echo "  $(echo "$m" | sed "s|$W/||; s|/runs/[^/]*/metrics.jsonl||"): $(wc -l <"$m") rows"
  done | sort | head -40
  say "published parts: $(finished); GPU: $(nvidia-smi --query-gpu=utilization.gpu,memory.used \
    --format=csv,noheader 2>/dev/null)"
}

start() {
  if running; then say "the study is already running"; progress; return; fi
  rm -rf "$W/code"; mkdir -p "$W/code"; cp -r src studies "$W/code/"
  [ -f "$W/data-mix/meta.json" ] || cp -r "$DATA" "$W/data-mix"
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import torch, triton, transformers as t
print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', t.__version__)"
    lscpu | grep -E "Model name|^CPU\(s\)"; echo "commit $COMMIT"; } >"$W/logs/env.txt" 2>&1
  cat "$W/logs/env.txt"
  launch ""
  while [ $(( $(date +%s) - T0 )) -lt "$WATCH_S" ]; do
    sleep 5
    if grep -q "failed (exit" "$W/logs/driver.log" && [ -z "$(cat "$W/mode")" ]; then
      say "a compiled part failed:"; grep -A6 "failed (exit" "$W/logs/driver.log" | head -20
      kill -TERM -- "-$(cat "$W/driver.pid")" 2>/dev/null; sleep 3; kill -KILL -- "-$(cat "$W/driver.pid")" 2>/dev/null
      launch "-eager"
    fi
    running || break
    # past compiling: most of the first wave has logged its first 30 steps
    local warm=0
    for m in "$W"/work*/runs/study/*/*/runs/*/metrics.jsonl; do
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
    PYTHONPATH=$PWD/src timeout "$left" python3 -m pytest -m gpu tests/model/test_gpu.py -q -p no:cacheprovider \
      >"$W/logs/gpu_tests.txt" 2>&1
    tail -15 "$W/logs/gpu_tests.txt"
  fi
  pack; ls -la "$OUT"
}

case "$MODE" in
  start) start; pack ;;
  wait) wait_for ;;
  *) echo "device_study.sh: MODE must be start or wait, not '$MODE'" >&2; exit 2 ;;
esac
