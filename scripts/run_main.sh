#!/usr/bin/env bash
# Quick-start command 1: set everything up, then run the main job -- a Llama-style model trained on
# 4 emulated NPUs over the hccl backend with a 2D (FSDP x TP) plan. Extra arguments go to train.py
# (e.g. --training.steps 50).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "[run_main] npurun --nproc 4 examples/train.py --config examples/plans/fsdp_tp.yaml $*"
echo "[run_main] starting 4 ranks (each imports torch and npudist first: ~10-20 s before the first log line)"
exec .venv/bin/npurun --nproc 4 examples/train.py --config examples/plans/fsdp_tp.yaml "$@"
