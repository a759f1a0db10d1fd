#!/usr/bin/env bash
# Quick-start command 2: set everything up, then run the whole test suite (2 xdist workers).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -n 2 --dist loadgroup "$@" tests
