#!/usr/bin/env bash
# Create .venv (Python 3.11), install torch==2.13.0 + deps, install npudist editable, and build the C++
# extensions in place (incremental: ninja rebuilds only changed files). Idempotent; safe to re-run.
# Progress: one "[setup]" line per step, pip's Collecting/Downloading/Installed lines, and one line per
# compiled C++ file (ninja's [n/N] counter); the full compiler output goes to build_ext.log.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "[setup] $*"; }
# pip's own progress lines, prefixed; everything else it prints (notices, warnings) is dropped.
show_pip() { sed -nu -E 's/^ *(Collecting|Processing|Downloading|Using cached|Installing collected|Successfully installed|ERROR)(.*)/[setup]   \1\2/p'; }
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $PY"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
stamp=.setup-stamp
want=$(cat pyproject.toml setup.py requirements-test.txt packaging/torch_npu/pyproject.toml | sha1sum | cut -c1-12)
if [ "$(cat $stamp 2>/dev/null)" != "$want" ]; then
  # torch is pinned exactly: a looser pin pulls a multi-GB CUDA build.
  say "installing torch==2.13.0 and the build/test tools (pip; a first install downloads ~200 MB)"
  $VPY -m pip install --disable-pip-version-check "torch==2.13.0" pyyaml numpy pybind11 ninja \
      pytest pytest-xdist pytest-timeout 2>&1 | show_pip \
    || { say "FAILED: pip could not install torch and the build/test tools (its ERROR lines are above)"; exit 1; }
  # Test-only dependencies (pinned; not runtime dependencies of npudist). A failure stops the setup: the
  # ecosystem tests would otherwise turn into skips.
  say "installing test-only dependencies (requirements-test.txt)"
  # Lines marked "# no-deps" install without their declared dependencies (the file pins what they import).
  with_deps=$(mktemp); grep -v -E '#[[:space:]]*no-deps' requirements-test.txt > "$with_deps"
  nodeps=$(sed -n -E 's/^([^#[:space:]]+)[[:space:]]+#[[:space:]]*no-deps.*/\1/p' requirements-test.txt)
  { $VPY -m pip install --disable-pip-version-check -r "$with_deps" \
      && { [ -z "$nodeps" ] || $VPY -m pip install --disable-pip-version-check --no-deps $nodeps; }; } 2>&1 | show_pip \
    || { say "FAILED: pip could not install requirements-test.txt (its ERROR lines are above)"; exit 1; }
  rm -f "$with_deps"
  $VPY -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 'torch 2.13.0 required')"
  # Package metadata + console scripts (npurun, npudist) without compiling; extensions are built below.
  say "installing npudist (editable; npurun and npudist commands)"
  NPUDIST_SKIP_EXT=1 $VPY -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e . \
      2>&1 | { grep -v '^WARNING: Location' || true; }
  # Distribution metadata for torch_npu (metadata only; the package ships in npudist): libraries such as
  # diffusers detect Ascend with importlib.metadata.version("torch_npu"). See docs/torch_npu.md.
  $VPY -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps ./packaging/torch_npu \
      2>&1 | { grep -v '^WARNING: Location' || true; }
  # The emulated CANN home's pyACL (`import acl`, e.g. Ray's NPU detection) importable before torch is: a path
  # entry, appended after PYTHONPATH, so a real toolkit's acl (set_env.sh puts it on PYTHONPATH) wins.
  $VPY -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
    | { read -r site; echo "$PWD/npudist/cann/home/python/site-packages" > "$site/npudist_cann_acl.pth"; }
  echo "$want" > $stamp
fi
start=$(date +%s)
log="$PWD/build_ext.log"
jobs=${MAX_JOBS:-$(nproc)}
say "building the C++ extensions (ninja, $jobs jobs; a first build takes 3-5 min on 2 cores: files that" \
    "include torch headers take ~20 s each). Full log: $log"
# ninja prints "[n/N] c++ ... -c <source> ..." as each file finishes; show "[n/N] <source>" only, and a
# heartbeat every 30 s without one (a file with torch headers compiles for a minute or more, longer under load).
shown=0
show_compiled() {   # the [n/N] lines ninja wrote since the last call; returns 1 if there were none
  local done_now
  done_now=$(grep -cE '^\[[0-9]+/[0-9]+\] ' "$log" || true)
  [ "$done_now" -gt "$shown" ] || return 1
  grep -E '^\[[0-9]+/[0-9]+\] ' "$log" | sed -n "$((shown + 1)),${done_now}p" \
    | sed -E "s#^\[([0-9]+/[0-9]+)\] .* -c ($PWD/)?([^ ]+) .*#[setup]   compiled [\1] \3#"
  shown=$done_now
}
MAX_JOBS=$jobs $VPY setup.py -q build_ext --inplace >"$log" 2>&1 &
build=$!
quiet_since=$(date +%s)
while kill -0 $build 2>/dev/null; do
  sleep 2
  if show_compiled; then
    quiet_since=$(date +%s)
  elif [ $(( $(date +%s) - quiet_since )) -ge 30 ]; then
    say "  still compiling: $shown file(s) done, $(( $(date +%s) - start ))s so far"
    quiet_since=$(date +%s)
  fi
done
status=0
wait $build || status=$?
show_compiled || true
if [ $status -ne 0 ]; then
  tail -n 60 "$log"; echo "C++ build failed (full log: $log)" >&2; exit 1
fi
say "extensions built in $(( $(date +%s) - start ))s"
# The emulated CANN home's libraries (plain C++, seconds; docs/cann.md).
say "building the emulated CANN libraries (npudist/cann/home/lib64/libascendcl.so, torch_npu/lib/libtorch_npu.so)"
$VPY -m npudist.cann.build | sed -u 's/^/[setup]   /'
