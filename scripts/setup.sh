#!/usr/bin/env bash
# The README's set-up step: a .venv (Python 3.11) plus the standard install of npudist, nothing more.
#   bash scripts/setup.sh          torch==2.13.0, the build tools, then `pip install --no-build-isolation -e .`
#   bash scripts/setup.sh --test   also the test tools, the pinned test-only dependencies (requirements-test.txt) and
#                                  DeepSpeed's cpu_adam op for tests/ecosystem/test_deepspeed.py (built once per .venv)
# The editable install is what `pip install -e .` gives anyone (docs/install.md): both C++ extensions, the emulated
# CANN libraries, the pyACL .pth file, torch_npu's distribution metadata, the commands. It runs on every call and is
# incremental (ninja rebuilds only changed files). Progress: one "[setup]" line per step, pip's download/install
# lines, one line per compiled C++ file; the build's full output goes to build_ext.log.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "[setup] $*"; }
# pip's own progress lines, prefixed; everything else it prints (notices, warnings) is dropped.
show_pip() { sed -nu -E 's/^ *(Collecting|Processing|Downloading|Using cached|Installing collected|Successfully installed|ERROR)(.*)/[setup]   \1\2/p'; }
pip_install() { $VPY -m pip install --disable-pip-version-check "$@" 2>&1 | show_pip; }
with_tests=0
case "${1:-}" in
  --test) with_tests=1 ;;
  "") ;;
  *) echo "usage: scripts/setup.sh [--test]" >&2; exit 2 ;;
esac
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $PY"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python

# Dependencies: installed again only when what pins them changes (a stamp per kind).
stamp=.setup-stamp-main
want=$(cat pyproject.toml | sha1sum | cut -c1-12)
if [ "$(cat $stamp 2>/dev/null)" != "$want" ]; then
  # torch is pinned exactly: a looser pin pulls a multi-GB CUDA build. setuptools/wheel/pybind11/ninja: the build
  # requirements pyproject.toml declares (the install below uses this environment's, not an isolated copy).
  say "installing torch==2.13.0 and the build tools (pip; a first install downloads ~200 MB)"
  pip_install "torch==2.13.0" pyyaml numpy "setuptools>=64" wheel pybind11 ninja \
    || { say "FAILED: pip could not install torch and the build tools (its ERROR lines are above)"; exit 1; }
  $VPY -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 'torch 2.13.0 required')"
  echo "$want" > $stamp
fi
if [ $with_tests = 1 ]; then
  stamp=.setup-stamp-test
  want=$(cat requirements-test.txt | sha1sum | cut -c1-12)
  if [ "$(cat $stamp 2>/dev/null)" != "$want" ]; then
    # Not runtime dependencies of npudist. A failure stops the setup: the ecosystem tests would turn into skips.
    say "installing the test tools and test-only dependencies (requirements-test.txt)"
    # Lines marked "# no-deps" install without their declared dependencies (the file pins what they import).
    with_deps=$(mktemp); grep -v -E '#[[:space:]]*no-deps' requirements-test.txt > "$with_deps"
    nodeps=$(sed -n -E 's/^([^#[:space:]]+)[[:space:]]+#[[:space:]]*no-deps.*/\1/p' requirements-test.txt)
    { pip_install -r "$with_deps" \
        && { [ -z "$nodeps" ] || pip_install --no-deps $nodeps; }; } \
      || { say "FAILED: pip could not install requirements-test.txt (its ERROR lines are above)"; exit 1; }
    rm -f "$with_deps"
    echo "$want" > $stamp
  fi
fi

start=$(date +%s)
log="$PWD/build_ext.log"
jobs=${MAX_JOBS:-$(nproc)}
say "pip install --no-build-isolation -e . (the C++ extensions with ninja, $jobs jobs; a first build takes" \
    "3-5 min on 2 cores: files that include torch headers take ~20 s each). Full log: $log"
shown=0
show_compiled() {   # the [n/N] lines ninja wrote since the last call; returns 1 if there were none
  local done_now
  done_now=$(grep -acE '^ *\[[0-9]+/[0-9]+\] ' "$log" || true)
  [ "$done_now" -gt "$shown" ] || return 1
  grep -aE '^ *\[[0-9]+/[0-9]+\] ' "$log" | sed -n "$((shown + 1)),${done_now}p" \
    | sed -E "s#^ *\[([0-9]+/[0-9]+)\] .* -c ($PWD/)?([^ ]+) .*#[setup]   compiled [\1] \3#"
  shown=$done_now
}
# -v: pip passes the build's output through (ninja's [n/N] lines) into the log.
MAX_JOBS=$jobs $VPY -m pip install -v --disable-pip-version-check --no-build-isolation --no-deps -e . \
  >"$log" 2>&1 &
build=$!
quiet_since=$(date +%s)
while kill -0 $build 2>/dev/null; do
  sleep 2
  if show_compiled; then
    quiet_since=$(date +%s)
  elif [ $(( $(date +%s) - quiet_since )) -ge 30 ]; then
    say "  still building: $shown file(s) compiled, $(( $(date +%s) - start ))s so far"
    quiet_since=$(date +%s)
  fi
done
status=0
wait $build || status=$?
show_compiled || true
if [ $status -ne 0 ]; then
  tail -n 60 "$log"; echo "[setup] FAILED: the install of npudist failed (full log: $log)" >&2; exit 1
fi
sed -nu -E 's/^ *built (npudist|torch_npu)(.*)/[setup]   built \1\2/p' "$log"
say "npudist installed (editable) in $(( $(date +%s) - start ))s"
# Bytecode for the checkout's own modules, which an editable install leaves uncompiled: with
# PYTHONDONTWRITEBYTECODE set (as on this project's machines) every process otherwise compiled npudist from
# source at import, ~0.2 s of CPU per process (each test rank is one); Python reads these files either way.
$VPY -m compileall -q -j 0 npudist torch_npu $( [ $with_tests = 1 ] && echo tests benchmarks examples ) >/dev/null \
  || say "note: compileall failed; imports compile from source instead"
if [ $with_tests = 1 ]; then
  # DeepSpeed's cpu_adam op (tests/ecosystem/test_deepspeed.py), built by DeepSpeed's own NPU builder against the
  # installed npudist into this environment's extension cache (the test uses the same directory): the test loads
  # it instead of compiling it under the suite's load. ninja makes a later call a no-op until something changes.
  start=$(date +%s)
  say "DeepSpeed's cpu_adam op into .venv/torch_extensions (a first build takes ~2 min on 2 cores). Log: $PWD/build_deepspeed_op.log"
  TORCH_EXTENSIONS_DIR="$PWD/.venv/torch_extensions" $VPY -c "
import torch_npu  # noqa: F401  (DeepSpeed selects its npu accelerator when torch_npu imports)
from deepspeed.accelerator import get_accelerator
assert get_accelerator().device_name() == 'npu', get_accelerator().device_name()
get_accelerator().create_op_builder('CPUAdamBuilder').load()
" >build_deepspeed_op.log 2>&1 \
    || { tail -n 40 build_deepspeed_op.log; say "FAILED: DeepSpeed's cpu_adam op did not build (log: $PWD/build_deepspeed_op.log)"; exit 1; }
  say "cpu_adam ready in $(( $(date +%s) - start ))s"
fi
