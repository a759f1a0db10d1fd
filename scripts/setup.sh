#!/usr/bin/env bash
# Create .venv (Python 3.11), install torch==2.13.0 + deps, install npudist editable, and build the C++
# extensions in place (incremental: ninja rebuilds only changed files). Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
stamp=.setup-stamp
want=$(cat pyproject.toml setup.py requirements-test.txt packaging/torch_npu/pyproject.toml | sha1sum | cut -c1-12)
if [ "$(cat $stamp 2>/dev/null)" != "$want" ]; then
  # torch is pinned exactly: a looser pin pulls a multi-GB CUDA build.
  $VPY -m pip install -q --disable-pip-version-check "torch==2.13.0" pyyaml numpy pybind11 ninja \
      pytest pytest-xdist pytest-timeout 2>&1 | grep -v '^WARNING: Location' || true
  # Test-only dependencies (pinned; not runtime dependencies of npudist).
  $VPY -m pip install -q --disable-pip-version-check -r requirements-test.txt 2>&1 | grep -v '^WARNING: Location' || true
  $VPY -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 'torch 2.13.0 required')"
  # Package metadata + console scripts (npurun, npudist) without compiling; extensions are built below.
  NPUDIST_SKIP_EXT=1 $VPY -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e . \
      2>&1 | grep -v '^WARNING: Location' || true
  # Distribution metadata for torch_npu (metadata only; the package ships in npudist): libraries such as
  # diffusers detect Ascend with importlib.metadata.version("torch_npu"). See docs/torch_npu.md.
  $VPY -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps ./packaging/torch_npu \
      2>&1 | grep -v '^WARNING: Location' || true
  echo "$want" > $stamp
fi
start=$(date +%s)
MAX_JOBS=${MAX_JOBS:-$(nproc)} $VPY setup.py -q build_ext --inplace >build_ext.log 2>&1 || {
  tail -n 60 build_ext.log; echo "C++ build failed (full log: build_ext.log)" >&2; exit 1; }
echo "[setup] extensions built in $(( $(date +%s) - start ))s"
