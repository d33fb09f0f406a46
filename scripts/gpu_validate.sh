#!/usr/bin/env bash
# One device call: GPU validation of the LBS family (see scripts/gpu_validate.py).
# Before the call, on the dev machine (once):  bash scripts/gpu_wheels.sh   (hydra/omegaconf/antlr wheels -> .whl/)
# Device call (as run on 2026-12-04):  command "DEADLINE_S=470 bash scripts/gpu_validate.sh", carry [".whl"],
#   timeout_s 530 (~330 s used; the script's own hard deadline is DEADLINE_S, default 500 s; its run folders go to WORK, outside OUT,
#    and OUT receives at most 8 flat files (a device call returns no more): log.txt, gpu_state.txt,
#    results.csv, summary.json, ceilings.json, outputs.tar.gz, runs.tar.gz, packed even when a run
#    fails or time runs out)
# CPU dry run of every code path:  TINY=1 OUT=/tmp/gv bash scripts/gpu_validate.sh
# Repeats (a second call, as run): SCRIPT=gpu_repeat DEADLINE_S=370 bash scripts/gpu_validate.sh --ceilings FILE --long
#   (timeout_s 410; ~300 s used). Its CPU dry run: SCRIPT=gpu_repeat TINY=1 OUT=/tmp/gr bash scripts/gpu_validate.sh
set -uo pipefail
OUT=$(realpath -m "${OUT:-/tmp/gpu_validate}")      # relative to where it was called, before the cd
[ -n "${WORK:-}" ] && WORK=$(realpath -m "$WORK")
cd "$(dirname "$0")/.."
mkdir -p "$OUT" 2>/dev/null && [ -w "$OUT" ] || { echo "error: OUT=$OUT cannot be made or written" >&2; exit 2; }
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -z "${PY:-}" ]; then
  PY=python3
  [ -x .venv/bin/python ] && PY=.venv/bin/python        # the dev machine's venv; the H200 image's python3 otherwise
fi
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
gpu_state() {   # read only: nothing about the GPU is changed
  echo "# GPU state $1 ($(date -u +%FT%TZ))"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,persistence_mode,compute_mode --format=csv 2>/dev/null
  nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,temperature.gpu --format=csv 2>/dev/null
  echo "# host: $(grep -m1 'model name' /proc/cpuinfo); $(nproc) CPUs; load $(cat /proc/loadavg)"
  grep '^cpu MHz' /proc/cpuinfo | awk '{print int($4)}' | sort -n | uniq -c | tr '\n' ' ' | sed 's/^/# cpu MHz (count mhz): /'; echo
  echo "# busiest processes:"; ps -eo pcpu,pid,comm --sort=-pcpu 2>/dev/null | head -4
}
gpu_state before > "$OUT/gpu_state.txt"
ARGS=(--out "$OUT" --deadline-s "${DEADLINE_S:-500}")
[ -n "${WORK:-}" ] && ARGS+=(--work "$WORK")              # else the script's own temporary folder, removed once packed
[ "${TINY:-0}" = 1 ] && ARGS+=(--tiny)
# SCRIPT=gpu_repeat: the repeats of a second call (scripts/gpu_repeat.py); extra arguments go to the script
$PY "scripts/${SCRIPT:-gpu_validate}.py" "${ARGS[@]}" "$@" 2>&1 | tee "$OUT/log.txt"
rc=${PIPESTATUS[0]}
gpu_state after >> "$OUT/gpu_state.txt"
exit $rc
