#!/usr/bin/env bash
# Wheels the H200 image lacks (Python 3.12 there): hydra-core, omegaconf, hydra-joblib-launcher (our
# hydra/launcher=local extends its joblib config: without it every composition fails), antlr4 4.9.3
# (sdist only: built here into a pure-Python wheel). Output: .whl/ (ignored through .git/info/exclude).
# Checked against the image's package list by a CPU dry run in a venv holding only those packages.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
mkdir -p .whl
PIP="python3 -m pip"
$PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .whl "hydra-core==1.3.2" "omegaconf==2.3.0" \
  "hydra-joblib-launcher==1.2.0"
$PIP wheel -q --no-deps -w .whl "antlr4-python3-runtime==4.9.3"
ls -la .whl
