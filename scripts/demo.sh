#!/usr/bin/env bash
# Set up the environment and run the main job: the default RACE pilot grid on the tiny
# model family (building base models and reward models on first use), ending in a report.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup.sh
echo "[demo] setup: $(( $(date +%s) - start )) s"
exec .venv/bin/race demo "$@"
